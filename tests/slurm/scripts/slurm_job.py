"""A tiny tfaccel training script for the real-SLURM tests, written the way a user writes one: no cluster code,
strategy "auto". Each task prints one JSON line (its SLURM rank, the plan, resumed position, a weight digest) and
saves its final weights to ``$JOB_OUT/weights-<SLURM_PROCID>.npz``. ``JOB_BACKUP`` is the backup directory (resume
after a preemption), ``JOB_SLEEP`` seconds are slept after every step (time for a signal to arrive mid-training; a per-batch
callback, so not under parameter-server training). Under
parameter-server training only the chief runs it (the launcher runs servers for the ps and workers)."""

import json
import os
import time

import keras
import numpy as np

import tfaccel


class Steps(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        print("JOB: training", flush=True)

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(float(os.environ.get("JOB_SLEEP", "0")))


rng = np.random.default_rng(0)
x = rng.normal(size=(256, 8)).astype("float32")
y = (x.sum(1) > 0).astype("int32")
keras.utils.set_random_seed(1)
with tfaccel.scope() as plan:  # strategy "auto": the cluster comes from the environment (SLURM, or TF_CONFIG)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
result = tfaccel.fit(model, x, y, batch_size=32, epochs=int(os.environ.get("JOB_EPOCHS", "2")), seed=1, verbose=0,
                     backup_dir=os.environ.get("JOB_BACKUP") or None, callbacks=[Steps()] if os.environ.get("JOB_SLEEP") else [])
rank = os.environ.get("SLURM_PROCID", "?")
weights = model.get_weights()
np.savez(os.path.join(os.environ["JOB_OUT"], f"weights-{rank}.npz"), *weights)
print("JOB " + json.dumps({"rank": rank, "strategy": plan.strategy, "reason": plan.strategy_reason,
                           "replicas": plan.num_replicas, "task": plan.task, "resumed_from": result.resumed_from,
                           "loss": [round(v, 6) for v in result.history["loss"]],
                           "digest": float(sum(np.abs(w).sum() for w in weights))}), flush=True)
