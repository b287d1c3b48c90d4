"""Random ``fit`` jobs, each trained by plain ``model.fit`` and by ``tfaccel.fit``, on one device or under
``mirrored`` over 2 virtual CPUs (plain fit under Keras' own MirroredStrategy: see reference_strategy); prints one
JSON line per job: its arguments and every difference found (none: the same history, weights, callback files).

    python random_fit_program.py SEED COUNT [default|mirrored]

A job draws its model (one input, a dict or a list of two, two outputs with loss weights, BatchNormalization and
Dropout), optimizer (a schedule, clipping), data (arrays, a dataset, a repeated dataset with ``steps_per_epoch``, a
dataset with sample weights, each batched with or without ``drop_remainder`` and then prefetched or mapped and
cached, a ``batch_size`` beside it or not; a ``PyDataset``), validation (split, arrays, ``validation_steps``,
``validation_freq``), weights (sample, class, weighted metrics), callbacks (epoch-level ones, files),
``initial_epoch``, ``steps_per_epoch``, the model's ``steps_per_execution`` and ``jit_compile``. Every plain
``fit`` runs before the first ``tfaccel.fit`` (which may patch Keras internals for the rest of the process).
"""

import itertools
import json
import os
import random
import sys
import tempfile
from typing import Any, Dict, List, Optional

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["TFACCEL_CACHE_DIR"] = tempfile.mkdtemp()  # no XLA decision of an earlier run

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

N = 41  # batches of 4, 7 or 16 leave a partial last batch (one device)
# Under mirrored (2 replicas), batches that split evenly over them: Keras' own fit under a MirroredStrategy fails on
# a first batch that does not (it reduces that batch across the replicas to build the model), and on a later one
# weighs the replicas' parts equally (docs/guides/debugging-divergence.md, uneven-last-batch): 40 examples in
# batches of 4, 8 or 16, 8 for validation.
MIRRORED_EXAMPLES, MIRRORED_VALIDATION = 40, 8
# Data whose mirrored jobs are compared with plain fit on one device (reference_strategy).
ONE_DEVICE_DATA = ("generator", "py_dataset")
_R = np.random.default_rng(0)
X4, X3 = _R.normal(size=(N, 4)).astype("float32"), _R.normal(size=(N, 3)).astype("float32")
Y, YR = _R.integers(0, 3, size=(N,)).astype("int32"), _R.normal(size=(N, 1)).astype("float32")
SW = _R.uniform(0.2, 2.0, size=(N,)).astype("float32")
TOKENS, VTOKENS = _R.integers(0, 20, size=(N, 5)).astype("int32"), _R.integers(0, 20, size=(9, 5)).astype("int32")
V4, V3 = _R.normal(size=(9, 4)).astype("float32"), _R.normal(size=(9, 3)).astype("float32")
VY, VYR = _R.integers(0, 3, size=(9,)).astype("int32"), _R.normal(size=(9, 1)).astype("float32")


PIPELINES = {  # a batched dataset as users build it (drop_remainder=True: a static batch dimension, as TPUs need)
    "batch": lambda data, batch: data.batch(batch),
    "batch_prefetch": lambda data, batch: data.batch(batch).prefetch(2),
    "drop_remainder_prefetch": lambda data, batch: data.batch(batch, drop_remainder=True).prefetch(2),
    "drop_remainder_map_cache": lambda data, batch: data.batch(batch, drop_remainder=True).map(lambda *t: t).cache(),
}


