"""One task of a parameter-server job with backups (tests/training/test_ps_backup.py). The chief prints one JSON line.

ps and worker tasks run tfaccel's server. The chief runs compile_and_fit(strategy="parameter_server") with:
  PSB_EPOCHS (4), PSB_BACKUP_DIR, PSB_BACKUP_FREQ, PSB_STEP_SLEEP (seconds the coordinator sleeps after each
  backup, to keep the job running long enough to be interrupted), PSB_RESTORED_OUT (npz: the values of every
  variable right after the backup was restored, recorded by a pass-through spy on restore_checkpoint_backup).
"""

import json
import os
import sys
import time

cfg = json.loads(os.environ.get("TF_CONFIG", "{}"))
if cfg.get("task", {}).get("type") in ("ps", "worker"):
    from tfaccel.launch.server import main

    sys.exit(main([]))

import numpy as np  # noqa: E402

import tfaccel  # noqa: E402
import tfaccel.train.loops.coordinator  # noqa: E402
from tfaccel.datasets import load_dataset  # noqa: E402

env = os.environ


def build():
    import keras

    return keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dense(10, activation="softmax")])


real_restore = tfaccel.train.loops.coordinator.restore_checkpoint_backup
real_write = tfaccel.train.loops.coordinator.write_checkpoint_backup


def restore_spy(state, checkpoint, *, backup_dir):
    real_restore(state, checkpoint, backup_dir=backup_dir)
    if env.get("PSB_RESTORED_OUT") and checkpoint is not None:
        values = {f"model_{i}": w for i, w in enumerate(checkpoint.model.get_weights())}
        values.update({f"opt_{i}": np.asarray(v.numpy()) for i, v in enumerate(checkpoint.optimizer.variables)})
        values["steps"] = np.asarray(checkpoint.steps.numpy())
        np.savez(env["PSB_RESTORED_OUT"], **values)


def write_spy(*args, **kwargs):
    path = real_write(*args, **kwargs)
    print(f"PSB: backup written epoch={kwargs['epoch']} step={kwargs['step']}", flush=True)
    time.sleep(float(env.get("PSB_STEP_SLEEP", "0")))
    return path


tfaccel.train.loops.coordinator.restore_checkpoint_backup = restore_spy
tfaccel.train.loops.coordinator.write_checkpoint_backup = write_spy

x, y = load_dataset("digits", split="train")
result = tfaccel.compile_and_fit(
    build, (x, y), epochs=int(env.get("PSB_EPOCHS", "4")), global_batch_size=64, strategy="parameter_server",
    loss="sparse_categorical_crossentropy", learning_rate=0.003, seed=1, verbose=2,
    backup_dir=env.get("PSB_BACKUP_DIR") or None,
    backup_freq=int(env["PSB_BACKUP_FREQ"]) if env.get("PSB_BACKUP_FREQ") else None)
print(json.dumps({"steps": result.steps, "steps_per_epoch": result.steps_per_epoch,
                  "resumed_from": result.resumed_from, "loss": result.history.get("loss", []),
                  "details": {k: result.details.get(k) for k in ("optimizer_iterations", "steps_counted",
                                                                 "backups_written", "resumed")}}), flush=True)
