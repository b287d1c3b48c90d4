"""Child program: the TF multi-worker tutorial's order under ``tfaccel launch --workers 2`` (issue 13, point 2).

The tutorial creates the strategy first, then the dataset, then trains; with tfaccel the training call asks for
``strategy="auto"`` again. Both requests must give the one MultiWorkerMirroredStrategy of the process (two of
them hung both workers in the first variable's initial-value broadcast in 2 of 5 runs).

``--route compile_and_fit`` (default): ``tfaccel.compile_and_fit(build, dataset, strategy="auto")``.
``--route scope_fit``: ``with tfaccel.scope(): build + compile`` then ``tfaccel.fit(model, dataset)``.

Prints one JSON line: {"ok": true, "route", "strategy", "replicas", "same_strategy", "loss", "weights_sha"}.
"""

import argparse
import hashlib
import json
import sys
from typing import Any, Dict, Tuple

import numpy as np

import tfaccel

GLOBAL_BATCH = 16
EXAMPLES = 128


def build() -> Any:
    """The tiny model (4 -> 8 -> 1)."""
    import keras

    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])


def train(route: str, dataset: Any, epochs: int) -> Tuple[Any, Dict[str, list]]:
    """Trains with the given route; returns (model, history dict)."""
    import keras

    if route == "compile_and_fit":
        result = tfaccel.compile_and_fit(build, dataset, strategy="auto", epochs=epochs, loss="mse",
                                         steps_per_epoch=EXAMPLES // GLOBAL_BATCH,  # the tutorial gives it too
                                         optimizer="sgd", learning_rate=0.05, scale_learning_rate="none",
                                         seed=7, verbose=0)
        return result.model, result.history
    with tfaccel.scope():
        model = build()
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model, tfaccel.fit(model, dataset, epochs=epochs, verbose=0).history


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--route", choices=("compile_and_fit", "scope_fit"), default="compile_and_fit")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()

    strategy = tfaccel.get_strategy("multi_worker")  # the tutorial: the strategy first thing in the process
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.normal(size=(EXAMPLES, 4)).astype("float32")
    y = x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype="float32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)  # the tutorial: data, then the model
    model, history = train(args.route, dataset, args.epochs)
    weights = np.concatenate([w.ravel() for w in model.get_weights()]).astype("float32")
    print(json.dumps({"ok": True, "route": args.route, "strategy": type(strategy).__name__,
                      "replicas": strategy.num_replicas_in_sync,
                      "same_strategy": tfaccel.get_strategy("auto") is strategy, "loss": history["loss"],
                      "weights_sha": hashlib.sha256(weights.tobytes()).hexdigest()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
