"""Child program for the multi-process strategy tests: a tiny model.fit under tfaccel.get_strategy.

Prints one JSON line: {"ok": true, "strategy": ..., "loss": [...], "weights_sha": ..., "replicas": ...} or
{"ok": false, "type": ..., "message": ...} (exit code 3). Options through argv: --strategy NAME, --jit.
"""

import argparse
import hashlib
import json
import os
import sys

import numpy as np


def _variable_metric(keras: object) -> object:
    """Counts the predictions below their target; result() returns the state variable itself."""

    class Below(keras.metrics.Metric):
        def __init__(self) -> None:
            super().__init__(name="below")
            self.count = self.add_variable(shape=(), name="count", initializer="zeros")

        def update_state(self, y_true: object, y_pred: object, sample_weight: object = None) -> None:
            self.count.assign_add(keras.ops.sum(keras.ops.cast(y_pred < y_true, "float32")))

        def result(self) -> object:
            return self.count

    return Below()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--jit", action="store_true")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps-per-execution", type=int, default=1)
    parser.add_argument("--variable-metric", action="store_true",
                        help="a metric whose result() returns its state variable (keras-io's CategoricalTruePositives)")
    parser.add_argument("--only-build-fix", action="store_true", help="undo the reduce_per_replica half of the fix")
    args = parser.parse_args()

    from tfaccel.strategies import get_backend

    backend = get_backend(args.strategy)  # first thing: MWMS must exist before TensorFlow's runtime starts
    if args.only_build_fix:
        from keras.src.backend.tensorflow import trainer

        from tfaccel.compat import keras_mwms

        trainer.reduce_per_replica = keras_mwms._originals["reduce_per_replica"]
    import keras
    import tensorflow as tf

    strategy = backend.strategy
    global_batch = 16
    rng = np.random.default_rng(0)
    x = rng.normal(size=(128, 4)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype="float32")).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch, drop_remainder=True)
    keras.utils.set_random_seed(1234 + backend.worker_index)  # different initial weights: sync must fix them
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
        metrics = ["mae"] + ([_variable_metric(keras)] if args.variable_metric else [])
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=metrics, jit_compile=args.jit,
                      steps_per_execution=args.steps_per_execution)
    threads = []  # this process's threads at each epoch's end: they must not grow with the steps

    class CountThreads(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            threads.append(len(os.listdir("/proc/self/task")))

    try:
        history = model.fit(data, epochs=args.epochs, verbose=0, callbacks=[CountThreads()])
    except Exception as exc:  # noqa: BLE001 - the test asserts on the upstream message
        print(json.dumps({"ok": False, "type": type(exc).__name__, "message": str(exc)[:4000]}))
        return 3
    weights = np.concatenate([w.ravel() for w in model.get_weights()]).astype("float32")
    print(json.dumps({"ok": True, "strategy": backend.name, "reason": backend.reason,
                      "replicas": backend.num_replicas_in_sync, "worker_index": backend.worker_index,
                      "is_chief": backend.is_chief, "num_workers": backend.num_workers,
                      "loss": history.history["loss"], "mae": history.history["mae"],
                      "below": history.history.get("below"),
                      "weights_sha": hashlib.sha256(weights.tobytes()).hexdigest(),
                      "weights_sum": float(np.abs(weights).sum()),
                      "jit": bool(getattr(model, "jit_compile", False)), "threads": threads}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
