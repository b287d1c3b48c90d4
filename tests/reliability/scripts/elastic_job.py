"""The job of the elastic tests and tallies (issue 25). Prints one JSON line with what it did.

The reliability job's model (an MLP on digits, Adam, seed 1) on the first ELASTIC_EXAMPLES (1344) training examples:
whole batches of ELASTIC_BATCH (96), which split evenly over 1, 2, 3, 4 and 6 workers. Configured by the
environment: ELASTIC_EPOCHS (3), ELASTIC_BACKUP_DIR, ELASTIC_BACKUP_FREQ (2), ELASTIC_WEIGHTS_OUT (an npz path,
{task} filled in), ELASTIC_KILL_AT "worker:I:EPOCH:STEP": that task SIGKILLs itself right after that step, once
(guarded by the marker file ELASTIC_KILL_MARKER); ELASTIC_CAPACITY "PATH:N": just before that kill, N is written
into PATH (the launcher's capacity file: capacity returns); ELASTIC_MODEL "bn" / "syncbn": a BatchNormalization
layer after the hidden layer (per-replica statistics / synchronized over every replica); ELASTIC_SHARD "1": the
optimizer state sharded over the workers (shard_optimizer_state=True, each worker backing up its own shard).
"""

import json
import os
import signal

import numpy as np

import tfaccel
from tfaccel.datasets import load_dataset

env = os.environ
task = json.loads(env.get("TF_CONFIG", "{}")).get("task", {})
task_name = f"{task.get('type', 'local')}:{task.get('index', 0)}"


def build():
    import keras

    norm = {"bn": [keras.layers.BatchNormalization()],  # ELASTIC_MODEL: with batch normalization, per replica or
            "syncbn": [keras.layers.BatchNormalization(synchronized=True)]}.get(env.get("ELASTIC_MODEL"), [])  # not
    return keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(32, activation="relu"),
                             *norm, keras.layers.Dense(10, activation="softmax")])


def kill_callback():
    import keras

    victim, epoch_at, step_at = env["ELASTIC_KILL_AT"].rsplit(":", 2)
    marker = env["ELASTIC_KILL_MARKER"]

    class Kill(keras.callbacks.Callback):
        epoch = 0

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if task_name == victim and self.epoch == int(epoch_at) and batch + 1 >= int(step_at) \
                    and not os.path.exists(marker):
                with open(marker, "w") as fh:
                    fh.write(f"{self.epoch}:{batch + 1}\n")
                if env.get("ELASTIC_CAPACITY"):
                    path, count = env["ELASTIC_CAPACITY"].rsplit(":", 1)
                    with open(path, "w") as fh:
                        fh.write(f"{count}\n")
                print(f"ELASTIC: {task_name} kills itself after epoch {self.epoch} step {batch + 1}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

    return Kill()


x, y = load_dataset("digits", split="train")
n = int(env.get("ELASTIC_EXAMPLES", "1344"))
result = tfaccel.compile_and_fit(
    build, (x[:n], y[:n]), epochs=int(env.get("ELASTIC_EPOCHS", "3")),
    global_batch_size=int(env.get("ELASTIC_BATCH", "96")), loss="sparse_categorical_crossentropy",
    learning_rate=0.003, backup_dir=env.get("ELASTIC_BACKUP_DIR") or None,
    backup_freq=int(env.get("ELASTIC_BACKUP_FREQ", "2")), seed=1, verbose=0, steps_per_execution=1,
    shard_optimizer_state=env.get("ELASTIC_SHARD") == "1",
    callbacks=[kill_callback()] if env.get("ELASTIC_KILL_AT") else [])
if env.get("ELASTIC_WEIGHTS_OUT"):
    np.savez(env["ELASTIC_WEIGHTS_OUT"].format(task=task_name.replace(":", "")), *result.model.get_weights())
print(json.dumps({"task": task_name, "replicas": result.plan.num_replicas, "resumed_from": result.resumed_from,
                  "steps": result.steps, "iterations": int(result.model.optimizer.iterations.numpy()),
                  "world_size": result.details.get("world_size"), "restarts": result.details.get("restarts"),
                  "optimizer_state": result.details.get("optimizer_state"),
                  "history": result.history}), flush=True)
