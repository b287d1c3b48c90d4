"""The parameter-server step: Keras' ``train_step`` for one worker, the closures the coordinator schedules, and
what must be built on the ps tasks before the first of them (see ``tfaccel.train.loops.coordinator``).
"""

import inspect
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import keras
import numpy as np
import tensorflow as tf

from tfaccel.compat import keras_internals, keras_sharded
from tfaccel.errors import ConfigError
from tfaccel.train.data import FitData, example_order
from tfaccel.train.loops.base import gather_batch, step_data
from tfaccel.train.loops.ps_input import sharded_dataset_iterator, worker_index_iterator

__all__ = ["STEPS_PER_CLOSURE", "WHY_NO_METRIC_OBJECTS", "exact_assign_add", "leaf_metrics", "check_metrics",
           "Accounting", "WorkerStep", "closure_spans", "closure_batches", "Schedule", "build_on_ps"]

# Optimizer updates per scheduled closure: fewer RPC round-trips, still fine-grained enough to spread over workers.
STEPS_PER_CLOSURE = 8
WHY_NO_METRIC_OBJECTS = "Keras metric objects miscount in functions scheduled on parameter-server workers"


def exact_assign_add(variable: Any) -> None:
    """Makes a Keras 3 variable's ``assign_add`` the atomic TensorFlow one (see module docstring)."""
    raw = getattr(variable, "value", variable)
    if not isinstance(variable, keras.Variable):
        return

    def assign_add(value: Any) -> Any:
        return raw.assign_add(value)

    object.__setattr__(variable, "assign_add", assign_add)


def leaf_metrics(metrics: Sequence[Any]) -> List[Any]:
    out = []
    for metric in metrics:
        inner = getattr(metric, "metrics", None)  # Keras' CompileMetrics: a container of the compiled metrics
        if isinstance(inner, list) and all(isinstance(m, keras.metrics.Metric) for m in inner):
            out += leaf_metrics(inner)
        else:
            out.append(metric)
    return out


def check_metrics(model: Any) -> None:
    for metric in leaf_metrics(model.metrics):
        if not isinstance(metric, (keras.metrics.Mean, keras.metrics.Sum)):
            raise ConfigError(
                f"metrics: {type(metric).__name__} (name {metric.name!r}) cannot be computed under strategy "
                f"parameter_server: {WHY_NO_METRIC_OBJECTS}, so tfaccel adds up per-batch totals on the coordinator, "
                f"which gives the result only of mean metrics (accuracy variants, mae, mse, ... any keras.metrics."
                f"MeanMetricWrapper). Compile without it and compute it after training with model.evaluate, or train "
                "with another strategy")


