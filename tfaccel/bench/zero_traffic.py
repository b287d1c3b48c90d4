"""Bytes each replica sends per training step, unsharded against optimizer-state sharding (ZeRO-1), computed from the
model's trainable variables and the collective pattern each path runs (not counted on the wire).

For a gradient of ``b`` bytes over ``N`` replicas:

* unsharded (Keras' all-reduce; a ring all-reduce's bus traffic, as nccl-tests count it): ``2 (N-1) / N * b``;
* sharded on one host's mirrored devices (the gradient reduced to its owner, the updated value copied to the
  ``N - 1`` others): ``2 (N-1) b`` in all, ``2 (N-1) / N * b`` per replica on average, as the all-reduce;
* sharded under multi_worker (``tfaccel.compat.keras_zero_collective``: an all-to-all of the gradient rows, each
  padded to the largest owner's share ``s``, then an all-gather of the updated shares): ``2 (N-1) s``, the bytes of
  one all-reduce when the owners' shares are equal (owners are whole variables, partitioned as the optimizer does);
* sharded under Horovod (``tfaccel.compat.keras_zero_ranks``: every gradient averaged by one grouped all-reduce, as
  unsharded, then the owners' updated values all-gathered, each rank sending ``(N-1) / N * b`` on average as
  nccl-tests count an all-gather): ``3 (N-1) / N * b``, 1.5 times the all-reduce: Horovod 0.28.1 has no
  reduce-scatter to the owners;
* the Embedding tables left unsharded move as they do unsharded, counted as dense (an upper bound: an
  ``IndexedSlices`` gradient all-gathers only the rows the batch touched); under multi_worker sharded they are
  counted inside the all-to-all and all-gather, split evenly over the owners' rows (their padding included), as
  the step moves a table's dense sum where ``keras_zero_collective.foldable`` lets it (a dense gradient, or slices
  under ``global_clipnorm``); elsewhere the strategy gathers the slices, at most about that many bytes.
  ``embedding`` is what the tables add to ``2 (N-1) s``.
"""

from typing import Any, Dict

import tensorflow as tf

from tfaccel.compat.keras_zero import sparse_gradient_variables
from tfaccel.compat.keras_zero_collective import even_pieces
from tfaccel.memory.shards import shard_loads

__all__ = ["bytes_per_step"]


def _nbytes(variable: Any) -> int:
    count = 1
    for dim in variable.shape:
        count *= int(dim)
    return count * tf.as_dtype(str(variable.dtype)).size


def bytes_per_step(model: Any, replicas: int, *, sharded: bool, path: str) -> Dict[str, int]:
    """``{"dense", "embedding", "total"}``: the bytes one replica sends per step (see the module doc).

    Args:
        model: a built Keras model.
        replicas: N.
        sharded: optimizer state sharded (ZeRO-1) or not.
        path: ``"mirrored"`` (one host's devices), ``"multi_worker"`` (one replica per worker process) or
            ``"horovod"`` (one replica per rank).
    """
    sparse = sparse_gradient_variables(model)
    sizes = [_nbytes(v) for v in model.trainable_variables if v.path not in sparse]
    tables = sum(_nbytes(v) for v in model.trainable_variables if v.path in sparse)
    factor = 2 * (replicas - 1) / replicas
    if sharded and path == "multi_worker":
        loads = shard_loads(sizes, replicas)
        dense_sent = 2 * (replicas - 1) * max(loads)
        for table in (v for v in model.trainable_variables if v.path in sparse):
            size = tf.as_dtype(str(table.dtype)).size
            loads = [load + piece * size for load, piece in zip(loads, even_pieces(_nbytes(table) // size, replicas))]
        return {"dense": dense_sent, "embedding": 2 * (replicas - 1) * max(loads) - dense_sent,
                "total": 2 * (replicas - 1) * max(loads)}
    if sharded and path == "horovod":
        dense_sent = int(sum(sizes) * factor * 1.5)
    else:
        dense_sent = int(sum(sizes) * factor)
    table_sent = int(tables * factor)
    return {"dense": dense_sent, "embedding": table_sent, "total": dense_sent + table_sent}
