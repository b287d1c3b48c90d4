"""A compile_and_fit job with no Ray code, for `tfaccel launch --backend ray` (tests/ray).

Environment: JOB_OUT (directory for weights-<rank>.npz and result-<rank>.json), JOB_EPOCHS (2),
JOB_CHECKPOINT_DIR (compile_and_fit's checkpoint_dir), JOB_RAISE_RANK (that worker raises ValueError before
training, after printing "JOB: worker:<rank> raises at <unix time>").
"""

import json
import os
import time
from pathlib import Path

import numpy as np

import tfaccel
from tfaccel.launch.ray import ray_context

context = ray_context() or {"rank": 0, "world_size": 1}
rank = context["rank"]
if os.environ.get("JOB_RAISE_RANK") == str(rank):
    print(f"JOB: worker:{rank} raises at {time.time():.3f}", flush=True)
    raise ValueError(f"worker {rank} was told to fail")


def build():
    import keras

    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])


rng = np.random.default_rng(0)
x = rng.normal(size=(256, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)
checkpoint_dir = os.environ.get("JOB_CHECKPOINT_DIR") or None
result = tfaccel.compile_and_fit(build, (x, y), epochs=int(os.environ.get("JOB_EPOCHS", "2")), global_batch_size=32,
                                 loss="mse", seed=1, verbose=0, checkpoint_dir=checkpoint_dir)
out = Path(os.environ["JOB_OUT"])
np.savez(out / f"weights-{rank}.npz", *result.model.get_weights())
(out / f"result-{rank}.json").write_text(json.dumps({
    "rank": rank, "strategy": result.plan.strategy, "replicas": result.plan.num_replicas,
    "tf_config": json.loads(os.environ.get("TF_CONFIG", "{}")), "restart": os.environ.get("TFACCEL_RESTART_COUNT"),
    "loss": result.history.get("loss", [])}))
print(f"JOB: worker:{rank} done", flush=True)
