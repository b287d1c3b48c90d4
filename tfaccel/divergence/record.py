"""One recorded run of ``tfaccel doctor``: K steps of the model's own ``train_step`` under one strategy.

Each step runs ``strategy.run(model.train_step, ...)`` inside one ``tf.function`` on a global batch that the
strategy splits over its replicas (as ``fit`` does), and the step's outputs are reduced with Keras' own
``reduce_per_replica``. Nothing of Keras' step is re-implemented: the only addition is a wrapper around the
optimizer's public ``apply_gradients`` that all-reduces the gradients it is given once more to read their global
norm and their non-finite count (the update itself is the optimizer's own, with the gradients unchanged).
"""

import dataclasses
import hashlib
from typing import Any, Callable, Dict, List, Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

from tfaccel.compat import keras_internals
from tfaccel.divergence.feed import (batch_size_of, distributed_batches, example_digests, gathered_batch,
                                     user_batches)
from tfaccel.divergence.sentinel import first_nonfinite_step, nan_origin

__all__ = ["StepFacts", "Trace", "record_run", "initial_values", "assign_values", "variable_names",
           "build_model"]


@dataclasses.dataclass
class StepFacts:
    """What one step left behind (floats are Python floats; None where the model has no such thing)."""

    step: int
    batch_size: int
    logs: Dict[str, float]
    grad_norm: Optional[float]
    nonfinite_grads: int
    iterations: int
    loss_scale: Optional[float]
    nonfinite_values: int
    replica_spread: float
    spread_variable: str
    examples: List[str] = dataclasses.field(default_factory=list)
    metric_states: Dict[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Trace:
    """A whole run: its facts per step and every variable's value after each step (``values[step][i]``)."""

    replicas: int
    strategy: str
    names: List[str]
    steps: List[StepFacts]
    values: List[List[np.ndarray]]
    nan: Optional[Dict[str, Any]] = None
    steps_per_epoch: Optional[int] = None
    source: str = "batches"  # or "dataset_fn": the run made its own pipelines

    def digest(self, step: int) -> str:
        """A short digest of every variable's bytes after ``step`` (equal digests: bit-identical weights)."""
        sha = hashlib.sha256()
        for value in self.values[step]:
            sha.update(np.ascontiguousarray(value).tobytes())
        return sha.hexdigest()[:12]

    def to_json(self) -> Dict[str, Any]:
        """The trace without the variables' values (those go to an ``.npz`` beside it)."""
        return {"replicas": self.replicas, "strategy": self.strategy, "names": self.names,
                "steps": [dataclasses.asdict(s) for s in self.steps], "nan": self.nan,
                "steps_per_epoch": self.steps_per_epoch, "source": self.source}


def build_model(model: Any, batch: Any) -> None:
    """Builds a Keras model on one batch as ``fit`` does before its first step (a custom loop's model is built by
    the loop's own code already)."""
    if isinstance(model, keras.Model):
        keras_internals.symbolic_build(model, batch)


def variable_names(model: Any) -> List[str]:
    """The model's variables' paths, in the order ``model.variables`` lists them."""
    return [getattr(v, "path", v.name) for v in model.variables]


def initial_values(model: Any) -> List[np.ndarray]:
    """Every model variable's value (weights, non-trainable statistics, random seed states), in order."""
    return [np.array(v.numpy()) for v in model.variables]


def assign_values(model: Any, values: Sequence[np.ndarray]) -> None:
    """Gives a second build of the same model the first build's values, by position (names differ per build).

    Raises:
        ValueError: the two builds do not have the same variables (shapes listed).
    """
    variables = model.variables
    shapes = [tuple(v.shape) for v in variables]
    if len(variables) != len(values) or any(s != tuple(np.shape(x)) for s, x in zip(shapes, values)):
        raise ValueError(f"doctor: the second build of the model has other variables than the first (received "
                         f"{len(variables)} variables {shapes[:5]}..., expected {len(values)}); build_and_compile "
                         "must build the same model every time it is called")
    for variable, value in zip(variables, values):
        variable.assign(value)


class _GradientProbe:
    """Wraps ``optimizer.apply_gradients`` to keep the global gradient norm and non-finite count of each step."""

    def __init__(self, optimizer: Any, strategy: Any) -> None:
        self.optimizer = optimizer
        with strategy.scope():
            first = tf.VariableAggregation.ONLY_FIRST_REPLICA
            self.norm = tf.Variable(0.0, trainable=False, aggregation=first)
            self.nonfinite = tf.Variable(0, trainable=False, aggregation=first)
        self.original = optimizer.apply_gradients
        optimizer.apply_gradients = self.apply_gradients

    def apply_gradients(self, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        pairs = list(grads_and_vars)
        grads = [tf.cast(g, tf.float32) for g, _ in pairs if g is not None]
        context = tf.distribute.get_replica_context()
        if grads and context is not None and context.num_replicas_in_sync > 1:
            grads = context.all_reduce(tf.distribute.ReduceOp.SUM, grads)
        if grads:
            scale = loss_scale_of(self.optimizer)
            flat = tf.concat([tf.reshape(g, [-1]) for g in grads], 0) / (1.0 if scale is None else scale)
            finite = tf.math.is_finite(flat)
            self.norm.assign(tf.norm(tf.where(finite, flat, tf.zeros_like(flat))))
            self.nonfinite.assign(tf.reduce_sum(tf.cast(tf.logical_not(finite), tf.int32)))
        return self.original(pairs, *args, **kwargs)

    def restore(self) -> None:
        """Puts the optimizer's own ``apply_gradients`` back."""
        self.optimizer.apply_gradients = self.original


def loss_scale_of(optimizer: Any) -> Optional[Any]:
    """A ``LossScaleOptimizer``'s current scale (a variable), or None for any other optimizer."""
    return getattr(optimizer, "dynamic_scale", None) if hasattr(optimizer, "inner_optimizer") else None


def _spread(strategy: Any, variables: Sequence[Any], names: Sequence[str]) -> tuple:
    """The largest difference between the replicas' copies of one variable, and that variable's name."""
    worst, where = 0.0, ""
    for variable, name in zip(variables, names):
        copies = [np.asarray(c.numpy(), dtype=np.float64) for c in strategy.experimental_local_results(variable)]
        if len(copies) > 1 and copies[0].size and copies[0].dtype.kind == "f":
            gap = max(float(np.max(np.abs(c - copies[0]))) for c in copies[1:])
            if gap > worst or (np.isnan(gap) and not np.isnan(worst)):
                worst, where = gap, name
    return worst, where


def record_run(model: Any, batches: Sequence[Any], *, strategy: Any, start: Optional[Sequence[np.ndarray]] = None,
               label: str = "", sentinel: bool = False, dataset_fn: Optional[Callable[[Any], Any]] = None,
               steps_per_epoch: Optional[int] = None) -> Trace:
    """Trains ``model`` (compiled under ``strategy``) on ``batches``, one step each, and records every step.

    Args:
        model: the user's compiled model, built under ``strategy``'s scope.
        batches: the global batches (``(x, y[, sample_weight])``, each part arrays or nested arrays), the same for
            every run compared.
        strategy: the ``tf.distribute`` strategy the model was built under.
        start: every variable's initial value (from :func:`initial_values` of another build), or None.
        label: the strategy's name for the report.
        sentinel: find the first step with a NaN/Inf and the first layer that produced it (``Trace.nan``).
        dataset_fn: the user's ``dataset_fn(input_context)``: the run is fed by it under ``strategy`` instead of
            ``batches`` (which then only build the model), and records the examples each step trained on.
        steps_per_epoch: the job's steps per epoch, if known (the metric accumulators' growth is read against it).

    The step's logs are Keras ``fit``'s: the step's outputs, with every metric read after the step in
    cross-replica context as ``fit`` reads them.
    """
    with strategy.scope():  # a subclassed model makes its variables here: they must be the strategy's
        build_model(model, batches[0])
    if start is not None:
        assign_values(model, start)
    start = initial_values(model)
    probe = _GradientProbe(model.optimizer, strategy)
    step_fn = tf.function(reduce_retracing=True, func=lambda batch: keras_internals.reduce_per_replica(
        strategy.run(model.train_step, args=(batch,)), strategy))
    names, variables = variable_names(model), model.variables
    feed = distributed_batches(strategy, batches) if dataset_fn is None else user_batches(strategy, dataset_fn)
    steps, values, seen = [], [], []
    try:
        for index in range(len(batches)):
            batch = next(feed)
            seen.append(batches[index] if dataset_fn is None else gathered_batch(strategy, batch))
            logs = dict(step_fn(batch))
            # fit's logs: the metrics read in cross-replica context (a sum over the replicas' on-read variables),
            # which the step's own outputs (one replica's view under "auto" reduction) are not.
            logs.update(model.get_metrics_result())
            steps.append(_facts(model, strategy, index, seen[-1], logs, probe, variables, names))
            values.append([np.array(v.numpy()) for v in variables])
    finally:
        probe.restore()
    trace = Trace(strategy.num_replicas_in_sync, label, names, steps, values, steps_per_epoch=steps_per_epoch,
                  source="batches" if dataset_fn is None else "dataset_fn")
    if sentinel:
        bad = first_nonfinite_step(steps)
        trace.nan = {"step": None, "layer": None, "what": f"no NaN/Inf in {len(steps)} steps"} if bad is None else \
            nan_origin(model, values[bad - 1] if bad else start, seen[bad], bad)
    return trace


def _metric_states(model: Any) -> Dict[str, float]:
    """Each float metric accumulator's largest magnitude (inf when it holds a NaN/Inf), read as ``fit`` reads it."""
    found = {}
    for metric in model.metrics:
        for variable in metric.variables:
            value = np.asarray(variable.numpy())
            if value.size and np.issubdtype(value.dtype, np.floating):
                found[getattr(variable, "path", None) or variable.name] = \
                    float(np.max(np.abs(value))) if np.all(np.isfinite(value)) else float("inf")
    return found


def _facts(model: Any, strategy: Any, index: int, batch: Any, logs: Dict[str, Any], probe: _GradientProbe,
           variables: Sequence[Any], names: Sequence[str]) -> StepFacts:
    scale = loss_scale_of(model.optimizer)
    arrays = [np.asarray(v.numpy()) for v in variables]
    nonfinite = sum(int(np.sum(~np.isfinite(a))) for a in arrays if np.issubdtype(a.dtype, np.floating))
    spread, where = _spread(strategy, variables, names)
    return StepFacts(step=index, batch_size=batch_size_of(batch),
                     logs={k: float(np.asarray(v).mean()) for k, v in logs.items() if np.asarray(v).size},
                     grad_norm=float(probe.norm.numpy()), nonfinite_grads=int(probe.nonfinite.numpy()),
                     iterations=int(model.optimizer.iterations.numpy()),
                     loss_scale=None if scale is None else float(scale.numpy()), nonfinite_values=nonfinite,
                     replica_spread=spread, spread_variable=where, examples=list(example_digests(batch)),
                     metric_states=_metric_states(model))
