"""Cost per call of the collectives ZeRO-1 over Horovod ranks could use (docs/guides/horovod.md): the gradients by
Horovod's reduce-scatter of a flat buffer laid out by owner (each owner's part padded to the largest), by an
all-to-all of that buffer summed by each receiver, or by one grouped all-reduce, the updated values by one
all-gather of a flat buffer or by a broadcast per variable from its owner. Run in Horovod ranks:
``tfaccel launch --backend horovod -np N -- python scripts/hvd_zero_collectives.py``;
rank 0 prints one JSON line (milliseconds per call, in a ``tf.function``)."""

import json
import time
from typing import Any, Callable, Dict, List

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from tfaccel.memory.shards import partition_by_bytes

MODELS = {"mlp_867": [(8, 32), (32,), (32, 16), (16,), (16, 3), (3,)],
          "mlp_1055242": [(512, 1024), (1024,), (1024, 512), (512,), (512, 10), (10,)]}


def _functions(owners: List[int], sizes: List[int], size: int, rank: int) -> Dict[str, Callable[[Any], Any]]:
    segments = [sum(n for n, o in zip(sizes, owners) if o == r) for r in range(size)]
    pad = max(segments)

    def flat(grads: Any, owner: int) -> Any:
        mine = [tf.reshape(g, [-1]) for g, o in zip(grads, owners) if o == owner]
        return tf.concat(mine, 0) if mine else tf.zeros([0])

    def by_owner(grads: Any) -> Any:  # each owner's gradients, padded to the largest owner's share, in rank order
        return tf.concat([tf.concat([flat(grads, r), tf.zeros([pad - segments[r]])], 0) for r in range(size)], 0)

    return {  # named: the ranks' graphs differ (each gathers its own variables)
        "reducescatter_flat": tf.function(lambda g: hvd.reducescatter(by_owner(g), op=hvd.Average, name="zrs")),
        "alltoall_flat": tf.function(lambda g: tf.reduce_sum(tf.reshape(
            hvd.alltoall(by_owner(g), name="zaa", ignore_name_scope=True), [size, pad]), 0) / size),
        "grouped_allreduce": tf.function(lambda g: hvd.grouped_allreduce(list(g), op=hvd.Average, name="zar")),
        "allgather_flat": tf.function(lambda g: hvd.allgather(flat(g, rank), name="zag")),
        "broadcast_per_variable": tf.function(lambda g: [hvd.broadcast(t, root_rank=o, name=f"zbc{i}")
                                                         for i, (t, o) in enumerate(zip(g, owners))]),
    }


def main() -> None:
    hvd.init()
    size, rank = hvd.size(), hvd.rank()
    results = {}
    for label, shapes in MODELS.items():
        grads = [tf.random.normal(s) for s in shapes]
        sizes = [int(np.prod(s)) for s in shapes]
        owners = partition_by_bytes([4 * n for n in sizes], size)
        timings = {}
        for name, fn in _functions(owners, sizes, size, rank).items():
            for _ in range(5):  # trace and warm up
                fn(grads)
            steps = 50 if sum(sizes) < 10_000 else 20
            start = time.perf_counter()
            for _ in range(steps):
                fn(grads)
            timings[name] = round((time.perf_counter() - start) / steps * 1e3, 2)
        results[label] = timings
    if rank == 0:
        print(json.dumps({"ranks": size, "ms_per_call": results}))


if __name__ == "__main__":
    main()
