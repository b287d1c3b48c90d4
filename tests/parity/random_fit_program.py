"""Random ``fit`` jobs, each trained by plain ``model.fit`` and by ``tfaccel.fit`` on one device; prints one JSON
line per job: its arguments and every difference found (none: the same history, weights, callback files).

    python random_fit_program.py SEED COUNT

A job draws its model (one input, a dict or a list of two, two outputs with loss weights, BatchNormalization and
Dropout), optimizer (a schedule, clipping), data (arrays, a dataset, a repeated dataset with ``steps_per_epoch``, a
dataset with sample weights, a ``PyDataset``), validation (split, arrays, ``validation_steps``,
``validation_freq``), weights (sample, class, weighted metrics), callbacks (epoch-level ones, files),
``initial_epoch``, ``steps_per_epoch``, the model's ``steps_per_execution`` and ``jit_compile``. Every plain
``fit`` runs before the first ``tfaccel.fit`` (which may patch Keras internals for the rest of the process).
"""

import json
import os
import random
import sys
import tempfile
from typing import Any, Dict, List

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["TFACCEL_CACHE_DIR"] = tempfile.mkdtemp()  # no XLA decision of an earlier run

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

N = 41  # batches of 4, 7 or 16 leave a partial last batch
_R = np.random.default_rng(0)
X4, X3 = _R.normal(size=(N, 4)).astype("float32"), _R.normal(size=(N, 3)).astype("float32")
Y, YR = _R.integers(0, 3, size=(N,)).astype("int32"), _R.normal(size=(N, 1)).astype("float32")
SW = _R.uniform(0.2, 2.0, size=(N,)).astype("float32")
V4, V3 = _R.normal(size=(9, 4)).astype("float32"), _R.normal(size=(9, 3)).astype("float32")
VY, VYR = _R.integers(0, 3, size=(9,)).astype("int32"), _R.normal(size=(9, 1)).astype("float32")


def draw(rng: random.Random) -> Dict[str, Any]:
    """One job's choices."""
    job = {"model": rng.choice(["one_input", "dict_inputs", "list_inputs", "two_outputs", "bn_dropout"]),
           "batch": rng.choice([4, 7, 16]), "epochs": rng.choice([1, 2, 3]),
           "optimizer": rng.choice(["adam", "sgd_momentum", "adamw_schedule", "rmsprop_clipnorm"]),
           "weighted_metrics": rng.random() < 0.3, "compiled_spe": rng.choice([1, 1, 3]),
           "jit": rng.choice([False, False, True]),
           "data": rng.choice(["arrays", "arrays", "arrays", "dataset", "repeated", "dataset_sw", "py_dataset"]),
           "callback": rng.choice(["none", "lambda_epoch", "early_stopping", "csv", "checkpoint", "lr_scheduler"]),
           "validation": rng.choice(["none", "split", "arrays"]), "weights": rng.choice(["none", "sample", "class"]),
           "steps_per_epoch": rng.choice([None, None, None, 2, 3]), "validation_steps": rng.choice([None, None, 2]),
           "validation_freq": rng.choice([1, 1, 2])}
    job["initial_epoch"] = rng.choice([0, 1]) if job["epochs"] > 1 else 0
    if job["data"] == "repeated":
        job["steps_per_epoch"] = rng.choice([5, 70])
    if job["data"] != "arrays":
        job["weights"] = "none" if job["data"] != "dataset_sw" else "sample"
        job["validation"] = "arrays" if job["validation"] == "split" else job["validation"]
    if job["model"] == "two_outputs" and job["weights"] == "class":
        job["weights"] = "none"  # Keras refuses class_weight for several outputs
    return job


def build(job: Dict[str, Any]) -> Any:
    keras.utils.set_random_seed(7)
    a = keras.Input((4,), name="a")
    inputs: Any = a
    hidden = a
    if job["model"] in ("dict_inputs", "list_inputs"):
        b = keras.Input((3,), name="b")
        hidden = keras.layers.Concatenate()([a, b])
        inputs = {"a": a, "b": b} if job["model"] == "dict_inputs" else [a, b]
    hidden = keras.layers.Dense(8, activation="relu")(hidden)
    if job["model"] == "bn_dropout":
        hidden = keras.layers.Dropout(0.3)(keras.layers.BatchNormalization()(hidden))
    loss: Any = "sparse_categorical_crossentropy"
    metrics: Any = ["accuracy"]
    extra: Dict[str, Any] = {}
    if job["model"] == "two_outputs":
        outputs: Any = {"cls": keras.layers.Dense(3, activation="softmax", name="cls")(hidden),
                        "reg": keras.layers.Dense(1, name="reg")(hidden)}
        loss, metrics = {"cls": loss, "reg": "mse"}, {"cls": ["accuracy"], "reg": ["mae"]}
        extra["loss_weights"] = {"cls": 1.0, "reg": 0.5}
    else:
        outputs = keras.layers.Dense(3, activation="softmax")(hidden)
    if job["weighted_metrics"]:
        extra["weighted_metrics"] = metrics
    optimizer = {"adam": lambda: keras.optimizers.Adam(0.01),
                 "sgd_momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
                 "adamw_schedule": lambda: keras.optimizers.AdamW(keras.optimizers.schedules.ExponentialDecay(
                     0.02, 3, 0.8)),
                 "rmsprop_clipnorm": lambda: keras.optimizers.RMSprop(0.01, clipnorm=0.5)}[job["optimizer"]]()
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=optimizer, loss=loss, metrics=metrics, steps_per_execution=job["compiled_spe"],
                  jit_compile=job["jit"], **extra)
    return model


