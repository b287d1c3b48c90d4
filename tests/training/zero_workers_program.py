"""Differential check of shard_optimizer_state=True under multi_worker (one CPU per worker process, started by the
test's harness with TF_CONFIG on loopback): for each optimizer case, plain ``model.fit`` on one device in this
process against tfaccel.fit sharded over the workers, same initial weights. Prints one JSON line."""

import json

import numpy as np

from tfaccel.strategies import get_backend

get_backend("multi_worker")  # first: the collective strategy must exist before TensorFlow's runtime starts

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfaccel  # noqa: E402


def _model(scope, optimizer, weights=None):
    keras.utils.set_random_seed(1)
    with scope:
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)])
        model.compile(optimizer(), "mse")
    if weights is not None:
        model.set_weights(weights)
    return model


CASES = {
    "adam_schedule": lambda: keras.optimizers.Adam(keras.optimizers.schedules.ExponentialDecay(0.01, 3, 0.9)),
    "adamw": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1),
    "sgd_nesterov_clipnorm": lambda: keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True, clipnorm=0.5),
    "rmsprop_global_clipnorm": lambda: keras.optimizers.RMSprop(0.01, global_clipnorm=0.3),
}


def main() -> None:
    rng = np.random.RandomState(0)
    x = rng.randn(256, 8).astype("float32")
    y = (x @ rng.randn(8, 3)).astype("float32")
    out = {}
    for name, optimizer in CASES.items():
        plain = _model(tf.distribute.get_strategy().scope(), optimizer)
        initial = plain.get_weights()
        ref = plain.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0).history
        model = _model(tfaccel.scope(strategy="multi_worker"), optimizer, initial)
        result = tfaccel.fit(model, x, y, batch_size=32, epochs=2, shuffle=False, verbose=0, seed=0,
                             shard_optimizer_state=True)
        out[name] = {"plain_history": ref, "history": result.history,
                     "plain_weights": [w.tolist() for w in plain.get_weights()],
                     "weights": [w.tolist() for w in model.get_weights()],
                     "bytes": sum(result.details["optimizer_state_bytes"].values()),
                     "full_bytes": sum(int(np.prod(v.shape)) * 4 for v in plain.optimizer.variables)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