def draw(rng: random.Random, extras: random.Random, strategy: str = "default",
         forms: Optional[random.Random] = None, pipelines: Optional[random.Random] = None) -> Dict[str, Any]:
    """One job's choices (under ``mirrored``: batches that split evenly, no XLA, as Keras' fit there needs).
    ``forms``, a third stream, turns half the ``PyDataset`` jobs into a Python generator of the same batches;
    ``pipelines``, a fourth, draws a dataset's pipeline after its batching and a ``batch_size`` beside it (which
    Keras ignores). Each stream of its own, so that the others' choices stay those of their seeds."""
    mirrored = strategy == "mirrored"
    job = {"model": rng.choice(["one_input", "dict_inputs", "list_inputs", "two_outputs", "bn_dropout"]),
           "batch": rng.choice([4, 8, 16] if mirrored else [4, 7, 16]), "epochs": rng.choice([1, 2, 3]),
           "optimizer": rng.choice(["adam", "sgd_momentum", "adamw_schedule", "rmsprop_clipnorm"]),
           "weighted_metrics": rng.random() < 0.3, "compiled_spe": rng.choice([1, 1, 3]),
           "jit": rng.choice([False, False, True]),
           "data": rng.choice(["arrays", "arrays", "arrays", "dataset", "repeated", "dataset_sw", "py_dataset"]),
           "callback": rng.choice(["none", "lambda_epoch", "early_stopping", "csv", "checkpoint", "lr_scheduler"]),
           "validation": rng.choice(["none", "split", "arrays"]), "weights": rng.choice(["none", "sample", "class"]),
           "steps_per_epoch": rng.choice([None, None, None, 2, 3]), "validation_steps": rng.choice([None, None, 2]),
           "validation_freq": rng.choice([1, 1, 2])}
    job["initial_epoch"] = rng.choice([0, 1]) if job["epochs"] > 1 else 0
    job["examples"], job["validation_examples"] = (MIRRORED_EXAMPLES, MIRRORED_VALIDATION) if mirrored else (N, 9)
    draw_extras(extras, job, mirrored)
    if forms is not None and job["data"] == "py_dataset" and forms.random() < 0.5:
        job["data"] = "generator"
    if job["data"] == "generator":
        # Keras' second fit of the same generator trains batches that depend on timing (its tf.data pipeline pulls
        # ahead of the steps and drops what it pulled when fit ends: 4 or 5 batches for 3 steps, plain Keras too)
        job["fit_twice"] = False
    if pipelines is not None:
        job["pipeline"] = pipelines.choice(sorted(PIPELINES))
        job["batch_beside"] = pipelines.random() < 0.3
    if mirrored:
        job["jit"] = False  # Keras' fit under a MirroredStrategy fails with jit_compile=True on CPUs
        if (clips(job) or job["data"] in ONE_DEVICE_DATA) and job["model"] == "bn_dropout":  # see reference_strategy
            job["model"] = "one_input"
    if job["data"] == "repeated":
        job["steps_per_epoch"] = rng.choice([5, 70])
    if job["data"] != "arrays":
        job["weights"] = "none" if job["data"] != "dataset_sw" else "sample"
        job["validation"] = "arrays" if job["validation"] == "split" else job["validation"]
    if job["model"] == "two_outputs" and job["weights"] == "class":
        job["weights"] = "none"  # Keras refuses class_weight for several outputs
    return job


def draw_extras(rng: random.Random, job: Dict[str, Any], mirrored: bool) -> None:
    """More of what users pass, drawn from a stream of its own (the choices of draw() stay those of its seed): a
    head of logits with a loss object, metric objects, an Embedding model, more callbacks (one reading every
    batch), a second ``fit`` of the same model, ``validation_batch_size``, fit's default batch size."""
    job["head"] = rng.choice(["softmax", "softmax", "logits"])
    job["metric_objects"] = rng.random() < 0.3
    if rng.random() < 0.15:
        job["model"] = "embedding"
    job["extra_callback"] = rng.choice(["none", "none", "none", "reduce_lr", "terminate_on_nan", "per_batch",
                                        "backup_restore", "best_checkpoint"])
    job["fit_twice"] = rng.random() < 0.2
    wants_batch = rng.random()
    if job["data"] == "arrays" and job["validation"] != "none" and wants_batch < 0.2:
        job["validation_batch_size"] = 4 if mirrored else 3
    if job["data"] == "arrays" and wants_batch > 0.9 and not (mirrored and job["steps_per_epoch"]):
        job["batch"] = None  # Keras' own: 32, or the examples over steps_per_epoch (which may be odd)


