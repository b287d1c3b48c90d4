"""The compile_and_fit job of the reliability suite (issue 9). Prints one JSON line with what it did.

Configured by the environment so that tests and scripts/reliability.py share it:
  REL_EPOCHS (3), REL_BATCH (64), REL_BACKUP_DIR ({task} is filled in), REL_BACKUP_FREQ, REL_CHECKPOINT_DIR,
  REL_STRATEGY (auto),
  REL_KILL_AT  "task:epoch:step" (e.g. "worker:1:1:7"): that task SIGKILLs itself right after that step, once
               (guarded by the marker file REL_KILL_MARKER, so the restarted job runs through),
  REL_WEIGHTS_OUT  npz path for the final weights ({task} is filled in),
  REL_KERAS_BACKUP, REL_KERAS_CHECKPOINT, REL_KERAS_CSV  the user's own keras.callbacks.BackupAndRestore(dir),
               ModelCheckpoint(filepath, save_weights_only=True) and CSVLogger(filename, append=True), passed to
               compile_and_fit,
  REL_PREEMPT_AT  "task:epoch:step": that task prints "REL: <task> ready for a preemption signal ..." right after
               that step, once (guarded by REL_KILL_MARKER): the harness then sends it SIGTERM from outside,
  REL_STEP_SLEEP   seconds to sleep after every step (keeps a job running long enough to be interrupted),
  REL_HANG_BEFORE_START  a task name ("worker:1", "rank:1") that sleeps before starting TensorFlow: a peer that
               never joins.
Task names are "worker:1" from TF_CONFIG, "rank:1" under Horovod.
Server tasks of a parameter-server cluster run tfaccel's server instead.
"""

import json
import os
import signal
import sys
import time

cfg = json.loads(os.environ.get("TF_CONFIG", "{}"))
task = cfg.get("task", {})
task_name = f"{task.get('type', 'local')}:{task.get('index', 0)}"
if os.environ.get("HOROVOD_RANK") is not None:
    task_name = f"rank:{os.environ['HOROVOD_RANK']}"
if os.environ.get("REL_HANG_BEFORE_START") == task_name:
    print(f"REL: {task_name} hangs before starting TensorFlow", flush=True)
    time.sleep(3600)  # a peer that never joins (alive, but never starts its part of the cluster)
if task.get("type") == "ps" or (task.get("type") == "worker" and "ps" in cfg.get("cluster", {})):
    from tfaccel.launch.server import main

    sys.exit(main([]))

import numpy as np  # noqa: E402

import tfaccel  # noqa: E402
from tfaccel.datasets import load_dataset  # noqa: E402

env = os.environ


def build():
    import keras

    return keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(32, activation="relu"),
                             keras.layers.Dense(10, activation="softmax")])