def _inputs(job: Dict[str, Any], x4: Any, x3: Any) -> Any:
    return {"a": x4, "b": x3} if job["model"] == "dict_inputs" else [x4, x3] if job["model"] == "list_inputs" else x4


def _targets(job: Dict[str, Any], y: Any, yr: Any) -> Any:
    return {"cls": y, "reg": yr} if job["model"] == "two_outputs" else y


class Batches(keras.utils.PyDataset):
    def __init__(self, parts: tuple, batch: int) -> None:
        super().__init__()
        self.parts, self.batch = parts, batch

    def __len__(self) -> int:
        return -(-N // self.batch)

    def __getitem__(self, i: int) -> tuple:
        return tf.nest.map_structure(lambda a: a[i * self.batch:(i + 1) * self.batch], self.parts)


def fit_arguments(job: Dict[str, Any], out: str) -> Dict[str, Any]:
    x, y = _inputs(job, X4, X3), _targets(job, Y, YR)
    kwargs: Dict[str, Any] = {"epochs": job["epochs"], "initial_epoch": job["initial_epoch"], "verbose": 0}
    parts = (x, y, SW) if job["weights"] == "sample" else (x, y)
    if job["data"] == "arrays":
        kwargs.update(x=x, y=y, batch_size=job["batch"], shuffle=False)
        if job["weights"] == "sample":
            kwargs["sample_weight"] = SW
        elif job["weights"] == "class":
            kwargs["class_weight"] = {0: 0.5, 1: 2.0, 2: 1.0}
    elif job["data"] == "py_dataset":
        kwargs["x"] = Batches(parts, job["batch"])
    else:
        data = tf.data.Dataset.from_tensor_slices(parts).batch(job["batch"])
        kwargs["x"] = data.repeat() if job["data"] == "repeated" else data
    if job["steps_per_epoch"]:
        kwargs["steps_per_epoch"] = job["steps_per_epoch"]
    if job["validation"] == "split":
        kwargs["validation_split"] = 0.2
    elif job["validation"] == "arrays":
        kwargs["validation_data"] = (_inputs(job, V4, V3), _targets(job, VY, VYR))
    if job["validation"] != "none":
        kwargs["validation_freq"] = job["validation_freq"]
        if job["validation_steps"]:
            kwargs["validation_steps"] = job["validation_steps"]
    kwargs["callbacks"] = {
        "none": [], "lambda_epoch": [keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: None)],
        "early_stopping": [keras.callbacks.EarlyStopping(monitor="loss", patience=1, min_delta=0.02,
                                                         restore_best_weights=True)],
        "csv": [keras.callbacks.CSVLogger(os.path.join(out, "log.csv"))],
        "checkpoint": [keras.callbacks.ModelCheckpoint(os.path.join(out, "m-{epoch}.weights.h5"),
                                                       save_weights_only=True)],
        "lr_scheduler": [keras.callbacks.LearningRateScheduler(lambda epoch, rate: 0.01 * 0.5 ** epoch)],
    }[job["callback"]]
    return kwargs


def outcome(model: Any, history: Dict[str, List[float]], out: str) -> Dict[str, Any]:
    csv = os.path.join(out, "log.csv")
    return {"history": {k: [float(v) for v in values] for k, values in history.items()},
            "weights": [w.tolist() for w in model.get_weights()], "files": sorted(os.listdir(out)),
            "csv": open(csv).read() if os.path.exists(csv) else None}


def run(train: Any) -> Dict[str, Any]:
    out = tempfile.mkdtemp()
    try:
        return train(out)
    except Exception as exc:  # noqa: BLE001 (a job plain Keras refuses must be refused by tfaccel too)
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}


def differences(want: Dict[str, Any], got: Dict[str, Any]) -> List[str]:
    if "error" in want or "error" in got:
        same = ("error" in want) == ("error" in got)
        return [] if same else [f"plain fit: {want.get('error', 'trained')}; tfaccel: {got.get('error', 'trained')}"]
    if sorted(want["history"]) != sorted(got["history"]):
        return [f"history keys {sorted(want['history'])} != {sorted(got['history'])}"]
    found = [f"{key}: {np.round(values, 5).tolist()} != {np.round(got['history'][key], 5).tolist()}"
             for key, values in want["history"].items()
             if len(values) != len(got["history"][key])
             or not np.allclose(got["history"][key], values, rtol=1e-5, atol=1e-6)]
    for index, (a, b) in enumerate(zip(want["weights"], got["weights"])):
        if not np.allclose(a, b, rtol=1e-4, atol=1e-5):
            found.append(f"weight {index}: {np.max(np.abs(np.subtract(a, b))):.2e} apart")
    found += [f"{what}: {want[what]!r} != {got[what]!r}" for what in ("files", "csv") if want[what] != got[what]]
    return found


def main(seed: int, count: int) -> None:
    rng = random.Random(seed)
    jobs = [draw(rng) for _ in range(count)]

    def plain(job: Dict[str, Any]) -> Any:
        def train(out: str) -> Dict[str, Any]:
            model = build(job)
            return outcome(model, model.fit(**fit_arguments(job, out)).history, out)
        return train

    references = [run(plain(job)) for job in jobs]
    import tfaccel

    for job, want in zip(jobs, references):
        def train(out: str, job: Dict[str, Any] = job) -> Dict[str, Any]:
            with tfaccel.scope(strategy="default", jit_compile=job["jit"]):
                model = build(job)
            result = tfaccel.fit(model, **fit_arguments(job, out))
            return {**outcome(model, result.history, out), "loop": result.details.get("loop_name")}
        got = run(train)
        print(json.dumps({"job": job, "loop": got.get("loop"), "differences": differences(want, got)}), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
