"""The optimizer's moving average of the weights (``use_ema=True``) with its state sharded (ZeRO-1,
:mod:`tfaccel.compat.keras_zero`), seen on Keras 3.15.1 / TensorFlow 2.21.0.

Keras keeps one average per trainable variable (``_model_variables_moving_average``, made by
``add_variable_from_reference`` like a slot), updates every one of them after each step in replica context, and
every ``ema_overwrite_frequency`` steps (and in ``finalize_variable_values``, at the end of ``fit``) assigns the
averages to the variables. With sharded state the average of a variable is one of its owner's slots: held on the
owner only (an empty stand-in on the other workers). So, mixed in by the sharded optimizer:

* after each step, in cross-replica context (one merge call), each owner updates the averages it holds from its
  copy of the variable, with Keras' own arithmetic (momentum 0 at the first step); the averages of the variables left
  unsharded are updated on every replica as Keras does;
* the overwrite assigns each owner's average to its copy of the variable and then shares the owners' values with
  every replica by the sharded update's own exchange (``_tfaccel_share``); in ``apply`` it runs inside that same
  merge call, under a ``tf.cond`` on the step (Keras' own overwrite there, a merge call inside a ``tf.cond`` in
  replica context, fails under a MirroredStrategy: "merge_call called while defining a new graph").

Keras' ``SwapEMAWeights`` callback swaps the weights with their averages (at epoch ends, around evaluation and
prediction) on every replica, through the optimizer's ``_distribution_strategy``; with sharded state only the owner
holds an average. :data:`SWAP_CALLBACK` swaps a subclass onto the user's callback for the job (tfaccel.train.zero):
its TensorFlow path has each owner swap its copy with the average (Keras' arithmetic: ``v += a; a = v - a;
v -= a``) and share the result like an update, and its final ``average = weights`` runs on the owners; the
variables left unsharded go through Keras' own steps. With an unsharded optimizer it is Keras' callback.

It overrides Keras' private ``_backend_apply_gradients``, ``_update_model_variables_moving_average`` and
``_overwrite_model_variables_with_average_value``, and the callback's ``_tf_swap_variables`` and
``_tf_finalize_ema_values``; tests/training/test_zero.py fails when one of them moves.
"""

from typing import Any, Callable, List, Optional

import keras
import tensorflow as tf

from tfaccel.compat import ClassSwap, keras_internals
from tfaccel.compat.keras_optimizer import applying, backing_variables, in_apply

__all__ = ["ShardedMovingAverage", "SWAP_CALLBACK"]


