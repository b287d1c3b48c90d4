"""A compile_and_fit job for multi-process tests. Prints one JSON line with what it did.

Server tasks of a parameter-server cluster (ps, and workers when a ps exists) run tfaccel's server instead.
Options come from the environment so the same file serves every test:
  FIT_STRATEGY (default auto), FIT_EPOCHS, FIT_BATCH, FIT_CHECKPOINT_DIR, FIT_BACKUP_DIR, FIT_BACKUP_FREQ,
  FIT_KILL_AT ("epoch:step": this process SIGKILLs itself after that step; once, guarded by a marker file),
  FIT_WEIGHTS_OUT (npz path for the final weights, a {task} placeholder is filled).
"""

import hashlib
import json
import os
import signal
import sys

cfg = json.loads(os.environ.get("TF_CONFIG", "{}"))
task = cfg.get("task", {})
if task.get("type") == "ps" or (task.get("type") == "worker" and "ps" in cfg.get("cluster", {})):
    from tfaccel.launch.server import main

    sys.exit(main([]))

import numpy as np  # noqa: E402

import tfaccel  # noqa: E402
from tfaccel.datasets import load_dataset  # noqa: E402


def build():
    import keras

    return keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(32, activation="relu"),
                             keras.layers.Dense(10, activation="softmax")])


class KillAt:
    """SIGKILLs this process right after the given (epoch, step): a worker dying mid-epoch."""

    def __new__(cls, spec, marker):
        import keras

        epoch_at, step_at = (int(v) for v in spec.split(":"))

        class _Kill(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                self.epoch = epoch

            def on_train_batch_end(self, batch, logs=None):
                if self.epoch == epoch_at and batch + 1 >= step_at and not os.path.exists(marker):
                    open(marker, "w").close()
                    os.kill(os.getpid(), signal.SIGKILL)

        return _Kill()


x, y = load_dataset("digits", split="train")
xv, yv = load_dataset("digits", split="test")
env = os.environ
callbacks = []
if env.get("FIT_KILL_AT"):
    callbacks.append(KillAt(env["FIT_KILL_AT"], env["FIT_KILL_MARKER"]))
result = tfaccel.compile_and_fit(
    build, (x, y), validation_data=(xv, yv), epochs=int(env.get("FIT_EPOCHS", "3")),
    global_batch_size=int(env.get("FIT_BATCH", "64")), strategy=env.get("FIT_STRATEGY", "auto"),
    loss="sparse_categorical_crossentropy", metrics=["accuracy"], learning_rate=float(env.get("FIT_LR", "0.01")),
    checkpoint_dir=env.get("FIT_CHECKPOINT_DIR") or None, backup_dir=env.get("FIT_BACKUP_DIR") or None,
    backup_freq=int(env["FIT_BACKUP_FREQ"]) if env.get("FIT_BACKUP_FREQ") else None, seed=1,
    steps_per_execution=int(env["FIT_SPE"]) if env.get("FIT_SPE") else "auto", callbacks=callbacks, verbose=0)
weights = result.model.get_weights()
digest = hashlib.sha256(b"".join(np.asarray(w, dtype=np.float32).tobytes() for w in weights)).hexdigest()
if env.get("FIT_WEIGHTS_OUT"):
    np.savez(env["FIT_WEIGHTS_OUT"].format(task=f"{task.get('type', 'local')}{task.get('index', 0)}"), *weights)
print(json.dumps({"task": task, "strategy": result.plan.strategy, "replicas": result.plan.num_replicas,
                  "history": result.history, "steps": result.steps, "digest": digest,
                  "resumed_from": result.resumed_from, "details": {k: v for k, v in result.details.items()
                                                                   if isinstance(v, (int, float, str, list))}}))
