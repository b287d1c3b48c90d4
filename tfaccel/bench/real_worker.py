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
import tensorflow as tf

import tfaccel
from tfaccel.bench.limit import LIMIT_CONTENDERS, train_step_loop
from tfaccel.bench.timing import Stopwatch
from tfaccel.real_suite import get_real_model


def _keras_strategy(path: str) -> Any:
    if path == "mirrored":
        return tf.distribute.MirroredStrategy([d.name for d in tf.config.list_logical_devices("CPU")])
    return tf.distribute.get_strategy()


def _train(spec: Any, size: str, path: str, contender: str, data: tuple, timer: Any) -> Dict[str, Any]:
    """Builds, compiles and fits the model once, ``timer`` seeing every epoch; returns what was chosen."""
    job = spec.job(size)
    keras.utils.set_random_seed(0)
    if contender in LIMIT_CONTENDERS:
        return train_step_loop(spec.build(size), data, batch=job.batch_size, epochs=job.epochs,
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
