"""`tfaccel launch --ps 1 --workers 1 --evaluator` job: the chief trains, the evaluator task evaluates each checkpoint.

The same script runs on the chief and on the evaluator (as a user's would). $EVAL_DIR holds the checkpoints and
the TensorBoard logs; each task prints one JSON line with its task type, plan notes, history and details.
"""

import json
import os
import sys

EPOCHS = 3


def data():
    import numpy as np

    rng = np.random.default_rng(5)
    x = rng.standard_normal((96, 5)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype("float32")
    vx = rng.standard_normal((40, 5)).astype("float32")
    vy = (vx[:, 0] + vx[:, 1] > 0).astype("float32")
    return x, y, (vx, vy)


def build():
    import keras

    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, activation="tanh"),
                              keras.layers.Dense(1, activation="sigmoid")], name="tiny")
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="binary_crossentropy", metrics=["accuracy"])
    return model


def main() -> int:
    import tfaccel

    root = os.environ["EVAL_DIR"]
    x, y, val = data()
    with tfaccel.scope(strategy="parameter_server") as plan:
        model = build()
    result = tfaccel.fit(model, x, y, batch_size=32, epochs=EPOCHS, validation_data=val, verbose=0,
                         checkpoint_dir=os.path.join(root, "ckpt"), tensorboard_dir=os.path.join(root, "tb"))
    task = json.loads(os.environ["TF_CONFIG"])["task"]["type"]
    print("RESULT " + json.dumps({"task": task, "strategy": plan.strategy, "notes": list(plan.notes),
                                  "history": result.history, "evaluations": result.details.get("evaluations"),
                                  "checkpoints": result.details.get("checkpoints"),
                                  "job_id": os.environ.get("TFACCEL_JOB_ID")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