class Accounting:
    """What the workers did, counted on the ps tasks (where a lost worker cannot take the counts with it).

    A closure that was running on a lost worker is run again in full elsewhere, and the updates it had already
    applied stay applied: ClusterCoordinator is at-least-once. So the loop counts instead of assuming: every update
    adds 1 and its examples to the counters of the worker that applied it once the update has run, and every
    closure adds 1 to ``started`` before its first update. The count is not atomic with the update: a worker
    killed between the two leaves one update applied (``optimizer.iterations`` has it) but not counted. A worker's
    updates and examples are one variable written by one op, so a kill never counts an update without its examples
    (two variables were written by two ops the ps ran apart: a SIGKILLed worker once left an update counted whose
    examples were not).
    """

    def __init__(self, num_workers: int) -> None:
        def counter(name: str, shape: tuple = ()) -> Any:
            return tf.Variable(tf.zeros(shape, tf.int64), trainable=False, name=name)

        self.num_workers = num_workers
        self.started = counter("tfaccel_closures_started")
        # [updates, examples] of each worker
        self.work = [counter(f"tfaccel_work_worker_{k}", (2,)) for k in range(num_workers)]

    def count(self, worker: Any, examples: Any) -> Any:
        """One update of ``examples`` examples applied by worker ``worker`` (inside a scheduled function); returns
        a tensor that exists once the worker's counter is written."""
        def on(k: int) -> Callable[[], Any]:
            def add() -> Any:
                self.work[k].assign_add(tf.stack([tf.constant(1, tf.int64), tf.cast(examples, tf.int64)]))
                return tf.constant(0)
            return add

        return tf.switch_case(worker, [on(k) for k in range(self.num_workers)])

    def read(self) -> Dict[str, Any]:
        """The counters now (read on the coordinator)."""
        work = [v.numpy() for v in self.work]
        return {"started": int(self.started.numpy()), "updates": [int(w[0]) for w in work],
                "examples": [int(w[1]) for w in work]}

    @staticmethod
    def report(before: Dict[str, Any], after: Dict[str, Any], *, closures: int, updates: int,
               applied: int) -> Dict[str, Any]:
        """``details["ps_accounting"]`` of one run: what was scheduled, applied (``applied``: the optimizer's own
        count) and counted per worker with its examples; a worker lost between applying an update and counting it
        leaves that update in ``updates_not_counted`` (at most one per lost worker)."""
        per_worker = {f"worker:{k}": a - b for k, (a, b) in enumerate(zip(after["updates"], before["updates"]))}
        seen = {f"worker:{k}": a - b for k, (a, b) in enumerate(zip(after["examples"], before["examples"]))}
        started = after["started"] - before["started"]
        return {"updates_scheduled": updates, "updates_applied": applied, "updates_counted_per_worker": per_worker,
                "updates_not_counted": applied - sum(per_worker.values()), "examples_seen": seen,
                "examples_seen_total": sum(seen.values()), "closures_scheduled": closures,
                "closures_started": started, "closures_rerun": max(0, started - closures)}