def clips(job: Dict[str, Any]) -> bool:
    return job["optimizer"] == "rmsprop_clipnorm"


def reference_strategy(job: Dict[str, Any], mirrored: Any) -> Any:
    """Where plain ``fit`` trains the job's reference: under Keras' own MirroredStrategy, or on one device for an
    optimizer that clips (Keras 3.15 clips each replica's partial gradient, before the all-reduce; tfaccel clips
    the reduced one, as one device does, and its plan says so). BatchNormalization normalises per replica, so a
    model with it has no one-device reference under 2 replicas: draw() leaves it out of the clipping jobs. A
    Python generator and a ``PyDataset`` are trained on one device too: Keras' fit under a strategy builds the
    model from an iterator it throws away, which takes some of a generator's first batches (how many depends on
    timing) and draws a shuffled ``PyDataset``'s order (each epoch then trains on the order one device trains the
    next on); tfaccel starts no such iterator (tfaccel.compat.keras_mwms)."""
    return tf.distribute.get_strategy() if clips(job) or job["data"] in ONE_DEVICE_DATA else mirrored


def build(job: Dict[str, Any]) -> Any:
    keras.utils.set_random_seed(7)
    tokens = job["model"] == "embedding"
    a = keras.Input((5,), name="a", dtype="int32") if tokens else keras.Input((4,), name="a")
    inputs: Any = a
    hidden = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(20, 4)(a)) if tokens else a
    if job["model"] in ("dict_inputs", "list_inputs"):
        b = keras.Input((3,), name="b")
        hidden = keras.layers.Concatenate()([a, b])
        inputs = {"a": a, "b": b} if job["model"] == "dict_inputs" else [a, b]
    hidden = keras.layers.Dense(8, activation="relu")(hidden)
    if job["model"] == "bn_dropout":
        hidden = keras.layers.Dropout(0.3)(keras.layers.BatchNormalization()(hidden))
    logits = job.get("head") == "logits"
    loss: Any = (keras.losses.SparseCategoricalCrossentropy(from_logits=True) if logits
                 else "sparse_categorical_crossentropy")
    metrics: Any = ([keras.metrics.SparseCategoricalAccuracy(name="acc"),
                     keras.metrics.SparseTopKCategoricalAccuracy(k=2, name="top2")] if job.get("metric_objects")
                    else ["accuracy"])
    extra: Dict[str, Any] = {}
    head = None if logits else "softmax"
    if job["model"] == "two_outputs":
        outputs: Any = {"cls": keras.layers.Dense(3, activation=head, name="cls")(hidden),
                        "reg": keras.layers.Dense(1, name="reg")(hidden)}
        loss, metrics = {"cls": loss, "reg": "mse"}, {"cls": metrics, "reg": ["mae"]}
        extra["loss_weights"] = {"cls": 1.0, "reg": 0.5}
    else:
        outputs = keras.layers.Dense(3, activation=head)(hidden)
    if job["weighted_metrics"]:  # metric objects are not shared between the two lists
        extra["weighted_metrics"] = (metrics if not job.get("metric_objects") else {"cls": ["accuracy"]}
                                     if job["model"] == "two_outputs" else ["accuracy"])
    optimizer = {"adam": lambda: keras.optimizers.Adam(0.01),
                 "sgd_momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
                 "adamw_schedule": lambda: keras.optimizers.AdamW(keras.optimizers.schedules.ExponentialDecay(
                     0.02, 3, 0.8)),
                 "rmsprop_clipnorm": lambda: keras.optimizers.RMSprop(0.01, clipnorm=0.5)}[job["optimizer"]]()
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=optimizer, loss=loss, metrics=metrics, steps_per_execution=job["compiled_spe"],
                  jit_compile=job["jit"], **extra)
    return model


