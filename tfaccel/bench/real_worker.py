"""One contender of ``tfaccel bench --suite real``, in a process of its own (one strategy per process).

    python -m tfaccel.bench.real_worker MODEL SIZE PATH CONTENDER

MODEL: a :data:`tfaccel.real_suite.REAL_MODEL_NAMES` name; SIZE: ``test`` or ``bench``; PATH: ``default``,
``mirrored`` (2 virtual CPUs) or ``multi_worker`` (run under TF_CONFIG); CONTENDER: ``keras`` (plain ``model.fit``,
with the strategy a user would build by hand), ``tfaccel`` (``tfaccel.scope`` + ``tfaccel.fit``, every option at
"auto"), or ``limit_xla`` / ``limit_noxla`` (``default`` only: the limit, a hand-written loop running each epoch's
whole batches in one ``tf.function`` ``tf.while_loop`` calling the model's own ``train_step``, XLA on / off). The
job is timed by :class:`tfaccel.bench.timing.Stopwatch`; the last line printed is the JSON result.
"""

import json
import sys
from typing import Any, Dict, List

import keras
import numpy as np
import tensorflow as tf

import tfaccel
from tfaccel.bench.timing import Stopwatch
from tfaccel.compat.keras_internals import symbolic_build
from tfaccel.real_suite import get_real_model

LIMIT_CONTENDERS = {"limit_xla": True, "limit_noxla": False}  # name -> jit_compile


def _keras_strategy(path: str) -> Any:
    if path == "mirrored":
        return tf.distribute.MirroredStrategy([d.name for d in tf.config.list_logical_devices("CPU")])
    return tf.distribute.get_strategy()


def _limit(model: Any, data: tuple, *, batch: int, epochs: int, jit: bool, timer: Any) -> Dict[str, Any]:
    """The limit: each epoch's whole batches in one ``tf.while_loop`` calling ``model.train_step`` (Keras' loss,
    metrics and optimizer), the data on the device, no ``fit`` around it (the partial last batch is dropped)."""
    xs, ys = tf.nest.map_structure(tf.constant, data[0]), tf.constant(data[1])
    examples = len(data[1])
    steps = examples // batch

    def batch_at(idx: Any) -> tuple:
        return tf.nest.map_structure(lambda t: tf.gather(t, idx), xs), tf.gather(ys, idx)

    symbolic_build(model, batch_at(tf.range(batch)))  # the optimizer slots and metrics, before the loop traces

    @tf.function(jit_compile=jit)
    def epoch(order: Any) -> Any:
        def body(i: Any) -> Any:
            model.train_step(batch_at(tf.slice(order, [i * batch], [batch])))  # not order[i*b:...]: slow under XLA
            return (i + 1,)

        tf.while_loop(lambda i: i < steps, body, (tf.constant(0),))
        return model.get_metrics_result()

    rng = np.random.default_rng(0)
    for e in range(epochs):
        timer.on_epoch_begin(e)
        model.reset_metrics()
        logs = epoch(tf.constant(rng.permutation(examples)[:steps * batch].astype(np.int32)))
        timer.on_epoch_end(e, logs)
    return {"jit_compile": jit, "loop": "hand-written whole-epoch tf.while_loop calling model.train_step"}


def _train(spec: Any, size: str, path: str, contender: str, data: tuple, timer: Any) -> Dict[str, Any]:
    """Builds, compiles and fits the model once, ``timer`` seeing every epoch; returns what was chosen."""
    job = spec.job(size)
    keras.utils.set_random_seed(0)
    if contender in LIMIT_CONTENDERS:
        return _limit(spec.build(size), data, batch=job.batch_size, epochs=job.epochs,
                      jit=LIMIT_CONTENDERS[contender], timer=timer)
    fit = dict(x=data[0], y=data[1], batch_size=job.batch_size, epochs=job.epochs, verbose=0, callbacks=[timer])
    if contender == "keras":
        with _keras_strategy(path).scope():
            model = spec.build(size)
        model.fit(**fit)
        return {"jit_compile": bool(model.jit_compile), "loop": "keras model.fit"}

    with tfaccel.scope(strategy=path):
        model = spec.build(size)
    result = tfaccel.fit(model, seed=0, **fit)
    return {"jit_compile": bool(model.jit_compile), "loop": result.details.get("loop"),
            "steps_per_execution": result.details.get("steps_per_execution"), "xla": result.details.get("jit_compile")
            or f"{result.plan.jit_compile} ({result.plan.jit_reason})",
            "xla_auto": result.details.get("xla_auto")}


def main(argv: List[str]) -> int:
    """Runs one contender and prints its timing as the last line (JSON)."""
    name, size, path, contender = argv

    if path == "mirrored":
        tfaccel.configure_devices(virtual_cpus=2)

    spec = get_real_model(name)
    data = spec.data(size)
    stopwatch = Stopwatch()
    timing = stopwatch.time(contender, lambda timer: _train(spec, size, path, contender, data, timer),
                            examples_per_epoch=len(data[1]), epochs=spec.job(size).epochs)
    sys.stdout.write(json.dumps({"examples_per_sec": timing.examples_per_sec, "time_to_train": timing.time_to_train,
                                 "epoch_seconds": timing.epoch_seconds, "details": timing.details,
                                 "timed": stopwatch.timed}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
