"""A correct script (plus planted causes chosen by argv[1]) for tfaccel doctor's CLI tests."""
import sys

import keras
import numpy as np

plant = sys.argv[1] if len(sys.argv) > 1 else "none"
if plant == "crash":
    raise RuntimeError("planted crash")
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)
layers = [keras.Input((4,)), keras.layers.Dense(8, activation="relu")]
if plant == "dropout":
    layers.append(keras.layers.Dropout(0.3))
model = keras.Sequential(layers + [keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
if plant != "nofit":
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