def _inputs(job: Dict[str, Any], x4: Any, x3: Any, tokens: Any) -> Any:
    if job["model"] == "embedding":
        return tokens
    return {"a": x4, "b": x3} if job["model"] == "dict_inputs" else [x4, x3] if job["model"] == "list_inputs" else x4


def _targets(job: Dict[str, Any], y: Any, yr: Any) -> Any:
    return {"cls": y, "reg": yr} if job["model"] == "two_outputs" else y


class Batches(keras.utils.PyDataset):
    """Batches as views of the arrays (as users write them), or as copies (``copies``: plain Keras' reference under
    a MirroredStrategy, where TensorFlow writes into views: tfaccel.compat.tf_generator_alias)."""

    def __init__(self, parts: tuple, batch: int, copies: bool = False) -> None:
        super().__init__()
        self.parts, self.batch, self.copies = parts, batch, copies

    def __len__(self) -> int:
        return -(-len(tf.nest.flatten(self.parts)[0]) // self.batch)

    def __getitem__(self, i: int) -> tuple:
        return tf.nest.map_structure(lambda a: np.array(a[i * self.batch:(i + 1) * self.batch], copy=self.copies),
                                     self.parts)


def fit_arguments(job: Dict[str, Any], out: str, copies: bool = False) -> Dict[str, Any]:
    n, v = job["examples"], job["validation_examples"]
    x, y, sw = _inputs(job, X4[:n], X3[:n], TOKENS[:n]), _targets(job, Y[:n], YR[:n]), SW[:n]
    kwargs: Dict[str, Any] = {"epochs": job["epochs"], "initial_epoch": job["initial_epoch"], "verbose": 0}
    parts = (x, y, sw) if job["weights"] == "sample" else (x, y)
    if job["data"] == "arrays":
        kwargs.update(x=x, y=y, shuffle=False)
        if job["batch"]:
            kwargs["batch_size"] = job["batch"]
        if job["weights"] == "sample":
            kwargs["sample_weight"] = sw
        elif job["weights"] == "class":
            kwargs["class_weight"] = {0: 0.5, 1: 2.0, 2: 1.0}
    elif job["data"] == "py_dataset":
        kwargs["x"] = Batches(parts, job["batch"], copies)
    elif job["data"] == "generator":  # as users write one: forever, with steps_per_epoch
        batches = Batches(parts, job["batch"], copies)
        kwargs["x"] = (batches[i] for _ in itertools.count() for i in range(len(batches)))
        kwargs["steps_per_epoch"] = job["steps_per_epoch"] or len(batches)
    else:
        data = PIPELINES[job.get("pipeline", "batch")](tf.data.Dataset.from_tensor_slices(parts), job["batch"])
        kwargs["x"] = data.repeat() if job["data"] == "repeated" else data
        if job.get("batch_beside"):
            kwargs["batch_size"] = job["batch"]
    if job["steps_per_epoch"]:
        kwargs["steps_per_epoch"] = job["steps_per_epoch"]
    if job["validation"] == "split":
        kwargs["validation_split"] = 0.2
    elif job["validation"] == "arrays":
        kwargs["validation_data"] = (_inputs(job, V4[:v], V3[:v], VTOKENS[:v]), _targets(job, VY[:v], VYR[:v]))
    if job["validation"] != "none":
        kwargs["validation_freq"] = job["validation_freq"]
        if job.get("validation_batch_size"):
            kwargs["validation_batch_size"] = job["validation_batch_size"]
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
    }[job["callback"]] + _extra_callbacks(job.get("extra_callback", "none"), out)
    return kwargs


