"""The ZeRO row of ``tfaccel bench --suite real --real-zero``: optimizer-state sharding (ZeRO-1) against the
unsharded state on the real models, in one process per replica count (mirrored virtual CPUs) or one launch of
worker processes (multi_worker, one replica each) or of Horovod ranks (one replica each).

In each process, for each model, unsharded and sharded ``tfaccel.fit`` alternate ``rounds`` times (the same initial
weights, data and order), so the step-time ratio sharded / unsharded is measured side by side on the same load. Per
run: the steady step time (median epoch after the first, over its steps), the optimizer bytes each of this
process's replicas holds, and the real allocator's peak of this process during the run (TensorFlow's BFC allocator,
``tf.config.experimental.get_memory_info``, which needs ``TF_CPU_ALLOCATOR_USE_BFC=true`` before TensorFlow starts
on a CPU; virtual CPUs of one process share one allocator, so the per-replica peak is read per worker process under
multi_worker and per rank under Horovod). Beside them: ``tfaccel memory``'s prediction of each replica's optimizer
bytes, and the bytes each replica sends per step (:func:`tfaccel.bench.zero_traffic.bytes_per_step`).

    python -m tfaccel.bench.real_zero MODEL[,MODEL] SIZE ROUNDS [REPLICAS | horovod]

REPLICAS: virtual CPUs of a mirrored run; ``horovod``: the process is one Horovod rank, and rank 0 prints every
rank's result (``{"ranks": [...]}``); without either it is one worker of a multi_worker job (TF_CONFIG). The last
line printed is the JSON result.
"""

import gc
import json
import os
import sys
import time
from typing import Any, Dict, List

import keras
import numpy as np
import tensorflow as tf

import tfaccel
from tfaccel.bench.zero_traffic import bytes_per_step
from tfaccel.compat.keras_zero import slot_bytes_per_device
from tfaccel.memory import estimate_memory
from tfaccel.real_suite import get_real_model
from tfaccel.strategies.horovod import import_horovod

__all__ = ["zero_run", "zero_rows", "main"]

SEED = 1234


def _allocator(device: str) -> Dict[str, int]:
    try:
        return dict(tf.config.experimental.get_memory_info(device))
    except ValueError:  # "Allocator stats not available": TF_CPU_ALLOCATOR_USE_BFC was not set
        return {}


def zero_run(name: str, size: str, *, sharded: bool, strategy: str) -> Dict[str, Any]:
    """One ``tfaccel.fit`` of a real model's job, sharded or not; its step time and memory (see the module doc)."""
    spec, job = get_real_model(name), get_real_model(name).job(size)
    x, y = spec.data(size, seed=SEED)
    gc.collect()
    device = tf.config.list_logical_devices("CPU")[0].name
    before = _allocator(device)
    if before:
        tf.config.experimental.reset_memory_stats(device)
    keras.utils.set_random_seed(SEED)
    with tfaccel.scope(strategy=strategy):
        model = spec.build(size)
    result = tfaccel.fit(model, x, y, batch_size=job.batch_size, epochs=job.epochs, shuffle=False, verbose=0,
                         seed=SEED, shard_optimizer_state=sharded)
    after = _allocator(device)
    steady = job.batch_size / result.examples_per_sec  # epochs after the first (they trace and compile)
    held = slot_bytes_per_device(model.optimizer, model.distribute_strategy)
    out = {"step_seconds": steady, "optimizer_bytes_per_replica": held,
           "allocator_peak_bytes": (after["peak"] - before["current"]) if before else None,
           "final_loss": float(result.history["loss"][-1]), "note": result.details.get("optimizer_state")}
    del model, result
    return out


def _predicted(name: str, size: str, replicas: int, strategy: str) -> Dict[str, Any]:
    """``tfaccel memory``'s optimizer bytes per replica (or why it could not estimate) and the bytes per step."""
    spec, job = get_real_model(name), get_real_model(name).job(size)
    with tf.distribute.get_strategy().scope():  # outside the job's strategy: the estimate builds its own copy
        model = spec.build(size)
    out: Dict[str, Any] = {"bytes_per_step": {mode: bytes_per_step(model, replicas, sharded=mode == "sharded",
                                                                   path=strategy)
                                              for mode in ("unsharded", "sharded")}}
    try:  # a Horovod rank holds what a multi_worker worker holds
        estimate = estimate_memory(model, batch_size=job.batch_size, replicas=replicas,
                                   strategy="multi_worker" if strategy == "horovod" else strategy,
                                   optimizer=model.optimizer, recompute=False, shard_optimizer_state=True,
                                   input_shape=job.model_options.get("input_shape"))
    except Exception as error:  # noqa: BLE001 - the estimate's own limits (its traced step) are reported, not fatal
        out["estimate_error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
        return out
    out.update(sharded_optimizer_bytes=list(estimate.optimizer_shard_bytes),
               unsharded_optimizer_bytes=estimate.optimizer_bytes)
    return out


def zero_rows(names: List[str], size: str, rounds: int, strategy: str) -> Dict[str, Any]:
    """Every model: unsharded and sharded runs alternating ``rounds`` times in this process."""
    backend = tfaccel.get_backend(strategy)
    replicas = backend.num_replicas_in_sync  # Horovod: its ranks, each on the default strategy
    rows: Dict[str, Any] = {}
    for name in names:
        predicted = _predicted(name, size, replicas, strategy)  # before the runs: its model's memory is not in theirs
        runs: Dict[str, List[Dict[str, Any]]] = {"unsharded": [], "sharded": []}
        load = [os.getloadavg()[0]]
        for _ in range(rounds):
            for mode in ("unsharded", "sharded"):
                runs[mode].append(zero_run(name, size, sharded=mode == "sharded", strategy=strategy))
                load.append(os.getloadavg()[0])
        ratios = [s["step_seconds"] / u["step_seconds"] for u, s in zip(runs["unsharded"], runs["sharded"])]
        rows[name] = {"runs": runs, "ratio": float(np.median(ratios)), "ratios": [round(r, 3) for r in ratios],
                      "load_average": [round(min(load), 2), round(max(load), 2)],
                      "predicted": predicted}
    return {"replicas": replicas, "strategy": strategy, "size": size, "rows": rows,
            "rank": backend.worker_index,
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def main(argv: List[str]) -> int:
    """The module's command line (see the module doc)."""
    names, size, rounds = argv[0].split(","), argv[1], int(argv[2])
    where = argv[3] if len(argv) > 3 else "multi_worker"
    if where.isdigit():
        tfaccel.configure_devices(virtual_cpus=int(where))
        where = "mirrored"
    result = zero_rows(names, size, rounds, where)
    if where == "horovod":
        every = import_horovod().allgather_object(result)  # rank order
        if result["rank"] != 0:
            return 0
        result = {"ranks": every}
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
