"""``tfaccel bench``: how much faster tfaccel trains, measured side by side and timed alike.

Every contender trains a fresh model for N epochs in one call and is timed by ONE helper,
:meth:`tfaccel.bench.timing.Stopwatch.time`: throughput over the wall time of epochs 2..N (from a callback, or
the same hooks called by a hand-written loop), and ``time_to_train``, the whole call with building, tracing and
compilation. In every round all contenders of a figure run one after another, in a random order drawn from
(seed, figure, round) and recorded; each figure is a ratio per round, reported as ``{"median", "min", "max"}``.

* per model (``per_model``): ``p1`` compile_and_fit / naive ``fit``; ``p2`` / the faster hand-tuned ``fit``
  (cached tf.data, ``steps_per_execution`` 64, XLA on / off); ``p3`` / the faster hand-written whole-epoch loop
  (XLA on / off) -- :mod:`tfaccel.bench.speed`;
* ``p4_mwms``, ``p4_horovod``, ``p4_ceiling``, ``p4_mwms_of_ceiling``: weak scaling of 2 worker processes --
  :mod:`tfaccel.bench.scaling`;
* ``p6_stream``, ``p6_naive_stream``: training from TFRecord files / from memory -- :mod:`tfaccel.bench.stream`;
* ``p5_precision_xla``: precision and XLA "auto" / float32 without XLA, ResNet-50 on a GPU (``null`` with
  ``p5_skipped`` where not measured) -- :mod:`tfaccel.bench.precision`;
* ``time_to_train``: seconds per contender, by group.

Example:
    >>> from tfaccel.bench import BenchConfig, run_bench
    >>> report = run_bench(BenchConfig(repeats=1, scaling=False), json_path="bench.json")  # doctest: +SKIP
"""

from tfaccel._lazy import lazy_exports
from tfaccel.bench.config import TARGET_MODELS, TARGETS, BenchConfig

__all__ = ["BenchConfig", "TARGETS", "TARGET_MODELS", "run_bench", "format_report", "plot"]

# Lazily, so that ``tfaccel bench --help`` (which reads ``tfaccel.bench.config``) loads without TensorFlow.
_LAZY = {"run_bench": "tfaccel.bench.run", "format_report": "tfaccel.bench.report", "plot": "tfaccel.bench.report"}
__getattr__, __dir__ = lazy_exports("tfaccel.bench", globals(), _LAZY, __all__)
