"""A one-process job for tests/training/test_preemption.py: prints "JOB: training" when training begins, sleeps
JOB_SLEEP seconds after every step, backs up into JOB_BACKUP (if set), saves the final weights to JOB_OUT and prints
one JSON line (resumed_from, steps, details["preemption"], details["restarts"]). With JOB_ATEXIT, an exit handler
writes that file."""

import atexit
import json
import os
import time

import keras
import numpy as np

import tfaccel

if os.environ.get("JOB_ATEXIT"):  # the user's exit handler: it must run when the job ends preempted too
    atexit.register(lambda: open(os.environ["JOB_ATEXIT"], "w").write("ran"))


class Announce(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        print("JOB: training", flush=True)

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(float(os.environ.get("JOB_SLEEP", "0")))


def build():
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dense(2, activation="softmax")])


rng = np.random.default_rng(0)
x = rng.normal(size=(640, 8)).astype("float32")
y = (x.sum(1) > 0).astype("int32")
result = tfaccel.compile_and_fit(build, (x, y), epochs=3, global_batch_size=32, loss="sparse_categorical_crossentropy",
                                 backup_dir=os.environ.get("JOB_BACKUP") or None, seed=1, verbose=0,
                                 callbacks=[Announce()], steps_per_execution=1)
np.savez(os.environ["JOB_OUT"], *result.model.get_weights())
print(json.dumps({"resumed_from": result.resumed_from, "steps": result.steps,
                  "preemption": result.details.get("preemption"), "restarts": result.details.get("restarts")}),
      flush=True)