def make_callbacks():
    import keras

    callbacks = []
    kill = env.get("REL_KILL_AT", "")
    if kill:
        role, index, epoch_at, step_at = kill.split(":")
        marker = env["REL_KILL_MARKER"]

        class Kill(keras.callbacks.Callback):
            epoch = 0

            def on_epoch_begin(self, epoch, logs=None):
                self.epoch = epoch

            def on_train_batch_end(self, batch, logs=None):
                if (task_name == f"{role}:{index}" and self.epoch == int(epoch_at) and batch + 1 >= int(step_at)
                        and not os.path.exists(marker)):
                    with open(marker, "w") as fh:
                        fh.write(f"{self.epoch}:{batch + 1}\n")
                    print(f"REL: {task_name} kills itself after epoch {self.epoch} step {batch + 1}", flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)

        callbacks.append(Kill())
    preempt = env.get("REL_PREEMPT_AT", "")
    if preempt:
        p_role, p_index, p_epoch, p_step = preempt.split(":")
        p_marker = env["REL_KILL_MARKER"]

        class Announce(keras.callbacks.Callback):
            epoch = 0

            def on_train_begin(self, logs=None):
                print(f"REL: {task_name} trains pid={os.getpid()}", flush=True)

            def on_epoch_begin(self, epoch, logs=None):
                self.epoch = epoch

            def on_train_batch_end(self, batch, logs=None):
                if (task_name == f"{p_role}:{p_index}" and self.epoch == int(p_epoch) and batch + 1 >= int(p_step)
                        and not os.path.exists(p_marker)):
                    with open(p_marker, "w") as fh:
                        fh.write(f"{self.epoch}:{batch + 1}\n")
                    print(f"REL: {task_name} ready for a preemption signal after epoch {self.epoch} step {batch + 1} "
                          f"pid={os.getpid()}", flush=True)

        callbacks.append(Announce())
    if env.get("REL_KERAS_BACKUP"):  # the user's own Keras fault tolerance (issue 24)
        callbacks.append(keras.callbacks.BackupAndRestore(env["REL_KERAS_BACKUP"]))
    if env.get("REL_KERAS_CHECKPOINT"):
        callbacks.append(keras.callbacks.ModelCheckpoint(env["REL_KERAS_CHECKPOINT"], save_weights_only=True))
    if env.get("REL_KERAS_CSV"):
        callbacks.append(keras.callbacks.CSVLogger(env["REL_KERAS_CSV"], append=True))
    if env.get("REL_STEP_SLEEP"):
        pause = float(env["REL_STEP_SLEEP"])

        class Slow(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                time.sleep(pause)

        callbacks.append(Slow())
    return callbacks


def ps_callbacks():
    """The coordinator loop takes epoch-level callbacks only: REL_PREEMPT_AT's announcement at an epoch's start."""
    import keras

    if not env.get("REL_PREEMPT_AT"):
        return []
    p_role, p_index, p_epoch, _ = env["REL_PREEMPT_AT"].split(":")

    class EpochAnnounce(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            print(f"REL: {task_name} trains pid={os.getpid()}", flush=True)

        def on_epoch_begin(self, epoch, logs=None):
            if task_name == f"{p_role}:{p_index}" and epoch == int(p_epoch) and not os.path.exists(
                    env["REL_KILL_MARKER"]):
                with open(env["REL_KILL_MARKER"], "w") as fh:
                    fh.write(f"{epoch}:0\n")
                print(f"REL: {task_name} ready for a preemption signal after epoch {epoch} step 0 pid={os.getpid()}",
                      flush=True)

    return [EpochAnnounce()]


x, y = load_dataset("digits", split="train")
ps = env.get("REL_STRATEGY") == "parameter_server"  # tfaccel's coordinator loop takes epoch-level callbacks only
extra = {"callbacks": ps_callbacks()} if ps else {"steps_per_execution": 1, "callbacks": make_callbacks()}
result = tfaccel.compile_and_fit(
    build, (x, y), epochs=int(env.get("REL_EPOCHS", "3")), global_batch_size=int(env.get("REL_BATCH", "64")),
    strategy=env.get("REL_STRATEGY", "auto"), loss="sparse_categorical_crossentropy", learning_rate=0.003,
    checkpoint_dir=env.get("REL_CHECKPOINT_DIR") or None,
    backup_dir=env.get("REL_BACKUP_DIR", "").format(task=task_name.replace(":", "")) or None,
    backup_freq=int(env["REL_BACKUP_FREQ"]) if env.get("REL_BACKUP_FREQ") else None, seed=1,
    verbose=2 if ps else 0, **extra)
weights = result.model.get_weights()
if env.get("REL_WEIGHTS_OUT"):
    np.savez(env["REL_WEIGHTS_OUT"].format(task=task_name.replace(":", "")), *weights)
print(json.dumps({"task": task_name, "strategy": result.plan.strategy, "replicas": result.plan.num_replicas,
                  "notes": list(result.plan.notes), "steps": result.steps, "resumed_from": result.resumed_from,
                  "steps_per_epoch": result.steps_per_epoch, "loss": result.history.get("loss", []),
                  "restarts": result.details.get("restarts", []), "preemption": result.details.get("preemption"),
                  "fit_seconds": result.seconds}), flush=True)
