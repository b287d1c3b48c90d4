"""The multi-step loop: K steps of the model's own ``train_step`` per call under ``mirrored`` and ``multi_worker``.

Keras 3.15's multi-step loop fails under MultiWorkerMirroredStrategy (``You must feed a value for placeholder
tensor .../while/cond/Placeholder``, from ``get_next_as_optional`` of the distributed iterator inside its
``tf.while_loop``), so Keras ``fit`` runs one step per call there. This loop follows TF's Orbit instead
(``for _ in tf.range(n): strategy.run(step, ...)`` in one ``tf.function``) and needs no distributed iterator:
every worker holds the arrays (as every worker of a ``tfaccel.fit`` job is given them), each replica holds a copy,
and each step a replica gathers its own contiguous part of the global batch, the part ``tf.distribute`` would
hand it (replica ``r`` of ``R`` takes examples ``[r*B/R, (r+1)*B/R)`` of a batch of ``B``; a partial last batch
splits the same way, the first replicas taking one more when it does not split evenly). The order of each
epoch is a function of (seed, epoch), the same on every worker and the same as ``example_stream`` gives Keras
``fit``; so K steps per call train exactly what one step per call trains.

Keras semantics: the step is ``model.train_step``/``test_step`` under ``strategy.run``; step outputs are reduced
with Keras' own ``reduce_per_replica``; epoch logs are the model's metrics read in cross-replica context (a
cross-replica sum of Keras' on-read metric variables, as ``fit`` reads them); callbacks get Keras' hooks, batch
hooks once per execution with Keras' (begin, end) step numbers; validation is Keras ``evaluate`` as ``fit``
calls it, K steps per call too.
"""

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import keras
import numpy as np
import tensorflow as tf

from tfaccel.compat import keras_internals
from tfaccel.errors import ConfigError
from tfaccel.train.data import example_order
from tfaccel.train.fit_context import FitContext
from tfaccel.train.loops.base import (Loop, LoopResult, evaluation_pass, gather_batch, pass_blockers, run_epochs,
                                      step_data, steps_per_execution)

__all__ = ["MULTI_STEP_STRATEGIES", "MultiStepLoop", "multi_step_blockers", "uneven_batch_warning", "replica_splits",
           "run_multi_step"]

MULTI_STEP_STRATEGIES = ("mirrored", "multi_worker")


