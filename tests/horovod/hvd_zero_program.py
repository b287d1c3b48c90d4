"""One Horovod rank of tests/horovod/test_horovod_zero.py (run through horovodrun; not collected by pytest).

For each optimizer case: rank 0 trains the model with plain ``model.fit`` on one process (the reference); then every
rank trains the same model from the same initial weights with ``tfaccel.fit(..., shard_optimizer_state=True)`` under
the ``horovod`` backend. Writes ``rank<R>.json`` into OUT: histories, weights, the bytes of optimizer variables this
rank holds, the plan's note, and the refusal of ``backup_dir`` by a real ``tfaccel.fit``.
Usage: ``python hvd_zero_program.py OUT``.
"""

import json
import os
import sys

import keras
import numpy as np

import tfaccel
from tfaccel.errors import ConfigError


def _cases():
    def schedule():
        return keras.optimizers.schedules.ExponentialDecay(0.01, decay_steps=3, decay_rate=0.9)

    return {
        "adam_schedule": lambda: keras.optimizers.Adam(schedule()),
        "adamw": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1),
        "sgd_nesterov_clipnorm": lambda: keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True, clipnorm=0.5),
        "rmsprop_global_clipnorm": lambda: keras.optimizers.RMSprop(0.01, global_clipnorm=0.3),
    }


def _model(optimizer, weights=None):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)])
    model.compile(optimizer(), "mse", metrics=["mae"])
    if weights is not None:
        model.set_weights(weights)
    return model


def _held_bytes(optimizer) -> int:
    return int(sum(np.prod(v.shape) * np.dtype(v.dtype).itemsize for v in optimizer.variables))


def main() -> None:
    out_dir, rank = sys.argv[1], int(os.environ["HOROVOD_RANK"])
    rng = np.random.RandomState(0)
    x = rng.randn(256, 8).astype("float32")
    y = (x @ rng.randn(8, 3)).astype("float32")
    out = {"pid": os.getpid()}
    for name, optimizer in _cases().items():
        plain = _model(optimizer)
        initial = plain.get_weights()
        case = {}
        if rank == 0:
            case["plain_history"] = plain.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0).history
            case["plain_weights"] = [w.tolist() for w in plain.get_weights()]
        with tfaccel.scope(strategy="horovod"):
            model = _model(optimizer, initial)
        result = tfaccel.fit(model, x, y, batch_size=32, epochs=2, shuffle=False, verbose=0,
                             shard_optimizer_state=True)
        case.update(history=result.history, weights=[w.tolist() for w in model.get_weights()],
                    held=_held_bytes(model.optimizer), details_bytes=result.details.get("optimizer_state_bytes"),
                    note=result.details.get("optimizer_state"), plan_notes=list(result.plan.notes),
                    slot_sizes=[int(np.prod(v.shape)) * 4 for v in model.trainable_variables],
                    iterations=int(model.optimizer.iterations.numpy()), strategy=result.plan.strategy)
        out[name] = case
    with tfaccel.scope(strategy="horovod"):
        model = _model(_cases()["adam_schedule"])
    try:  # refused before training, on every rank alike
        tfaccel.fit(model, x, y, batch_size=32, epochs=1, verbose=0, shard_optimizer_state=True,
                    backup_dir=os.path.join(out_dir, "backups"))
        out["backup_refusal"] = None
    except ConfigError as exc:
        out["backup_refusal"] = str(exc)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
