"""P1-P3: compile_and_fit against Keras' naive fit, the best hand-tuned fit, and a hand-written whole-epoch loop.

Every contender trains a fresh model for ``epochs`` epochs in one call, timed by :class:`tfaccel.bench.timing.
Stopwatch` (epochs 2..N, plus the whole call as ``time_to_train``), in a random order each round.

* ``compile_and_fit``: tfaccel's defaults on one device (the compiled whole-epoch loop ``tfaccel.fit`` uses,
  running the model's own ``train_step``, and tfaccel's XLA decision).
* ``naive``: ``model.fit(x, y)`` with Keras' defaults (batch 32).
* ``hand_tuned_xla`` / ``hand_tuned_noxla``: cached, prefetched ``tf.data`` at the same batch,
  ``steps_per_execution=64``, ``jit_compile`` on / off; P2 takes the faster of the two each round.
* ``limit_xla`` / ``limit_noxla``: the same compiled model's own ``train_step`` (its loss, metrics and optimizer)
  in a hand-written loop running a whole epoch in one ``tf.function`` (:mod:`tfaccel.bench.limit`, as the real
  suite's limit), with XLA on / off; P3 takes the faster (XLA:CPU runs convolutions several times slower than
  TensorFlow's kernels). Until 2026-11-29 this loop ran a bare ``GradientTape`` step without the metrics the other
  contenders compute (measured about 5% of the CNN's step), so older P3 figures compare with less work.
"""

from typing import Any, Callable, Dict

import numpy as np
import tensorflow as tf

from tfaccel.bench.config import BenchConfig, contender_rows, summary
from tfaccel.bench.limit import train_step_loop
from tfaccel.bench.timing import Stopwatch, run_rounds
from tfaccel.models import get_model_builder
from tfaccel.train.api import compile_and_fit

__all__ = ["SPEED_CONTENDERS", "measure_speedups"]

SPEED_CONTENDERS = ("compile_and_fit", "naive", "hand_tuned_xla", "hand_tuned_noxla", "limit_xla", "limit_noxla")

Train = Callable[[Any], Dict[str, Any]]


def model_data(n: int) -> tuple:
    """MNIST-size inputs with learnable labels (a fixed random linear map)."""
    rng = np.random.default_rng(0)
    x = rng.random((n, 28, 28, 1), dtype=np.float32)
    w = rng.standard_normal((28 * 28, 10)).astype(np.float32)
    return x, np.argmax(x.reshape(n, -1) @ w, axis=1).astype(np.int32)


def builder(model_name: str) -> Callable[[], Any]:
    """``() -> keras.Model`` for one of ``tfaccel.models``' reference models on 28x28x1 inputs, 10 classes."""
    build = get_model_builder(model_name)
    return lambda: build(input_shape=(28, 28, 1), num_classes=10)


def _compile(model: Any, **options: Any) -> Any:
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"], **options)
    return model


def _compile_and_fit(build: Callable, x: Any, y: Any, epochs: int, batch: int) -> Train:
    def train(timer: Any) -> Dict[str, Any]:
        result = compile_and_fit(build, (x, y), epochs=epochs, global_batch_size=batch, strategy="default",
                                 loss="sparse_categorical_crossentropy", metrics=["accuracy"], verbose=0, seed=0,
                                 callbacks=[timer])
        return {"plan": result.plan.summary(), **{k: str(v) for k, v in result.details.items() if k != "seed"}}

    return train


def _naive(build: Callable, x: Any, y: Any, epochs: int) -> Train:
    def train(timer: Any) -> Dict[str, Any]:
        _compile(build()).fit(x, y, epochs=epochs, verbose=0, callbacks=[timer])
        return {"loop": "Keras fit, Keras defaults (batch 32, steps_per_execution 1)"}

    return train


def _hand_tuned(build: Callable, x: Any, y: Any, epochs: int, batch: int, jit: bool) -> Train:
    def train(timer: Any) -> Dict[str, Any]:
        model = _compile(build(), steps_per_execution=64, jit_compile=jit)
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=0).batch(batch).cache().prefetch(
            tf.data.AUTOTUNE)
        model.fit(ds, epochs=epochs, verbose=0, callbacks=[timer], shuffle=False)  # shuffled once, then cached
        return {"loop": "Keras fit, cached tf.data, steps_per_execution 64", "jit_compile": jit}

    return train


def _limit(build: Callable, x: Any, y: Any, epochs: int, batch: int, jit: bool) -> Train:
    """The limit (:mod:`tfaccel.bench.limit`): the same compiled model's ``train_step`` in a hand-written loop."""

    def train(timer: Any) -> Dict[str, Any]:
        return train_step_loop(_compile(build()), (x, y), batch=batch, epochs=epochs, jit=jit, timer=timer)

    return train


def _contenders(build: Callable, x: Any, y: Any, config: BenchConfig) -> Dict[str, Train]:
    e, b = config.epochs, config.batch
    return {"compile_and_fit": _compile_and_fit(build, x, y, e, b), "naive": _naive(build, x, y, e),
            "hand_tuned_xla": _hand_tuned(build, x, y, e, b, True),
            "hand_tuned_noxla": _hand_tuned(build, x, y, e, b, False),
            "limit_xla": _limit(build, x, y, e, b, True), "limit_noxla": _limit(build, x, y, e, b, False)}


def _ratios(row: Dict[str, float]) -> Dict[str, float]:
    cf = row["compile_and_fit"]
    return {"p1": cf / row["naive"], "p2": cf / max(row["hand_tuned_xla"], row["hand_tuned_noxla"]),
            "p3": cf / max(row["limit_xla"], row["limit_noxla"])}


def _time_to_train_ratio(timings: Dict[str, Any]) -> float:
    """P3 in time-to-train (one round): the faster limit's whole call / compile_and_fit's (above 1: tfaccel first)."""
    limit = min(timings["limit_xla"]["time_to_train"], timings["limit_noxla"]["time_to_train"])
    return limit / timings["compile_and_fit"]["time_to_train"]


def measure_model(name: str, config: BenchConfig, stopwatch: Stopwatch) -> Dict[str, Any]:
    """P1-P3 of one model: every contender in every round, in a random order, ratios per round."""
    x, y = model_data(config.examples)
    contenders = _contenders(builder(name), x, y, config)
    rounds = run_rounds(contenders, stopwatch=stopwatch, config=config, group=name, examples_per_epoch=len(x))
    eps = [{c: r["timings"][c]["examples_per_sec"] for c in contenders} for r in rounds]
    ratios = [_ratios(row) for row in eps]
    last = rounds[-1]["timings"]
    return {"p1": summary([q["p1"] for q in ratios]), "p2": summary([q["p2"] for q in ratios]),
            "p3": summary([q["p3"] for q in ratios]),
            "p3_time_to_train": summary([_time_to_train_ratio(r["timings"]) for r in rounds]),
            "examples_per_sec": contender_rows(rounds, "examples_per_sec"),
            "time_to_train": contender_rows(rounds, "time_to_train"),
            "cpu_per_wall": contender_rows(rounds, "cpu_per_wall"),
            "order": [r["order"] for r in rounds], "global_batch_size": config.batch,
            "details": {c: last[c]["details"] for c in contenders}}


def measure_speedups(config: BenchConfig, stopwatch: Stopwatch) -> Dict[str, Any]:
    """P1-P3 for every model of ``config.models``."""
    return {name: measure_model(name, config, stopwatch) for name in config.models}