class WorkerStep:
    """Keras' train_step for one worker, with the metric updates returned as totals instead of applied."""

    def __init__(self, model: Any, *, backend: Any, accum: int) -> None:
        self.model, self.strategy, self.accum = model, backend.strategy, accum
        self.optimizer = model.optimizer
        self.call_training = "training" in inspect.signature(model.call).parameters
        self.loss_training = "training" in inspect.signature(model.compute_loss).parameters
        seen: Dict[int, Any] = {}
        for metric in model.metrics:
            seen.update((id(v), v) for v in metric.variables)
        self.metric_variables = list(seen.values())
        self.state_variables = [v for v in model.variables if id(v) not in seen]
        # Keras 3.15 keeps the "loss" Mean in a private attribute (tfaccel.compat.keras_internals); its train_step
        # updates it with the batch size as weight. There is no public handle on it.
        self.loss_tracker = keras_internals.loss_tracker(model)
        with backend.scope():  # on the ps tasks: they outlive a lost worker
            self.steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="tfaccel_steps")
            self.accounting = Accounting(max(1, int(backend.num_workers)))

    def forward(self, batch: Any) -> tuple:
        """(scaled loss, metric totals) of one batch; layer state updates (BatchNorm, seeds) applied."""
        model = self.model
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
        # Metric variables start at zero; the weights are read once here, inside the caller's tape (Keras reads
        # the regularised weights from the scope's mapping).
        mapping = [(v, tf.zeros(v.shape, v.dtype)) for v in self.metric_variables]
        mapping += [(v, v) for v in model.trainable_variables if keras_sharded.sharded_value(v) is None]
        with keras.StatelessScope(state_mapping=mapping, collect_losses=True) as scope:
            y_pred = model(x, training=True) if self.call_training else model(x)
            kwargs = {"training": True} if self.loss_training else {}
            loss = model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, **kwargs)
            if self.loss_tracker is not None:
                replicas = tf.distribute.get_strategy().num_replicas_in_sync  # Keras' unscale_loss_for_distribution
                first = next(t for t in tf.nest.flatten(x) if t is not None)
                self.loss_tracker.update_state(loss * replicas if replicas > 1 else loss,
                                               sample_weight=tf.shape(first)[0])
            model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
        for variable in self.state_variables:  # what the forward pass changed outside the metrics
            value = scope.get_current_value(variable)
            if value is not None:
                variable.assign(value)
        totals = [scope.get_current_value(v) for v in self.metric_variables]
        return self.optimizer.scale_loss(loss), [t if t is not None else tf.zeros(v.shape, v.dtype)
                                                 for t, v in zip(totals, self.metric_variables)]

    def update(self, batches: Sequence[Any]) -> List[Any]:
        """One optimizer update from ``accum`` micro-batches: the metric totals of those batches, then (last) the
        number of examples in them."""
        weights = keras_sharded.trainable_shards(self.model.trainable_variables)  # one per shard
        grads_sum, totals, examples = None, None, tf.constant(0, tf.int64)
        for batch in batches:
            with tf.GradientTape() as tape:
                scaled, batch_totals = self.forward(batch)
            grads = tape.gradient(scaled, weights)
            grads_sum = grads if grads_sum is None else [a + b for a, b in zip(grads_sum, grads)]
            totals = batch_totals if totals is None else [a + b for a, b in zip(totals, batch_totals)]
            first = next(t for t in tf.nest.flatten(keras.utils.unpack_x_y_sample_weight(batch)[0]) if t is not None)
            examples += tf.cast(tf.shape(first)[0], tf.int64)
        if len(batches) > 1:
            grads_sum = [g / len(batches) for g in grads_sum]
        self.optimizer.apply(grads_sum, weights)
        return totals + [examples]

    def run_updates(self, groups: Sequence[Callable[[], Sequence[Any]]], worker: Any) -> List[Any]:
        """Inside a function scheduled on worker ``worker`` (int32 tensor): the updates, each from its batches and
        counted on the ps once every op of it has run; returns the summed metric totals.

        A tf.function orders stateful ops only per resource, so the order is explicit: update k's counts wait for
        every op of update k, and update k + 1 waits for them. Without it the counts lagged behind the updates (a
        worker SIGKILLed mid-closure had applied 8 updates that ``optimizer.iterations`` had and the per-worker
        counters had not); with it at most the update in flight when a worker dies is applied but not counted.
        """
        graph = tf.compat.v1.get_default_graph()
        counted = [self.accounting.started.assign_add(1)]  # no update before its closure is counted as started
        totals = None
        for batches in groups:
            first_op = len(graph.get_operations())
            with tf.control_dependencies(counted):
                out = self.strategy.run(self.update, args=(batches(),))
            update_ops = graph.get_operations()[first_op:]  # the update: forward pass, gradients, every ps write
            *out, examples = [self.strategy.reduce("SUM", v, axis=None) for v in out]
            with tf.control_dependencies(update_ops):
                counted = [self.steps.assign_add(self.accum), self.accounting.count(worker, examples)]
            totals = out if totals is None else [a + b for a, b in zip(totals, out)]
        return totals


def closure_spans(start: int, end: int, accum: int) -> List[Tuple[int, int]]:
    """``[first, last)`` steps of each closure scheduled for steps ``[start, end)`` of an epoch."""
    per_closure = accum * STEPS_PER_CLOSURE
    return [(first, min(end, first + per_closure)) for first in range(start, end, per_closure)]


def closure_batches(order: np.ndarray, first: int, last: int, *, batch: int,
                    accum: int) -> Tuple[Tuple[np.ndarray, ...], ...]:
    """The example indices of steps ``[first, last)`` of an epoch in ``order``, grouped by optimizer update."""
    return tuple(tuple(order[s * batch:(s + 1) * batch] for s in range(u, u + accum))
                 for u in range(first, last, accum))


