"""A Keras script that forgot `with tfaccel.scope():` (the commonest mistake), run by every worker of a launch."""

import keras
import numpy as np

import tfaccel

x = np.zeros((8, 2), "float32")
model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
tfaccel.fit(model, x, x[:, :1], batch_size=4, epochs=1, verbose=0)
