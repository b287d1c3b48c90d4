"""A compile_and_fit job with step backups, for the Ray fault-tolerance tests (no Ray code in the training).

One worker dies mid-epoch, once; Ray restarts the worker group and the job resumes from tfaccel's backup.
Environment:
  JOB_OUT          directory for weights-<rank>.npz (final weights); required
  JOB_EPOCHS (2), JOB_BACKUP_FREQ (5), JOB_BATCH (64)
  JOB_BACKUP_DIR   compile_and_fit's backup_dir; default: tfaccel.launch.ray.ray_backup_dir() (in Ray's run storage)
  JOB_KILL_AT      "rank:epoch:step" (e.g. "1:1:7"): that worker dies right after that step, once (the marker file
                   JOB_KILL_MARKER records it, so the restarted group runs through)
  JOB_KILL_WHAT    "command" (default): the command SIGKILLs itself, as a crashed training process;
                   "ray_worker": it SIGKILLs its parent, Ray's own worker process (Ray Train's worker-died path; the
                   command then dies with it, by tfaccel's parent-death signal)
Prints one JSON line: {"task", "strategy", "replicas", "resumed_from", "steps", "restart", "backup_dir", "loss"}.
"""

import json
import os
import signal
import sys
from pathlib import Path

import numpy as np

import tfaccel
from tfaccel.datasets import load_dataset
from tfaccel.launch.ray import ray_backup_dir, ray_context

env = os.environ
rank = (ray_context() or {"rank": 0})["rank"]


def build():
    import keras

    return keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(32, activation="relu"),
                             keras.layers.Dense(10, activation="softmax")])


def kill_callbacks():
    import keras

    if not env.get("JOB_KILL_AT"):
        return []
    victim, epoch_at, step_at = (int(v) for v in env["JOB_KILL_AT"].split(":"))
    marker = Path(env["JOB_KILL_MARKER"])
    what = env.get("JOB_KILL_WHAT", "command")

    class Kill(keras.callbacks.Callback):
        epoch = 0

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if rank == victim and self.epoch == epoch_at and batch + 1 >= step_at and not marker.exists():
                marker.write_text(f"{self.epoch}:{batch + 1}\n")
                target = os.getppid() if what == "ray_worker" else os.getpid()
                print(f"JOB: worker:{rank} SIGKILLs {what} (pid {target}) after epoch {self.epoch} step {batch + 1}",
                      flush=True)
                os.kill(target, signal.SIGKILL)
                if target != os.getpid():
                    signal.pause()  # the parent-death signal ends this process

    return [Kill()]


backup_dir = env.get("JOB_BACKUP_DIR") or ray_backup_dir()
if not backup_dir:
    sys.exit("resume_job.py: no JOB_BACKUP_DIR and not run by tfaccel launch --backend ray with local storage")
x, y = load_dataset("digits", split="train")
result = tfaccel.compile_and_fit(
    build, (x, y), epochs=int(env.get("JOB_EPOCHS", "2")), global_batch_size=int(env.get("JOB_BATCH", "64")),
    loss="sparse_categorical_crossentropy", learning_rate=0.003, backup_dir=backup_dir,
    backup_freq=int(env.get("JOB_BACKUP_FREQ", "5")), seed=1, verbose=0, steps_per_execution=1,
    callbacks=kill_callbacks())
np.savez(Path(env["JOB_OUT"]) / f"weights-{rank}.npz", *result.model.get_weights())
print(json.dumps({"task": f"worker:{rank}", "strategy": result.plan.strategy, "replicas": result.plan.num_replicas,
                  "resumed_from": result.resumed_from, "steps": result.steps,
                  "restart": env.get("TFACCEL_RESTART_COUNT"), "backup_dir": backup_dir,
                  "loss": result.history.get("loss", [])}), flush=True)
