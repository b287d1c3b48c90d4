"""Optimizer-state sharding (ZeRO-1) measured: the bytes of optimizer state each replica's device holds and the
step time, sharded and unsharded, on one dense model under this process's mirrored strategy.

Run it in a process whose virtual CPUs (or GPUs) are the replicas (``scripts/zero_bench.py`` starts one per N).
"""

import os
import time
from typing import Any, Dict

import keras
import numpy as np

from tfaccel.compat.keras_zero import slot_bytes_per_device
from tfaccel.train.api import fit
from tfaccel.train.scope import scope

__all__ = ["zero_benchmark"]


def _model(width: int, depth: int, features: int) -> Any:
    keras.utils.set_random_seed(0)
    layers = [keras.Input((features,))] + [keras.layers.Dense(width, activation="relu") for _ in range(depth)]
    model = keras.Sequential(layers + [keras.layers.Dense(10)])
    model.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _one(sharded: bool, data: Any, *, width: int, depth: int, batch: int, epochs: int) -> Dict[str, Any]:
    x, y = data
    with scope(strategy="mirrored"):
        model = _model(width, depth, x.shape[1])
    result = fit(model, x, y, batch_size=batch, epochs=epochs, shuffle=False, verbose=0, seed=0,
                 shard_optimizer_state=sharded)
    held = slot_bytes_per_device(model.optimizer, model.distribute_strategy)
    return {"step_seconds": batch / result.examples_per_sec, "bytes_per_device": held,
            "final_loss": result.history["loss"][-1]}


def zero_benchmark(*, width: int = 512, depth: int = 4, features: int = 256, examples: int = 4096,
                   batch: int = 256, epochs: int = 3, rounds: int = 2) -> Dict[str, Any]:
    """Sharded and unsharded Adam on an MLP, alternating ``rounds`` times; the median step time of each.

    Returns:
        ``{"replicas", "parameters", "load_average", "unsharded": {...}, "sharded": {...}, "ratio"}``; each mode
        has its median ``step_seconds`` (epochs after the first), ``bytes_per_device`` and ``final_loss``.
    """
    rng = np.random.RandomState(0)
    data = (rng.randn(examples, features).astype("float32"), rng.randint(0, 10, examples))
    runs: Dict[str, list] = {"unsharded": [], "sharded": []}
    load = [os.getloadavg()[0]]
    for _ in range(rounds):
        for mode in ("unsharded", "sharded"):
            runs[mode].append(_one(mode == "sharded", data, width=width, depth=depth, batch=batch, epochs=epochs))
            load.append(os.getloadavg()[0])
    out: Dict[str, Any] = {"replicas": len(runs["sharded"][0]["bytes_per_device"]),
                           "parameters": features * width + (depth - 1) * width * width + width * 10 + depth * width
                           + 10, "load_average": [round(v, 2) for v in (min(load), max(load))],
                           "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    for mode, results in runs.items():
        out[mode] = {**results[-1], "step_seconds": float(np.median([r["step_seconds"] for r in results])),
                     "step_seconds_all": [round(r["step_seconds"], 5) for r in results]}
    out["ratio"] = out["sharded"]["step_seconds"] / out["unsharded"]["step_seconds"]
    return out
