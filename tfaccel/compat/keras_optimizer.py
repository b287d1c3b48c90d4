"""The Keras 3 optimizer subclass behind ``tfaccel.train.optim.adapt_optimizer``: clipping after the all-reduce and
gradient accumulation under any strategy.

Upstream (seen on Keras 3.15.1 / TensorFlow 2.21.0; no upstream issue filed, so none is named):

* ``clipnorm`` / ``clipvalue`` / ``global_clipnorm`` are applied in ``BaseOptimizer.apply`` *before* the TF
  backend all-reduces the gradients, so under a multi-replica strategy each replica clips its own partial
  gradient. The subclass clips after the all-reduce (it overrides the private ``_clip_gradients`` and
  ``_all_reduce_sum_gradients``).
* Keras' ``gradient_accumulation_steps`` fails under MirroredStrategy (``merge_call called while defining a new
  graph``). The subclass reduces every micro-step, accumulates the reduced gradients and applies the update in
  ``extended.update`` under a condition (``tf.__internal__``'s ``maybe_merge_call``, as Keras' optimizers do).
  What Keras' ``apply`` does around its update is kept: the gradients divided by ``loss_scale_factor``, the
  optimizer's ``weight_decay`` on update steps, the moving averages of ``use_ema`` after every call (and written to
  the variables every ``ema_overwrite_frequency`` updates), each variable's ``constraint`` after every call, and a
  learning-rate schedule read at the micro-batches counted so far (Keras' ``_get_current_learning_rate`` reads it at
  ``_iterations``, which its accumulation advances every call, while ``iterations`` counts updates).

It reads the optimizer's private ``_trainable_variables``, ``_get_variable_index``, ``_iterations``,
``_use_weight_decay``, ``_update_model_variables_moving_average``, ``_model_variables_moving_average``,
``_learning_rate`` and ``_distribution_strategy``, and overrides ``_get_current_learning_rate``;
tests/training/test_training_optim.py fails when one of them moves.
"""

import contextlib
import threading
from typing import Any, Dict, Iterator, List

import keras
import tensorflow as tf

from tfaccel.compat import keras_internals

__all__ = ["MicroStepSchedule", "adapted_class", "backing_variables", "applying", "in_apply",
           "write_averages_where_due"]

_ADAPTED: Dict[type, type] = {}


_APPLYING = threading.local()  # ids of the optimizers this thread is applying


@contextlib.contextmanager
def applying(optimizer: Any) -> Iterator[None]:
    """Within: this thread runs ``optimizer``'s ``apply`` (per thread: a MirroredStrategy traces each replica in a
    thread of its own, and they interleave at every merge call)."""
    ids = _APPLYING.__dict__.setdefault("ids", set())
    ids.add(id(optimizer))
    try:
        yield
    finally:
        ids.discard(id(optimizer))


def in_apply(optimizer: Any) -> bool:
    """Whether this thread is inside :func:`applying` for ``optimizer``."""
    return id(optimizer) in getattr(_APPLYING, "ids", ())


def backing_variables(variables: Any) -> List[Any]:
    """The ``tf.Variable`` behind each Keras variable (``.value``); a ``tf.Variable`` (a distributed one too) as it
    is. What the TF backend's ``_backend_update_step`` hands to ``extended.update``."""
    return [v.value if hasattr(v, "value") and not isinstance(v, tf.Variable) else v for v in variables]


class MicroStepSchedule:
    """What tfaccel's accumulations (here, and with sharded state in ``keras_zero_accumulate``) share: the
    learning-rate schedule read at the micro-batches so far (``_tfaccel_micro_step``, made by the accumulation), and
    Keras' weight decay of one variable."""

    def _get_current_learning_rate(self) -> Any:
        """A schedule at the micro-batches so far, as Keras' own accumulation reads it (see the module doc)."""
        schedule = self._learning_rate  # type: ignore[attr-defined]
        micro_step = getattr(self, "_tfaccel_micro_step", None)  # None before build: 0 micro-batches, as _iterations
        if micro_step is not None and isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
            return schedule(micro_step)
        return super()._get_current_learning_rate()  # type: ignore[misc]

    def _tfaccel_decay(self, variable: Any, learning_rate: Any) -> None:
        """The optimizer's ``weight_decay`` on one variable before its update, as Keras' ``apply`` decays every
        variable it does not exclude (``_apply_weight_decay``: ``variable -= variable * weight_decay * rate``)."""
        if self.weight_decay is None or not self._use_weight_decay(variable):  # type: ignore[attr-defined]
            return
        decay = tf.cast(self.weight_decay, variable.dtype)  # type: ignore[attr-defined]
        variable.assign_sub(variable * decay * tf.cast(learning_rate, variable.dtype))


