"""The job of the kills-during-saves tally (issue 24): one process, a backup after every step. Prints JSON lines.

Environment: KILLS_BACKUP_DIR (required), KILLS_WEIGHTS_OUT (npz of the final weights), KILLS_EPOCHS (3).
Prints ``{"event": "train_begin"}`` when training starts (the parent times its SIGKILL from there) and
``{"event": "done", "resumed_from": ..., "steps": ..., "backup_writer": ...}`` at the end (backups are written in a
background thread unless TFACCEL_ASYNC_BACKUP=0, so most kills land while one is being written).
"""

import json
import os

import keras
import numpy as np

import tfaccel

env = os.environ
rng = np.random.default_rng(0)
x = rng.normal(size=(320, 16)).astype("float32")
y = (x[:, :3].sum(axis=1) > 0).astype("int32")


class Announce(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        print(json.dumps({"event": "train_begin"}), flush=True)


keras.utils.set_random_seed(3)
with tfaccel.scope(strategy="default"):
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy")
result = tfaccel.fit(model, x, y, batch_size=32, epochs=int(env.get("KILLS_EPOCHS", "3")), verbose=0, seed=1,
                     backup_dir=env["KILLS_BACKUP_DIR"], backup_freq=1, callbacks=[Announce()],
                     steps_per_execution=1)
if env.get("KILLS_WEIGHTS_OUT"):
    np.savez(env["KILLS_WEIGHTS_OUT"], *result.model.get_weights())
print(json.dumps({"event": "done", "resumed_from": result.resumed_from, "steps": result.steps,
                  "backups_written": result.details.get("backups_written"),
                  "backup_writer": result.details.get("backup_writer")}), flush=True)