class ShardedMovingAverage:
    """Mixed in by ``keras_zero.ShardOptimizerState`` (see the module doc). It uses the sharded optimizer's
    ``_tfaccel_owner`` (each sharded variable's owner among this process's devices, None for another worker's),
    ``_tfaccel_devices`` and ``_tfaccel_share`` (the owners' new values to every replica)."""

    def _backend_apply_gradients(self, grads: Any, trainable_variables: Any) -> None:
        with applying(self):  # Keras' overwrite in apply: done by the merge call of the moving average
            super()._backend_apply_gradients(grads, trainable_variables)  # type: ignore[misc]

    def _update_model_variables_moving_average(self, trainable_variables: Any) -> None:
        if self.use_ema:
            keras_internals.maybe_merge_call(self._tfaccel_average, self._distribution_strategy,
                                             backing_variables(trainable_variables))

    def _overwrite_model_variables_with_average_value(self, trainable_variables: Any) -> None:
        if in_apply(self):
            return
        if len(trainable_variables) != len(self._model_variables_moving_average):
            super()._overwrite_model_variables_with_average_value(trainable_variables)  # type: ignore[misc]
            return  # Keras' own error
        tvars, distribution = backing_variables(trainable_variables), self._distribution_strategy
        # multi_worker: a collective, not one of a step's (keras_zero_collective.exchange_bytes)
        tf.function(lambda: self._tfaccel_overwrite(distribution, tvars, None) and None)()

    def _tfaccel_average(self, distribution: Any, tvars: List[Any]) -> None:
        """Each held average updated from its variable (cross-replica context), then Keras' periodic overwrite."""
        for var, average in zip(tvars, self._model_variables_moving_average):
            if average is None:
                continue
            key = self._var_key(var)
            if key not in self._tfaccel_owner:  # left unsharded: every replica's copy, as Keras updates it
                distribution.extended.update(average.value, self._tfaccel_mix, args=(var,), group=False)
            elif self._tfaccel_owner[key] is not None:
                owner = self._tfaccel_owner[key]
                with tf.device(self._tfaccel_devices[owner]):
                    self._tfaccel_mix(average.value, distribution.experimental_local_results(var)[owner])
        if self.ema_overwrite_frequency:
            due = tf.equal((self.iterations + 1) % self.ema_overwrite_frequency, 0)
            tf.cond(due, lambda: self._tfaccel_overwrite(distribution, tvars, "all_gather_ema"), tf.no_op)

    def _tfaccel_mix(self, average: Any, value: Any) -> Any:
        """Keras' moving-average update of ``average`` from ``value``, its operations in its order."""
        not_first_step = keras.ops.not_equal(self.iterations, 0)
        momentum = keras.ops.multiply(keras.ops.cast(not_first_step, value.dtype), self.ema_momentum)
        return average.assign(keras.ops.add(keras.ops.multiply(momentum, average),
                                            keras.ops.multiply(keras.ops.subtract(1, momentum), value)))

    def _tfaccel_overwrite(self, distribution: Any, tvars: List[Any], label: Optional[str]) -> Any:
        """The averages assigned to the variables: each owner's to its copy, then shared with every replica
        (``label``: the exchange's name in the step's count of bytes; None outside a step)."""
        return self._tfaccel_with_averages(distribution, tvars, lambda v, a: v.assign(a), share=True, label=label)

    def _tfaccel_with_averages(self, distribution: Any, tvars: List[Any], change: Callable[[Any, Any], Any], *,
                               share: bool, label: Optional[str] = None) -> Any:
        """``change(variable copy, average)`` on each owner's copy (every replica's for the variables left
        unsharded); then, with ``share``, the owners' copies shared (``label``: as for ``_tfaccel_overwrite``)."""
        sharded = []
        for var, average in zip(tvars, self._model_variables_moving_average):
            key = self._var_key(var)
            if key not in self._tfaccel_owner:
                distribution.extended.update(var, change, args=(average.value,), group=False)
                continue
            sharded.append(var)
            owner = self._tfaccel_owner[key]
            if owner is not None:
                with tf.device(self._tfaccel_devices[owner]):
                    change(distribution.experimental_local_results(var)[owner], average.value)
        if share:
            self._tfaccel_share(distribution, sharded, label=label)
        return tf.no_op()

    def tfaccel_swap_averages(self, *, finalize: bool = False) -> None:
        """What ``SwapEMAWeights`` does to the weights and their averages, done by the owners (see the module doc):
        swapped (Keras' arithmetic), or with ``finalize`` each average set to its weights. Eager, on every
        process at the same point (its exchange between workers is a collective)."""
        functions = self.__dict__.setdefault("_tfaccel_swap_functions", {})  # traced once per kind
        if finalize not in functions:
            tvars, distribution = backing_variables(self._trainable_variables), self._distribution_strategy
            change = _average_from_weights if finalize else _swap
            functions[finalize] = tf.function(
                lambda: self._tfaccel_with_averages(distribution, tvars, change, share=not finalize) and None)
        functions[finalize]()


def _swap(variable: Any, average: Any) -> Any:
    """Keras' swap of a variable and its average (``SwapEMAWeights._tf_swap_variables``), its steps in its order."""
    variable.assign_add(average)
    average.assign(variable - average)
    return variable.assign(variable - average)


def _average_from_weights(variable: Any, average: Any) -> Any:
    return average.assign(variable)


class _SwapOnOwners:
    """Mixed in before the user's ``SwapEMAWeights`` (see the module doc)."""

    def _tf_swap_variables(self, optimizer: Any) -> None:
        if isinstance(optimizer, ShardedMovingAverage):
            optimizer.tfaccel_swap_averages()
        else:
            super()._tf_swap_variables(optimizer)  # type: ignore[misc]

    def _tf_finalize_ema_values(self, optimizer: Any) -> None:
        if isinstance(optimizer, ShardedMovingAverage):
            optimizer.tfaccel_swap_averages(finalize=True)
        else:
            super()._tf_finalize_ema_values(optimizer)  # type: ignore[misc]


SWAP_CALLBACK = ClassSwap(_SwapOnOwners, "_tfaccel_swap_ema_class")