class BatchLog(keras.callbacks.Callback):
    """What a callback reading every batch sees: the batch number and the logs' loss."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: List[List[float]] = []

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.seen.append([batch, round(float((logs or {}).get("loss", float("nan"))), 5)])


def _extra_callbacks(name: str, out: str) -> List[Any]:
    return {"none": [], "per_batch": [BatchLog()], "terminate_on_nan": [keras.callbacks.TerminateOnNaN()],
            "reduce_lr": [keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0, min_delta=0.05)],
            "backup_restore": [keras.callbacks.BackupAndRestore(os.path.join(out, "backup"))],
            "best_checkpoint": [keras.callbacks.ModelCheckpoint(os.path.join(out, "best.keras"), monitor="loss",
                                                                save_best_only=True)]}[name]


def train_job(job: Dict[str, Any], model: Any, fit: Any, out: str, copies: bool = False) -> Dict[str, Any]:
    """``fit(**arguments)`` (returns the history dict) once, or twice for a job that fits the model again (one more
    epoch, from epoch 0); the outcome of both. ``copies``: a PyDataset returns copies (see Batches)."""
    arguments = fit_arguments(job, out, copies)
    history = fit(**arguments)
    logs = [c.seen for c in arguments["callbacks"] if isinstance(c, BatchLog)]
    if job.get("fit_twice"):
        again = fit(**{**arguments, "epochs": 1, "initial_epoch": 0})
        history = {**history, **{f"again_{k}": v for k, v in again.items()}}
    return {**outcome(model, history, out), "batch_logs": logs}


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
    found += [f"{what}: {want[what]!r} != {got[what]!r}" for what in ("files", "batch_logs")
              if want[what] != got[what]]
    if not same_csv(want["csv"], got["csv"]):
        found.append(f"csv: {want['csv']!r} != {got['csv']!r}")
    return found


def same_csv(want: Any, got: Any) -> bool:
    """The CSVLogger files hold the same rows, numbers equal to the history's tolerance (the reference of a job
    under mirrored may run on one device: the last digits of a float differ)."""
    if want is None or got is None:
        return want == got
    rows = [[line.split(",") for line in text.splitlines()] for text in (want, got)]
    if len(rows[0]) != len(rows[1]) or any(len(a) != len(b) for a, b in zip(*rows)):
        return False

    def close(a: str, b: str) -> bool:
        try:
            return bool(np.isclose(float(a), float(b), rtol=1e-5, atol=1e-6))
        except ValueError:
            return a == b
    return all(close(a, b) for row_a, row_b in zip(*rows) for a, b in zip(row_a, row_b))


def main(seed: int, count: int, strategy: str = "default") -> None:
    rng = random.Random(seed)
    extras, forms = random.Random(seed + 1_000_003), random.Random(seed + 2_000_003)
    pipelines = random.Random(seed + 3_000_003)
    jobs = [draw(rng, extras, strategy, forms, pipelines) for _ in range(count)]
    keras_strategy = tf.distribute.get_strategy()
    if strategy == "mirrored":  # 2 virtual CPUs, set up without tfaccel (imported after the plain fits)
        (cpu,) = tf.config.list_physical_devices("CPU")
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        keras_strategy = tf.distribute.MirroredStrategy([d.name for d in tf.config.list_logical_devices("CPU")],
                                                        cross_device_ops=tf.distribute.ReductionToOneDevice())

    def plain(job: Dict[str, Any]) -> Any:
        def train(out: str) -> Dict[str, Any]:
            with reference_strategy(job, keras_strategy).scope():
                model = build(job)
            return train_job(job, model, lambda **arguments: model.fit(**arguments).history, out,
                             copies=strategy == "mirrored")
        return train

    references = [run(plain(job)) for job in jobs]
    import tfaccel

    for job, want in zip(jobs, references):
        def train(out: str, job: Dict[str, Any] = job) -> Dict[str, Any]:
            with tfaccel.scope(strategy=strategy, jit_compile=job["jit"]):
                model = build(job)
            loops = []

            def fit(**arguments: Any) -> Dict[str, List[float]]:
                result = tfaccel.fit(model, **arguments)
                loops.append(result.details.get("loop_name"))
                return result.history
            return {**train_job(job, model, fit, out), "loop": loops[0]}
        got = run(train)
        errors = [result.get("error", "")[:120] for result in (want, got)]
        print(json.dumps({"job": job, "loop": got.get("loop"), "differences": differences(want, got),
                          **({"errors": errors} if any(errors) else {})}), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:])
