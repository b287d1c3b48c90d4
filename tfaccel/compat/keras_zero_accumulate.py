"""Gradient accumulation (``tfaccel.fit(..., gradient_accumulation_steps=N)``) with the optimizer state sharded
(ZeRO-1, :mod:`tfaccel.compat.keras_zero`), seen on Keras 3.15.1 / TensorFlow 2.21.0.

As ZeRO-1 accumulates elsewhere, each replica sums its own gradients of the N micro-batches locally (one
accumulator per trainable variable on every replica, the size of the gradients it computes anyway; nothing is
exchanged between micro-batches), and on the N-th micro-batch the sharded update runs once on their mean: reduced to
the owners, clipped, decayed, applied there and shared, the exchange of one step. What Keras' own accumulation does
around its update is kept, as tfaccel's unsharded accumulation keeps it (:mod:`tfaccel.compat.keras_optimizer`):
the gradients divided by ``loss_scale_factor``, ``weight_decay`` on update steps, the learning-rate schedule read at
the micro-batches counted so far, ``iterations`` counting updates, ``use_ema``'s averages after every micro-batch
(:mod:`tfaccel.compat.keras_zero_ema`) and each variable's ``constraint`` after every micro-batch.

The accumulators and the micro-batch counter are the job's, not the optimizer's state: neither is saved (a ``.keras``
file holds what plain Keras' optimizer holds). Hence backups are written only where the sums are empty, at the end
of an update (:func:`update_boundary`): tfaccel.train.zero refuses ``backup_dir`` unless every epoch and every
``backup_freq`` is a whole number of updates, and a preemption stops at the next update's end. A load puts the
counter back where such a save was made (``iterations`` x N, :meth:`ShardedAccumulation._tfaccel_realign`), so the
schedule goes on at the micro-batch the uninterrupted job would read it at.

It reads the optimizer's private ``_trainable_variables``, ``_get_variable_index``, ``_iterations`` and
``_distribution_strategy``; tests/training/test_zero.py fails when one of them moves.
"""

from typing import Any, List

import tensorflow as tf

from tfaccel.compat import keras_internals
from tfaccel.compat.keras_optimizer import MicroStepSchedule, backing_variables

__all__ = ["ShardedAccumulation", "update_boundary"]


class ShardedAccumulation(MicroStepSchedule):
    """Mixed in by ``keras_zero.ShardOptimizerState`` (see the module doc); ``tfaccel_accumulation_steps`` is set on
    the instance by tfaccel.train.zero. It uses the sharded optimizer's ``_tfaccel_update`` (the update of one
    step, in cross-replica context) and ``_tfaccel_replicated`` (a variable made on every replica)."""

    tfaccel_accumulation_steps = 1

    def _tfaccel_build_accumulation(self, variables: List[Any]) -> None:
        """After the optimizer's own build: the accumulators and the micro-batch counter (none for N = 1)."""
        self._tfaccel_unsaved = set()
        if self.tfaccel_accumulation_steps <= 1:
            return
        self._tfaccel_accumulators = [self._tfaccel_replicated(v, "tfaccel_accumulator") for v in variables]
        self._tfaccel_micro_step = self.add_variable((), initializer="zeros", dtype="int64",
                                                     name="tfaccel_micro_step")
        self._tfaccel_unsaved = {id(v) for v in self._tfaccel_accumulators + [self._tfaccel_micro_step]}

    def _tfaccel_realign(self) -> None:
        """After a load (a backup, a ``.keras`` file): the state of an update's end, where backups are written: the
        micro-batch counter at ``iterations`` x N, the accumulators empty."""
        if self.tfaccel_accumulation_steps <= 1 or getattr(self, "_tfaccel_micro_step", None) is None:
            return
        self._tfaccel_micro_step.assign(self._iterations.value * self.tfaccel_accumulation_steps)
        for accumulator in self._tfaccel_accumulators:
            accumulator.assign(tf.zeros(accumulator.shape, accumulator.dtype))

    def apply(self, grads: Any, trainable_variables: Any = None) -> Any:
        if self.tfaccel_accumulation_steps <= 1:
            return super().apply(grads, trainable_variables)  # type: ignore[misc]
        trainable_variables = list(self._trainable_variables if trainable_variables is None
                                   else trainable_variables)
        if not self.built:
            self.build(trainable_variables)
        grads = list(grads)
        if self.loss_scale_factor is not None:  # as Keras' apply
            grads = [g if g is None else g / self.loss_scale_factor for g in grads]
        accumulators = [self._tfaccel_accumulators[self._get_variable_index(v)] for v in trainable_variables]
        strategy, steps = self._distribution_strategy, self.tfaccel_accumulation_steps
        is_update = tf.equal((self._tfaccel_micro_step + 1) % steps, 0)
        keras_internals.maybe_merge_call(_add, strategy, grads, [a.value for a in accumulators])
        means = [None if g is None else a.value.read_value() / steps for g, a in zip(grads, accumulators)]
        present = [i for i, g in enumerate(means) if g is not None]
        keras_internals.maybe_merge_call(
            self._tfaccel_update_if, strategy, is_update, [means[i] for i in present],
            backing_variables([trainable_variables[i] for i in present]), self.learning_rate,
            [accumulators[i].value for i in present])
        self._update_model_variables_moving_average(self._trainable_variables)
        self._iterations.assign_add(tf.cast(is_update, "int64"))
        self._tfaccel_micro_step.assign_add(1)
        for variable in trainable_variables:  # as Keras' apply, after every call
            if variable.constraint is not None:
                variable.assign(variable.constraint(variable))
        return None

    def _tfaccel_update_if(self, distribution: Any, is_update: Any, means: List[Any], tvars: List[Any],
                           learning_rate: Any, accumulators: List[Any]) -> None:
        """On an update step (cross-replica context): weight decay, the sharded update of the means, the accumulators
        zeroed."""
        due = distribution.experimental_local_results(is_update)[0]

        def update() -> Any:
            for var in tvars:
                distribution.extended.update(var, self._tfaccel_decay,
                                             args=(distribution.experimental_local_results(learning_rate)[0],),
                                             group=False)
            self._tfaccel_update(distribution, means, tvars, learning_rate)
            for accumulator in accumulators:
                distribution.extended.update(accumulator, lambda a: a.assign(tf.zeros_like(a)), group=False)
            return tf.constant(True)

        tf.cond(due, update, lambda: tf.constant(False))


def _add(distribution: Any, grads: List[Any], accumulators: List[Any]) -> None:
    """Each replica's gradients added to its own accumulators (cross-replica context)."""
    for grad, accumulator in zip(grads, accumulators):
        if grad is not None:
            distribution.extended.update(accumulator, lambda a, g: a.assign_add(tf.cast(g, a.dtype)), args=(grad,),
                                         group=False)


def update_boundary(optimizer: Any) -> int:
    """Micro-batches from one point where a backup may be written to the next: N for this accumulation (its sums are
    not saved), 1 for any other optimizer (``optimizer`` possibly a LossScaleOptimizer, whose accumulation is not
    sharded)."""
    return int(optimizer.tfaccel_accumulation_steps) if isinstance(optimizer, ShardedAccumulation) else 1