class _ClipAfterReduceAccumulate(MicroStepSchedule):
    """Mixed in before the user's optimizer class (see the module doc); ``tfaccel_accumulation_steps`` is set on
    the instance by ``adapt_optimizer``."""

    tfaccel_accumulation_steps = 1

    def build(self, variables: Any) -> None:
        super().build(variables)  # type: ignore[misc]
        if self.tfaccel_accumulation_steps > 1:
            self._tfaccel_accumulators = [self.add_variable_from_reference(v, name="tfaccel_accumulator")
                                          for v in variables]
            self._tfaccel_micro_step = self.add_variable((), initializer="zeros", dtype="int64",
                                                         name="tfaccel_micro_step")

    # Clipping is deferred until the gradients have been all-reduced (see module docstring).
    def _clip_gradients(self, grads: Any) -> Any:
        return grads

    def _tfaccel_clip(self, grads: Any) -> Any:
        present = [i for i, g in enumerate(grads) if g is not None]
        clipped = super()._clip_gradients([grads[i] for i in present])  # type: ignore[misc]
        out = list(grads)
        for i, g in zip(present, clipped):
            out[i] = g
        return out

    def _all_reduce_sum_gradients(self, grads_and_vars: Any) -> Any:
        reduced = list(super()._all_reduce_sum_gradients(grads_and_vars))  # type: ignore[misc]
        if self.tfaccel_accumulation_steps > 1:
            return reduced  # clipped once, on the accumulated mean, in apply()
        grads = self._tfaccel_clip([g for g, _ in reduced])
        return list(zip(grads, [v for _, v in reduced]))

    def apply(self, grads: Any, trainable_variables: Any = None) -> Any:
        if self.tfaccel_accumulation_steps <= 1:
            return super().apply(grads, trainable_variables)  # type: ignore[misc]
        return self._tfaccel_accumulate_apply(list(grads), trainable_variables)

    def _tfaccel_accumulate_apply(self, grads: Any, trainable_variables: Any) -> None:
        trainable_variables = list(self._trainable_variables if trainable_variables is None
                                   else trainable_variables)
        if not self.built:
            self.build(trainable_variables)
        if self.loss_scale_factor is not None:  # as Keras' apply
            grads = [g if g is None else g / self.loss_scale_factor for g in grads]
        steps = self.tfaccel_accumulation_steps
        reduced = [g for g, _ in super()._all_reduce_sum_gradients(  # type: ignore[misc]
            list(zip(grads, trainable_variables)))]
        accs = [self._tfaccel_accumulators[self._get_variable_index(v)] for v in trainable_variables]
        for acc, g in zip(accs, reduced):
            if g is not None:
                acc.assign_add(tf.cast(g, acc.dtype))
        is_update = tf.equal((self._tfaccel_micro_step + 1) % steps, 0)
        mean = self._tfaccel_clip([acc / steps if g is not None else None for acc, g in zip(accs, reduced)])
        tvars = backing_variables(trainable_variables)
        keras_internals.maybe_merge_call(self._tfaccel_update(is_update), self._distribution_strategy,
                                         list(zip(mean, tvars)))
        for acc in accs:
            acc.assign(tf.where(is_update, tf.zeros_like(acc), acc))
        self._tfaccel_moving_average()
        self._iterations.assign_add(tf.cast(is_update, "int64"))
        self._tfaccel_micro_step.assign_add(1)
        for variable in trainable_variables:  # as Keras' apply, after every call
            if variable.constraint is not None:
                variable.assign(variable.constraint(variable))

    def _tfaccel_update(self, is_update: Any) -> Any:
        """``(distribution, pairs) -> None``: each variable's update, run only on an update step."""
        learning_rate = self.learning_rate

        def update(distribution: Any, pairs: List[Any]) -> None:
            for grad, var in pairs:
                if grad is None:
                    continue

                def step(v: Any, g: Any) -> Any:
                    def do() -> Any:
                        self._tfaccel_decay(v, learning_rate)
                        self.update_step(g, v, learning_rate)
                        return tf.constant(True)

                    return tf.cond(is_update, do, lambda: tf.constant(False))

                distribution.extended.update(var, step, args=(grad,), group=False)

        return update

    def _tfaccel_moving_average(self) -> None:
        """``use_ema``: the moving averages updated after every call, as Keras' ``_backend_apply_gradients`` updates
        them (its ``iterations``, the updates so far, is this optimizer's), and written to the model's variables every
        ``ema_overwrite_frequency`` updates: on every replica, selected by ``tf.where`` in ``extended.update`` (Keras'
        ``tf.cond`` around its overwrite would call ``merge_call`` inside a condition, which a replica cannot)."""
        if not self.use_ema:  # type: ignore[attr-defined]
            return
        self._update_model_variables_moving_average(self._trainable_variables)  # type: ignore[attr-defined]
        write_averages_where_due(self, self._trainable_variables)  # type: ignore[attr-defined]


def write_averages_where_due(optimizer: Any, trainable_variables: Any) -> None:
    """``use_ema``'s averages written to the variables on every replica where Keras' own condition holds (``(iterations
    + 1) % ema_overwrite_frequency == 0``), selected by ``tf.where`` in one merge call: no ``tf.cond`` around it (a
    branch that calls ``merge_call`` cannot sit in a replica context's ``cond``). Nothing without
    ``ema_overwrite_frequency``."""
    if not optimizer.ema_overwrite_frequency:
        return
    due = tf.equal((optimizer.iterations + 1) % optimizer.ema_overwrite_frequency, 0)
    pairs = list(zip(backing_variables(trainable_variables), optimizer._model_variables_moving_average))

    def write(distribution: Any, chosen: List[Any]) -> None:
        for var, average in chosen:
            if average is not None:
                distribution.extended.update(var, lambda v, a: v.assign(tf.where(due, a, v)),
                                             args=(average.value,), group=False)

    keras_internals.maybe_merge_call(write, optimizer._distribution_strategy, pairs)


def adapted_class(base: type) -> type:
    """A subclass of ``base`` that clips after the all-reduce and accumulates gradients under any strategy.

    Same name and module as ``base``: a saved .keras file names the plain Keras optimizer, so it loads with
    ``keras.models.load_model()`` in a process that never imported tfaccel.
    """
    if base not in _ADAPTED:
        _ADAPTED[base] = type(base.__name__, (_ClipAfterReduceAccumulate, base),
                              {"__module__": base.__module__, "__qualname__": base.__qualname__})
    return _ADAPTED[base]
