"""``tfaccel.doctor``: train the same model on one replica and on N, and say where and why they part."""

import dataclasses
import math
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from tfaccel.divergence.causes import Cause, diagnose, model_structure
from tfaccel.divergence.compare import EXAMPLES, Verdict, compare, tolerance_for
from tfaccel.divergence.plot import plot_report
from tfaccel.divergence.record import Trace, build_model, initial_values, record_run
from tfaccel.errors import ConfigError
from tfaccel.strategies import get_strategy
from tfaccel.train.data import FitData, example_order, prepare_data

__all__ = ["DoctorReport", "Feed", "doctor", "global_batches", "check_steps"]

DEFAULT_STEPS = 5


@dataclasses.dataclass
class DoctorReport:
    """The doctor's answer: the verdict, the likely causes (most specific first) and both runs' traces."""

    verdict: Verdict
    causes: List[Cause]
    single: Trace
    many: Trace

    @property
    def equal(self) -> bool:
        """True when the runs are equal to rounding at every step."""
        return self.verdict.equal

    @property
    def ok(self) -> bool:
        """True when the runs are equal to rounding and neither has a problem of its own (``causes`` is empty)."""
        return self.verdict.equal and not self.causes

    def to_json(self) -> Dict[str, Any]:
        """The report as plain data (``tfaccel doctor --json``): verdict, causes, both runs' steps."""
        return {"equal": self.equal, "ok": self.ok, "verdict": self.verdict.to_json(),
                "causes": [dataclasses.asdict(c) for c in self.causes],
                "runs": [self.single.to_json(), self.many.to_json()]}

    def plot(self, path: str) -> None:
        """Writes a PNG of the loss and the global gradient norm per step, both runs, the parting step marked.

        Raises:
            ConfigError: matplotlib (the ``doctor`` extra) is not installed, or ``path`` cannot be written.
        """
        plot_report(self.to_json(), path)

    def summary(self) -> str:
        """A readable summary: what ran, whether and where the runs part, the likely causes and their fixes."""
        v, tol = self.verdict, self.verdict.tolerance
        fed = "same global batches" if self.single.source == "batches" else "each run reading the dataset_fn"
        lines = [f"tfaccel doctor: {v.steps} steps on 1 replica ({self.single.strategy}) and "
                 f"{self.many.replicas} replicas ({self.many.strategy}), same initial weights, {fed}",
                 "  step  batch  loss (1 | N)                gradient norm (1 | N)       max |w1-wN|"]
        for row in v.rows:
            lines.append(f"  {row['step']:>4}  {row['batch_size']:>5}  {_pair(row['loss']):<26}  "
                         f"{_pair(row['grad_norm']):<26}  {row['max_variable_difference']:.3g}")
        lines += [f"NaN/Inf sentinel, {t.replicas} replica{'s' if t.replicas > 1 else ''}: "
                  + (t.nan["what"] if t.nan["step"] is None else f"first at step {t.nan['step']}: {t.nan['what']}")
                  for t in (self.single, self.many) if t.nan]
        if v.equal:
            lines.append(f"equal to rounding (rtol={tol.rtol:g}, atol={tol.atol:g}: {tol.why})")
            if self.causes:
                lines.append("but a run has a problem of its own:")
        else:
            lines += self._parting()
        causes = self.causes or ([] if v.equal else [Cause(
            "unknown", "no catalogued cause matches these facts",
            "compare the parting quantity's computation on 1 and N replicas")])
        for cause in causes:
            lines += [f"likely cause: {cause.name}: {cause.evidence}", f"  fix: {cause.fix}"]
        return "\n".join(lines)

    def _parting(self) -> List[str]:
        v, first = self.verdict, self.verdict.first
        if first.quantity == EXAMPLES:
            what = (f": {first.difference:g} of the {first.single} examples on 1 replica are not among the "
                    f"{first.replicas} on {self.many.replicas}")
        elif isinstance(first.single, (int, float)) and isinstance(first.replicas, (int, float)):
            what = f" = {first.single:.6g} on 1 replica, {first.replicas:.6g} on {self.many.replicas}"
        else:
            what = f" differs by {first.difference:.3g}"
        lines = [f"the runs part at step {first.step}: {first.quantity}{what} "
                 f"(rtol={v.tolerance.rtol:g}, atol={v.tolerance.atol:g})"]
        others = [p.quantity for p in v.parts[1:6]]
        if others:
            lines.append(f"  also parting at that step: {', '.join(others)}" + (" ..." if len(v.parts) > 6 else ""))
        return lines


def _pair(values: Sequence[Optional[float]]) -> str:
    return " | ".join("-" if x is None else f"{x:.6g}" for x in values)


def check_steps(steps: Any) -> int:
    """``steps`` as a whole number >= 1.

    Raises:
        ConfigError: anything else.
    """
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ConfigError(f"doctor: steps must be a whole number >= 1; received {steps!r}")
    return int(steps)


@dataclasses.dataclass(frozen=True)
class Feed:
    """What feeds the runs compared: the global batches (the same for every run), or the user's own
    ``dataset_fn(input_context)`` (each run makes its own pipelines from it; ``batches`` are then what it yields
    to one replica, and only build the model), and the job's steps per epoch when known."""

    batches: List[Any]
    dataset_fn: Optional[Callable[[Any], Any]]
    steps_per_epoch: Optional[int]


