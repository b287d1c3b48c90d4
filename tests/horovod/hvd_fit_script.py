"""A training script that uses tfaccel.compile_and_fit, for tests/horovod (not collected by pytest).

Run it under horovodrun (``tfaccel launch --backend horovod -np 2 -- python hvd_fit_script.py --out D``):
strategy "auto" picks Horovod from horovodrun's environment. Run it alone for the single-process reference.
Every rank builds its model from a different seed on purpose (100 + rank); it writes ``fit<R>.npz`` /
``fit<R>.json`` into ``--out`` (R = rank, or "single" outside horovodrun).
"""

import argparse
import json
import os
from pathlib import Path

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--global-batch", type=int, default=32)
    args = parser.parse_args()

    import keras

    from tfaccel.train.api import compile_and_fit

    rank = os.environ.get("HOROVOD_RANK")
    tag = rank if rank is not None else "single"

    def build() -> keras.Model:
        keras.utils.set_random_seed(100 + int(rank or 0))  # different initial weights on every rank
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])

    data = np.random.RandomState(0)
    x = data.normal(size=(256, 4)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype="float32") + 0.1).astype("float32")
    result = compile_and_fit(build, (x, y), epochs=args.epochs, global_batch_size=args.global_batch,
                                     optimizer="sgd", learning_rate=0.05, scale_learning_rate="none", loss="mse",
                                     shuffle=False, seed=0, jit_compile=False)
    out = Path(args.out)
    np.savez(out / f"fit{tag}.npz", *result.model.get_weights())
    (out / f"fit{tag}.json").write_text(json.dumps({
        "strategy": result.plan.strategy, "replicas": result.plan.num_replicas, "loss": result.history["loss"],
        "global_batch": result.global_batch_size, "steps_per_epoch": result.steps_per_epoch, "pid": os.getpid()}))


if __name__ == "__main__":
    main()
