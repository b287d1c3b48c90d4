"""``use_ema=True`` with ``ema_overwrite_frequency`` under a tf.distribute strategy of several replicas.

Upstream (seen on Keras 3.15.1 / TensorFlow 2.21.0): ``BaseOptimizer._backend_apply_gradients`` writes the moving
averages to the variables every ``ema_overwrite_frequency`` steps inside ``ops.cond``, in the replica context, and
the TF optimizer's ``_overwrite_model_variables_with_average_value`` updates the mirrored variables there with
``extended.update``. Under a MirroredStrategy the first step fails: "`merge_call` called while defining a new graph
or a tf.function" (plain ``model.fit`` fails the same way). It is the pattern of keras-team/keras#18666 (the
``LossScaleOptimizer``'s ``cond`` around its update), whose fix did not reach this ``cond``.

The fix: while ``apply`` runs, Keras' overwrite inside its ``cond`` does nothing; right after the moving averages
are updated (Keras' own ``_update_model_variables_moving_average``, in the replica context, before its ``cond``)
one merge call assigns each variable ``tf.where(due, average, variable)`` on every replica, ``due`` being Keras'
own condition (``(iterations + 1) % ema_overwrite_frequency == 0``). At the end of ``fit``
(``finalize_variable_values``, not in ``apply``) Keras' overwrite runs as it is. A subclass swapped onto the
instance (same name and module) by ``tfaccel.train.optim.adapt_optimizer`` for a fit over several replicas, given
back after it, switched off with ``TFACCEL_DISABLE_COMPAT=keras_ema_overwrite``. With the optimizer state sharded
(``tfaccel.compat.keras_zero_ema``) or tfaccel's gradient accumulation (``tfaccel.compat.keras_optimizer``) the
overwrite is already done outside the ``cond``: not applied there.

It overrides the private ``_backend_apply_gradients``, ``_update_model_variables_moving_average`` and
``_overwrite_model_variables_with_average_value`` and reads ``_model_variables_moving_average``,
``_trainable_variables`` and ``_distribution_strategy``; tests/training/test_training_optim.py fails when one of
them moves.
"""

from typing import Any, Optional

import keras

from tfaccel.compat import ClassSwap, VersionWindow, gate
from tfaccel.compat.keras_optimizer import applying, in_apply, write_averages_where_due

__all__ = ["NAME", "UPSTREAM_ISSUES", "AFFECTED_VERSIONS", "why_not_needed", "apply", "remove", "is_applied"]

NAME = "keras_ema_overwrite"
UPSTREAM_ISSUES = ("keras-team/keras#18666",)
# [first affected, first version not known to be affected): the cond came with Keras 3.0; checked on 3.15.1.
AFFECTED_VERSIONS: VersionWindow = ((3, 0), (3, 16))


class _OverwriteOutsideCond:
    """Mixed in before the user's optimizer class (see the module doc)."""

    def _backend_apply_gradients(self, grads: Any, trainable_variables: Any) -> None:
        with applying(self):
            super()._backend_apply_gradients(grads, trainable_variables)  # type: ignore[misc]

    def _overwrite_model_variables_with_average_value(self, trainable_variables: Any) -> None:
        if not in_apply(self):  # finalize_variable_values: Keras' own
            super()._overwrite_model_variables_with_average_value(trainable_variables)  # type: ignore[misc]

    def _update_model_variables_moving_average(self, trainable_variables: Any) -> None:
        super()._update_model_variables_moving_average(trainable_variables)  # type: ignore[misc]
        if in_apply(self):
            write_averages_where_due(self, trainable_variables)


_SWAP = ClassSwap(_OverwriteOutsideCond, "_tfaccel_ema_overwrite_class")


def why_not_needed(optimizer: Any, replicas: int) -> Optional[str]:
    """Why the fix is not applied to ``optimizer`` in a fit over ``replicas`` replicas, or None when it is."""
    if not (getattr(optimizer, "use_ema", False) and getattr(optimizer, "ema_overwrite_frequency", None)):
        return "no ema_overwrite_frequency"
    if replicas < 2:
        return "one replica: Keras' cond has no merge call to make"
    return gate(NAME, "Keras", keras.__version__, AFFECTED_VERSIONS,
                f"the first step fails under a MirroredStrategy, see {UPSTREAM_ISSUES[0]}")


def apply(optimizer: Any, replicas: int) -> bool:
    """Swaps the fix onto ``optimizer`` where it is needed (see :func:`why_not_needed`); True if it is on."""
    if why_not_needed(optimizer, replicas) is not None:
        return is_applied(optimizer)
    _SWAP.apply(optimizer)
    return True


def remove(optimizer: Any) -> None:
    """Gives ``optimizer`` its own class back (its state stays)."""
    _SWAP.remove(optimizer)


def is_applied(optimizer: Any) -> bool:
    """True while the fix is on ``optimizer``."""
    return _SWAP.is_applied(optimizer)