def global_batches(data: FitData, steps: int) -> Feed:
    """The first ``steps`` global batches of ``fit``'s example order (epoch after epoch, partial last batches
    kept), of a batched ``tf.data.Dataset`` as it yields them, or of a ``dataset_fn`` called for one replica.

    Each batch is ``(x, y[, sample_weight])`` with each part as nested as ``fit`` was given it (a dict of arrays
    for a multi-input model), its leaves NumPy arrays.

    Raises:
        ConfigError: data of another kind, or a dataset with fewer than ``steps`` batches.
    """
    if data.kind == "distributed" and not callable(data.x):
        raise ConfigError("doctor: x is a tf.distribute.DistributedDataset, which one strategy made; give fit the "
                          "dataset_fn(input_context) that makes it, so that each run makes its own")
    if data.kind in ("dataset", "distributed"):
        dataset = data.x if data.kind == "dataset" else data.x(tf.distribute.InputContext())
        found = [tuple(b) if isinstance(b, tuple) else (b,) for b in dataset.take(steps).as_numpy_iterator()]
        if len(found) < steps:
            raise ConfigError(f"doctor: the dataset has {len(found)} batches; steps={steps} needs as many")
        known = int(dataset.cardinality()) if data.kind == "dataset" else data.steps_per_epoch
        return Feed(found, data.x if data.kind == "distributed" else None, known if known and known > 0 else None)
    if data.kind != "arrays":
        raise ConfigError(f"doctor: data must be arrays, a batched tf.data.Dataset or a dataset_fn(input_context); "
                          f"received {data.what}")
    parts = tf.nest.map_structure(np.asarray, tuple(p for p in (data.x, data.y, data.sample_weight) if p is not None))
    n, batch = data.num_examples, data.batch_size
    per_epoch = math.ceil(n / batch)
    found = []
    for epoch in range(math.ceil(steps / per_epoch)):
        order = example_order(n, data.seed, epoch, data.shuffle)
        found += [tf.nest.map_structure(lambda p, rows=order[s:s + batch]: p[rows], parts) for s in range(0, n, batch)]
    return Feed(found[:steps], None, per_epoch)


def _mirrored(strategy: str) -> Any:
    replicated = get_strategy(strategy)
    if replicated.num_replicas_in_sync < 2:
        raise ConfigError(
            f"doctor: strategy {strategy!r} has {replicated.num_replicas_in_sync} replica here; the doctor compares "
            "1 replica with N >= 2. Call tfaccel.configure_devices(virtual_cpus=2) before TensorFlow starts (first "
            "thing in the script), or run `tfaccel doctor -- python train.py`, which does it for you")
    return replicated


def doctor(build_and_compile: Callable[[], Any], data: Any, *, steps: int = DEFAULT_STEPS,
           strategy: str = "mirrored", batch_size: Optional[int] = None, seed: int = 0, shuffle: Any = True,
           rtol: Optional[float] = None, nan: bool = False, steps_per_epoch: Optional[int] = None) -> DoctorReport:
    """Trains ``build_and_compile()``'s model for ``steps`` steps on 1 replica and on N, and compares them.

    Both runs start from the first build's initial weights (every variable: weights, statistics, seed states)
    and take the same global batches (``fit``'s seeded example order); each step is the model's own
    ``train_step``. The N-replica run uses ``tfaccel.get_strategy(strategy)``, which needs N devices made before
    TensorFlow starts: GPUs, or ``tfaccel.configure_devices(virtual_cpus=N)`` first thing in the process.

    Args:
        build_and_compile: returns a new compiled Keras model on each call (called once per run).
        data: ``x``, ``(x, y)`` or ``(x, y, sample_weight)`` arrays (or dicts of arrays), a batched
            ``tf.data.Dataset``, or a ``dataset_fn(input_context)`` (each run makes its own pipelines from it, as
            ``tfaccel.fit`` does, so a pipeline that does not shard shows).
        steps: training steps to compare. Defaults to 5.
        strategy: the N-replica strategy's registry name. Defaults to ``"mirrored"``.
        batch_size: the global batch for arrays. Defaults to Keras' 32.
        seed: the seed of the example order. Defaults to 0.
        shuffle: Keras' ``shuffle``. Defaults to True.
        rtol: the relative tolerance; defaults to one chosen from the model's dtype and ``steps`` (the report
            says which and why).
        nan: also find, in each run, the first step with a NaN/Inf and the first layer that produced it.
            Defaults to False.
        steps_per_epoch: the job's steps per epoch with a ``dataset_fn`` (metric accumulators are projected over
            an epoch). Defaults to None.

    Returns:
        A :class:`DoctorReport` (``report.equal``, ``report.summary()``, ``report.to_json()``).

    Raises:
        ConfigError: bad ``steps``/data, or fewer than 2 replicas for ``strategy``.

    Example:
        >>> report = tfaccel.doctor(build, (x, y), steps=3)  # doctest: +SKIP
        >>> print(report.summary())  # doctest: +SKIP
    """
    steps = check_steps(steps)
    replicated = _mirrored(strategy)
    x, y, sw = (tuple(data) + (None, None))[:3] if isinstance(data, tuple) else (data, None, None)
    # K steps are all the doctor takes; a dataset_fn's own length is not known (prepare_data asks for one)
    feed = global_batches(prepare_data(x, y, sample_weight=sw, batch_size=batch_size, seed=seed, shuffle=shuffle,
                                       steps_per_epoch=steps_per_epoch or steps), steps)
    default = tf.distribute.get_strategy()
    with default.scope():
        first = build_and_compile()
    build_model(first, feed.batches[0])
    start = initial_values(first)
    options = {"sentinel": nan, "dataset_fn": feed.dataset_fn, "steps_per_epoch": feed.steps_per_epoch}
    single = record_run(first, feed.batches, strategy=default, label="default", **options)
    structure = model_structure(first)
    with replicated.scope():
        second = build_and_compile()
    many = record_run(second, feed.batches, strategy=replicated, start=start, label=strategy, **options)
    verdict = compare(single, many, tolerance_for(structure["dtype"], steps, rtol))
    return DoctorReport(verdict, diagnose(verdict, single, many, structure), single, many)