def replica_splits(batch: int, replicas: int) -> List[Tuple[int, int]]:
    """(offset, size) of each replica's part of a batch of ``batch`` examples, as ``tf.distribute`` splits it.

    Example:
        >>> replica_splits(7, 2)
        [(0, 4), (4, 3)]
    """
    sizes = [batch // replicas + (1 if r < batch % replicas else 0) for r in range(replicas)]
    return [(sum(sizes[:r]), sizes[r]) for r in range(replicas)]


def multi_step_blockers(model: Any, *, backend: Any, data: Any, validation_steps: Optional[int],
                        validation_batch_size: Optional[int] = None) -> List[str]:
    """Why the multi-step loop cannot train this job exactly like Keras ``fit`` (an empty list: it can).

    Args:
        model: the user's compiled model.
        backend: the job's ``Backend`` (mirrored or multi_worker).
        data: the prepared ``FitData``.
        validation_steps, validation_batch_size: ``fit``'s arguments.

    Returns:
        One short readable phrase per reason.
    """
    replicas = backend.num_replicas_in_sync
    blockers = []
    if not backend.traits.multi_step:
        blockers.append(f"{backend.describe()} (the multi-step loop runs {' and '.join(MULTI_STEP_STRATEGIES)})")
    if getattr(model, "run_eagerly", False):
        blockers.append("the model was compiled with run_eagerly=True")
    if data.kind != "arrays":
        return blockers + [f"data is {data.what}, not in-memory arrays"]
    if data.validation is not None and data.validation[1] is None and data.validation[2] is None:
        blockers.append("validation_data is not arrays")
    elif data.validation is not None:
        blockers += _batch_blockers("validation ", _num_examples(data.validation[0]),
                                    validation_batch_size or data.batch_size, replicas)
    return blockers + _batch_blockers("", data.num_examples, data.batch_size, replicas) \
        + pass_blockers(data, validation_steps)


def _num_examples(x: Any) -> int:
    return int(len(tf.nest.flatten(x)[0]))


def _batch_blockers(what: str, num_examples: int, batch: int, replicas: int) -> List[str]:
    """Every replica must get an equal part of every whole batch, and some of the last one."""
    found = []
    if batch % replicas:
        found.append(f"the global {what}batch {batch} does not split evenly over {replicas} replicas")
    if 0 < num_examples % batch < replicas:
        found.append(f"the last {what}batch ({num_examples % batch} examples) leaves a replica of {replicas} "
                     "without examples")
    return found


def uneven_batch_warning(backend: Any, data: Any) -> Optional[str]:
    """The WARNING for a job whose batch size alone keeps it from the multi-step loop (the user can change it), or
    None: a backend the loop does not serve, data that is not arrays, or a batch that splits evenly.

    Args:
        backend: the job's ``Backend``. data: the prepared ``FitData``.
    """
    if not backend.traits.multi_step or data.kind != "arrays" or not data.batch_size:
        return None
    replicas, batch = backend.num_replicas_in_sync, data.batch_size
    found = _batch_blockers("", data.num_examples, batch, replicas)
    if not found:
        return None
    lower = batch - batch % replicas
    sizes = " or ".join(str(b) for b in (lower, lower + replicas) if b > 0) if batch % replicas else None
    fix = (f"use a global batch_size that divides by the {replicas} replicas ({sizes})" if sizes else
           f"use a batch_size or a number of examples that leaves at least {replicas} examples in the last batch")
    return (f"fit: {'; '.join(found)}, so this job runs Keras fit, one step per call, instead of tfaccel's "
            f"multi-step loop (measured 1.9-5.4x the examples/s under multi_worker); to train on the fast path, {fix}")


class _ReplicatedPass:
    """Passes over in-memory data with one of the model's step methods under the strategy, K steps per call.

    Every replica holds a copy of the data; each epoch, every replica is given the example indices of its part of
    every batch (a per-replica value), and a step gathers its batch from them.
    """

    def __init__(self, model: Any, step: Callable[[Any], Any], data: Any, *, batch_size: int, jit_compile: bool
                 ) -> None:
        self.strategy = model.distribute_strategy
        self.replicas = self.strategy.num_replicas_in_sync
        self.num_examples = int(tf.nest.flatten(data)[0].shape[0])
        self.batch_size = batch_size
        self.whole = self.num_examples // batch_size
        self.num_batches = -(-self.num_examples // batch_size)
        self.per_replica = batch_size // self.replicas
        self._partial = self.num_examples % batch_size
        with self.strategy.scope():
            self._data = self.strategy.experimental_distribute_values_from_function(
                lambda ctx: tf.nest.map_structure(tf.constant, data))

        # The loop needs AutoGraph (for over tf.range), the step does not: Keras fit traces it unconverted
        # (do_not_convert on one_step_on_data, keras/src/backend/tensorflow/trainer.py), and so does this loop.
        @tf.autograph.experimental.do_not_convert
        def replica_step(values: Any, indices: Any) -> Any:
            return step(gather_batch(values, indices))

        self._replica_step = tf.function(replica_step, jit_compile=True) if jit_compile else replica_step
        self._steps = tf.function(self._run_steps)
        # Keras' own step returns the model's metrics: under MirroredStrategy (one process) the loop carries them,
        # so the step is traced once per replica, as in Keras fit, not once more for a last step outside the loop.
        # Reading the metrics' shapes
        # under MultiWorkerMirroredStrategy would be a collective, so there the last step stays outside the loop.
        # None: decided at the first call; False: the last step runs outside the loop.

        name = getattr(step, "__name__", "")
        own_step = name in ("train_step", "test_step") and getattr(type(model), name) is getattr(keras.Model, name)
        mirrored = isinstance(self.strategy, tf.distribute.MirroredStrategy)
        self._model, self._zeros = model, (None if own_step and mirrored else False)
        self._partial_step = tf.function(self._run_partial)

    def _reduce(self, outputs: Any) -> Any:
        return keras_internals.reduce_per_replica(outputs, self.strategy)  # Keras' own reduction

    def _one(self, values: Any, indices: Any, i: Any) -> Any:
        def on_replica(v: Any, idx: Any) -> Any:
            # tf.slice, not idx[a:b]: Python slicing of a tensor inside a loop ran 100x slower under XLA here.
            return self._replica_step(v, tf.slice(idx, [i * self.per_replica], [self.per_replica]))

        return self.strategy.run(on_replica, args=(values, indices))

    def _run_steps(self, values: Any, indices: Any, start: Any, count: Any) -> Any:
        if self._zeros is not False:
            last = self._zeros
            for i in tf.range(start, start + count):
                last = self._reduce(self._one(values, indices, i))
            return last
        for i in tf.range(start, start + count - 1):  # the outputs of all but the last step are not needed
            self._one(values, indices, i)
        return self._reduce(self._one(values, indices, start + count - 1))

    def _call_steps(self, whole_idx: Any, begin: int, stop: int) -> Any:
        """Runs whole batches ``begin..stop-1``; the first call decides whether the loop carries the outputs."""
        args = (self._data, whole_idx, tf.constant(begin), tf.constant(stop - begin))
        if self._zeros is None:  # the model's metrics exist now (Keras' symbolic build ran before the first call)
            self._zeros = tf.nest.map_structure(lambda t: tf.zeros_like(tf.convert_to_tensor(t)),
                                                self._model.get_metrics_result())
            try:
                return self._steps(*args)
            except (TypeError, ValueError):  # the step's outputs are not shaped like the metrics
                self._zeros, self._steps = False, tf.function(self._run_steps)
        return self._steps(*args)

    def _run_partial(self, values: Any, indices: Any) -> Any:
        return self._reduce(self.strategy.run(self._replica_step, args=(values, indices)))

    def _per_replica(self, arrays: Sequence[np.ndarray]) -> Any:
        return self.strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(arrays[ctx.replica_id_in_sync_group]))

    def indices(self, order: np.ndarray) -> Tuple[Any, Any]:
        """(each replica's indices of the whole batches, of the partial batch or None) for an epoch's order."""
        split = self.whole * self.batch_size
        whole = order[:split].reshape(self.whole, self.replicas, self.per_replica)
        whole_idx = self._per_replica([np.ascontiguousarray(whole[:, r, :]).reshape(-1)
                                       for r in range(self.replicas)]) if self.whole else None
        tail = order[split:]
        partial_idx = self._per_replica([tail[o:o + s] for o, s in replica_splits(len(tail), self.replicas)]) \
            if self._partial else None
        return whole_idx, partial_idx

    def run(self, indices: Tuple[Any, Any], begin: int, end: int) -> Any:
        """Runs batches ``begin..end`` (inclusive) of the epoch; returns the last step's reduced outputs."""

        whole_idx, partial_idx = indices
        last = None
        with self.strategy.scope():
            stop = min(end + 1, self.whole)
            if begin < stop:
                last = self._call_steps(whole_idx, begin, stop)
            if end >= self.whole and self._partial:
                last = self._partial_step(self._data, partial_idx)
        return last


def _executions(first: int, num_batches: int, steps_per_execution: int) -> List[Tuple[int, int]]:
    """Keras' epoch iterator: (begin, end) batch numbers of each execution."""
    return [(b, min(b + steps_per_execution, num_batches) - 1) for b in range(first, num_batches, steps_per_execution)]


def _wait(logs: Any) -> Any:
    for value in tf.nest.flatten(logs):
        value.numpy()  # waits for the device, so the epoch's time is the work's time
    return logs


def _evaluate(model: Any, val_pass: _ReplicatedPass, cb_list: Any, steps_per_execution: int) -> Dict[str, Any]:
    """Keras' ``evaluate`` as ``fit`` calls it (``evaluation_pass``), K steps per call, batch hooks per call."""

    def run() -> Any:
        indices = val_pass.indices(np.arange(val_pass.num_examples, dtype=np.int32))
        logs = None
        for begin, end in _executions(0, val_pass.num_batches, steps_per_execution):
            cb_list.on_test_batch_begin(begin)
            logs = val_pass.run(indices, begin, end)
            cb_list.on_test_batch_end(end, logs)
        return logs

    return evaluation_pass(model, cb_list, run)


def _train_epoch(model: Any, train: _ReplicatedPass, cb_list: Any, *, order: np.ndarray, first: int,
                 steps_per_execution: int) -> Tuple[Any, int]:
    """One epoch from batch ``first``; returns (the last execution's logs, batches run)."""
    indices = train.indices(order)
    logs, ran = None, 0
    for begin, end in _executions(first, train.num_batches, steps_per_execution):
        cb_list.on_train_batch_begin(begin - first)  # a resumed epoch numbers its batches from 0, as Keras fit does
        logs = train.run(indices, begin, end)
        cb_list.on_train_batch_end(end - first, logs)
        ran += end - begin + 1
        if model.stop_training:
            break
    return _wait(logs), ran


def run_multi_step(model: Any, *, data: Any, epochs: int, initial_epoch: int, start_step: int,
                   steps_per_execution: int, validation_batch_size: Optional[int], validation_freq: Any,
                   callbacks: List[Any], verbose: Any) -> LoopResult:
    """Trains ``model`` under its strategy as Keras ``fit`` would, ``steps_per_execution`` steps per call.

    Args:
        model: the user's model, compiled under a mirrored or multi_worker strategy.
        data: array ``FitData`` (:func:`multi_step_blockers` returned [] for it); its seed is the job's.
        epochs, initial_epoch, validation_batch_size, validation_freq, verbose: as in Keras ``fit``.
        start_step: batches of ``initial_epoch`` already trained (a resumed job).
        steps_per_execution: steps per call, >= 1.
        callbacks: the job's callbacks; batch hooks run once per execution, as under Keras.

    Returns:
        Keras' history, the training seconds of each epoch (validation and callbacks excluded), the steps run.
    """
    jit = bool(model.jit_compile)
    train = _ReplicatedPass(model, model.train_step, step_data(data.x, data.y, data.sample_weight),
                            batch_size=data.batch_size, jit_compile=jit)
    with model.distribute_strategy.scope():
        keras_internals.symbolic_build(model, step_data(*_first_rows(data, train.per_replica)))  # as Keras fit does
    val = None if data.validation is None else _ReplicatedPass(
        model, model.test_step, step_data(*data.validation), batch_size=validation_batch_size or data.batch_size,
        jit_compile=jit)

    def train_epoch(epoch: int, cb_list: Any) -> Tuple[Any, int]:
        order = example_order(train.num_examples, data.seed, epoch, data.shuffle)
        return _train_epoch(model, train, cb_list, order=order,
                            first=start_step if epoch == initial_epoch else 0,
                            steps_per_execution=steps_per_execution)

    return run_epochs(model, callbacks=callbacks, verbose=verbose, epochs=epochs, initial_epoch=initial_epoch,
                      steps_per_epoch=train.num_batches, train_epoch=train_epoch,
                      validate=None if val is None else lambda cb_list: _evaluate(model, val, cb_list,
                                                                                   steps_per_execution),
                      validation_freq=validation_freq)


def _first_rows(data: Any, rows: int) -> Tuple[Any, Any, Any]:
    """The first ``rows`` examples of the arrays: a batch with a replica's shapes, for Keras' symbolic build."""
    def rows_of(v: Any) -> Any:  # a tensor keeps its dtype (a string tensor as numpy is an object array)
        return v[:rows] if tf.is_tensor(v) else np.asarray(v)[:rows]

    def head(a: Any) -> Any:
        return None if a is None else tf.nest.map_structure(rows_of, a)

    return head(data.x), head(data.y), head(data.sample_weight)


class MultiStepLoop(Loop):
    """mirrored / multi_worker, array data: K steps of the model's train_step per call, where it trains exactly like
    Keras fit and runs more than one step per call ("auto"), or wherever it can (``loop="compiled"``)."""

    name = "multi_step"
    own = True

    def serves(self, ctx: "FitContext") -> bool:
        return ctx.backend.traits.multi_step

    def blockers(self, ctx: "FitContext") -> List[str]:
        request, backend = ctx.request, ctx.backend
        blockers = multi_step_blockers(ctx.model, backend=backend, data=ctx.data,
                                       validation_steps=request.validation.steps,
                                       validation_batch_size=request.validation.batch_size)
        if not self.serves(ctx) or blockers:
            if request.loop.loop == "compiled" and self.serves(ctx):
                raise ConfigError("loop='compiled' cannot train this job exactly like Keras fit under "
                                  f"{backend.describe(prefix='')}: " + "; ".join(blockers) +
                                  ". Use loop='auto' (Keras fit then trains it)")
            return blockers
        spe, reason = self.steps_per_execution(ctx)
        return [f"steps_per_execution {reason}"] if spe == 1 and request.loop.loop != "compiled" else []

    def describe(self, ctx: "FitContext", rejected: List[Tuple[Loop, List[str]]]) -> str:
        return (f"tfaccel's multi-step loop: {self.steps_per_execution(ctx)[0]} steps of the model's train_step per "
                f"call under {ctx.backend.describe(prefix='')}, each replica gathering its part of every batch from "
                "in-memory arrays")

    def steps_per_execution(self, ctx: "FitContext") -> Optional[Tuple[int, str]]:
        return steps_per_execution(ctx, keras_fit=False)

    def run(self, ctx: "FitContext") -> LoopResult:
        validation = ctx.request.validation
        return run_multi_step(ctx.model, data=ctx.data, epochs=ctx.request.epochs, initial_epoch=ctx.start_epoch,
                              start_step=ctx.start_step, steps_per_execution=ctx.model.steps_per_execution,
                              validation_batch_size=validation.batch_size, validation_freq=validation.freq,
                              callbacks=ctx.loop_callbacks(), verbose=ctx.verbose)
