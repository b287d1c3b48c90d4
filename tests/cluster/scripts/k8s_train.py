"""A user's training script as a Kubernetes pod runs it: strategy "auto", no TF_CONFIG (tests/cluster/test_k8s_pods.py).

argv: BACKUP_DIR OUT_DIR. Writes OUT_DIR/<hostname>.npz (the final weights) and prints one "K8S-RESULT {json}" line;
prints "K8S: step N" after every step (and sleeps K8S_STEP_SLEEP seconds, the test's knob to be interrupted).
"""

import json
import os
import socket
import sys
import time

import keras
import numpy as np

import tfaccel

keras.utils.set_random_seed(0)


class Steps(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        print(f"K8S: step {batch}", flush=True)
        time.sleep(float(os.environ.get("K8S_STEP_SLEEP", "0")))


rng = np.random.default_rng(0)
x = rng.normal(size=(512, 8)).astype("float32")
y = (x.sum(1) > 0).astype("int32")
with tfaccel.scope() as plan:
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy")
result = tfaccel.fit(model, x, y, batch_size=64, epochs=2, seed=1, backup_dir=sys.argv[1], verbose=0,
                     callbacks=[Steps()], steps_per_execution=1)
np.savez(os.path.join(sys.argv[2], socket.gethostname() + ".npz"), *model.get_weights())
print("K8S-RESULT " + json.dumps({"host": socket.gethostname(), "strategy": plan.strategy,
                                  "reason": plan.strategy_reason, "replicas": plan.num_replicas,
                                  "notes": list(plan.notes), "resumed_from": result.resumed_from}), flush=True)
