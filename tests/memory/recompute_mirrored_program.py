"""Trains the same small residual net under MirroredStrategy (2 virtual CPUs) with and without recompute.

Prints one JSON line: the largest weight difference and the block names. Run as its own process (one strategy
per process).
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> None:
    import numpy as np
    import tensorflow as tf

    import keras
    from keras import layers

    import tfaccel
    from tfaccel.memory import enable_recompute

    tfaccel.configure_devices(virtual_cpus=2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])

    def build() -> keras.Model:
        keras.utils.set_random_seed(1)
        inputs = keras.Input((8,))
        x = layers.Dense(16, name="stem")(inputs)
        for b in (1, 2):
            y = layers.Dense(16, activation="relu", name=f"block{b}_d1")(x)
            y = layers.BatchNormalization(name=f"block{b}_bn")(y)
            x = layers.Add(name=f"block{b}_add")([x, layers.Dense(16, name=f"block{b}_d2")(y)])
        return keras.Model(inputs, layers.Dense(3, activation="softmax", name="head")(x))

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 8)).astype("float32"), rng.integers(0, 3, 64)
    weights, blocks = [], []
    for recompute in (False, True):
        with strategy.scope():
            model = build()
            if recompute:
                blocks = enable_recompute(model)
            model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="sparse_categorical_crossentropy")
        model.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False)
        weights.append([v.numpy() for v in model.variables])
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(*weights))
    sys.stdout.write(json.dumps({"max_diff": diff, "blocks": blocks, "replicas": strategy.num_replicas_in_sync})
                     + "\n")


if __name__ == "__main__":
    main()