class Schedule:
    """The per-worker input (built on the workers) and the closures the coordinator schedules over it."""

    def __init__(self, step: WorkerStep, data: FitData, *, backend: Any) -> None:
        self.step, self.data, self.coordinator = step, data, backend.coordinator
        self.steps_per_epoch = data.steps_per_epoch
        self.closures_scheduled = self.updates_scheduled = 0
        strategy, workers = backend.strategy, step.accounting.num_workers
        self.workers = worker_index_iterator(self.coordinator, workers)  # each closure learns where it runs
        if data.kind == "arrays":
            packed = step_data(data.x, data.y, data.sample_weight)  # numpy: constants of the worker's dataset

            def dataset_fn(_: Any) -> Any:
                return tf.data.Dataset.from_tensors(packed).repeat()

            @tf.function
            def arrays_closure(iterator: Any, worker_ids: Any, groups: Any) -> Any:
                held = next(iterator)  # every array, on this worker
                return step.run_updates([lambda g=g: [gather_batch(held, i) for i in g] for g in groups],
                                        next(worker_ids))

            self._closure = arrays_closure
            self.iterator = iter(self.coordinator.create_per_worker_dataset(
                lambda: strategy.distribute_datasets_from_function(dataset_fn)))
        else:
            self._closures: Dict[int, Any] = {}
            self.iterator = sharded_dataset_iterator(self.coordinator, strategy, data.x, workers) \
                if callable(data.x) else iter(self.coordinator.create_per_worker_dataset(data.x))

    def _stream_closure(self, updates: int) -> Any:
        if updates not in self._closures:
            step = self.step

            @tf.function
            def closure(iterator: Any, worker_ids: Any) -> Any:
                return step.run_updates([lambda: [next(iterator) for _ in range(step.accum)]] * updates,
                                        next(worker_ids))

            self._closures[updates] = closure
        return self._closures[updates]

    def order(self, epoch: int) -> np.ndarray:
        """Example indices of an epoch: ``tfaccel.train.data.example_order``, as every loop orders them."""
        return example_order(self.data.num_examples, self.data.seed, epoch, self.data.shuffle)

    def schedule(self, order: Optional[np.ndarray], start: int, end: int) -> List[Any]:
        """Schedules steps ``[start, end)`` of an epoch (whole updates) in closures of ``STEPS_PER_CLOSURE`` updates."""
        accum = self.step.accum
        remotes = []
        for first, last in closure_spans(start, end, accum):
            if order is None:
                fn, args = self._stream_closure((last - first) // accum), (self.iterator, self.workers)
            else:
                groups = tf.nest.map_structure(tf.constant, closure_batches(order, first, last,
                                                                            batch=self.data.batch_size, accum=accum))
                fn, args = self._closure, (self.iterator, self.workers, groups)
            remotes.append(self.coordinator.schedule(fn, args=args))
            self.closures_scheduled += 1
            self.updates_scheduled += (last - first) // accum
        return remotes


def build_on_ps(model: Any, data: FitData, *, backend: Any) -> None:
    """Creates, inside the scope (so on the ps tasks), what Keras' fit builds before its first step."""
    if data.kind == "arrays":
        sample = tf.nest.map_structure(lambda a: a[:data.batch_size],
                                       step_data(data.x, data.y, data.sample_weight))
    else:  # one batch of the user's pipeline, read here on the coordinator
        fn = data.x
        ds = fn(tf.distribute.InputContext()) if callable(fn) else None
        if ds is None:
            raise ConfigError("strategy parameter_server: pass a dataset_fn(input_context), not a distributed dataset "
                              f"(received {type(fn).__name__}); each worker calls it to build its own pipeline")
        sample = next(iter(ds.take(1)))
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(sample)
    with backend.scope():
        y_pred = model(x, training=False)
        model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight)  # builds the compiled loss
        model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)  # builds the compiled metrics
        model.reset_metrics()
        opt = model.optimizer
        if not opt.built:
            opt.build(keras_sharded.trainable_shards(model.trainable_variables))  # slots on the ps tasks
    exact_assign_add(opt.iterations)
    if isinstance(opt, keras.optimizers.LossScaleOptimizer):
        exact_assign_add(opt.step_counter)
