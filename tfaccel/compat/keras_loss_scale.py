"""Keras 3's ``LossScaleOptimizer`` under a tf.distribute strategy of several replicas: whether a step's gradients
are finite is decided over every replica's gradients, as one device decides over the whole batch.

Upstream: keras-team/keras#18691 (the fix of keras-team/keras#18666) made ``LossScaleOptimizer._tf_apply`` check
the gradients in each replica and, under a strategy that merges (MirroredStrategy), take the first replica's
answer for every replica, commenting that the gradients are already all-reduced there. In Keras 3 they are not: the
TF optimizer all-reduces them later, inside the update (``_backend_update_step``). Seen on Keras 3.15.1 /
TensorFlow 2.21.0 with MirroredStrategy over 2 devices and one replica's half of a batch overflowing float16: the
first replica's finite gradients let the update apply the all-reduced sum, inf/NaN included, and every weight
became NaN, where Keras on one device skips that step and halves the loss scale. Under a strategy that does not
merge, each replica takes its own branch around the update's all-reduce.

The fix: before Keras' branch, the replicas all-reduce the count of replicas whose gradients are not finite (one
scalar a step), and every replica takes the branch of that global answer; the branches are Keras' own
(``_stateful_handle_finite_grads`` / ``_stateful_handle_non_finite_grads``). It is a subclass swapped onto the
instance (same name and module, so a saved .keras file names Keras' class), applied by
``tfaccel.train.optim.adapt_optimizer`` when the model trains over several replicas, undone after training, and
switched off with ``TFACCEL_DISABLE_COMPAT=keras_loss_scale``. Under Horovod with the inner optimizer sharded over
the ranks (each process one replica of TensorFlow's default strategy, the exchange inside the update), the count is
summed over the ranks by the backend's collective (:func:`apply_over_ranks`): deciding alone, a rank whose gradients
overflowed skipped the owners' all-gather that the others entered, and the job hung. It reads ``tf.__internal__``'s
``strategy_supports_no_merge_call`` and the optimizer's ``_tf_apply``, ``_stateful_handle_finite_grads`` and
``_stateful_handle_non_finite_grads``; tests/training/test_training_precision.py fails when one of them moves.
"""

from typing import Any, Callable, Optional

import keras
import tensorflow as tf

from tfaccel.compat import ClassSwap, VersionWindow, gate

__all__ = ["NAME", "UPSTREAM_ISSUES", "AFFECTED_VERSIONS", "why_not_needed", "apply", "apply_over_ranks", "remove",
           "is_applied"]

NAME = "keras_loss_scale"
UPSTREAM_ISSUES = ("keras-team/keras#18691",)
# [first affected, first version not known to be affected): the code came with Keras 3.0; checked on 3.15.1.
AFFECTED_VERSIONS: VersionWindow = ((3, 0), (3, 16))


class _FiniteOverReplicas:
    """Mixed in before ``LossScaleOptimizer`` (see the module doc)."""

    # Where every process is one replica and the exchange is not tf.distribute's (Horovod's ranks): the sum of a
    # scalar over the processes, set by apply_over_ranks.
    tfaccel_sum_over_ranks: Optional[Callable[[Any], Any]] = None

    def _tf_apply(self, grads: Any, trainable_variables: Any = None) -> None:
        context = tf.distribute.get_replica_context()
        over_ranks = self.tfaccel_sum_over_ranks
        if context is None or (context.num_replicas_in_sync < 2 and over_ranks is None):
            return super()._tf_apply(grads, trainable_variables)  # type: ignore[misc]
        local_bad = tf.cast(tf.logical_not(self.check_finite(grads)), tf.float32)  # type: ignore[attr-defined]
        bad = over_ranks(local_bad) if over_ranks else context.all_reduce(tf.distribute.ReduceOp.SUM, local_bad)
        finite = tf.equal(bad, 0.0)

        finite_step = self._stateful_handle_finite_grads  # type: ignore[attr-defined]
        if tf.__internal__.distribute.strategy_supports_no_merge_call():
            keras.ops.cond(finite, lambda: finite_step(grads, trainable_variables),
                           self._stateful_handle_non_finite_grads)  # type: ignore[attr-defined]
            return None

        def merged(distribution: Any, grads: Any, trainable_variables: Any, finite: Any) -> None:
            def apply_fn() -> None:
                distribution.extended.call_for_each_replica(finite_step, args=(grads, trainable_variables))

            # Every replica's value is the same global answer; the cond runs in the cross-replica context, as
            # Keras' does (a branch that calls merge_call cannot sit in a replica context's cond).
            keras.ops.cond(distribution.experimental_local_results(finite)[0], apply_fn,
                           self._stateful_handle_non_finite_grads)  # type: ignore[attr-defined]

        context.merge_call(merged, args=(grads, trainable_variables, finite))
        return None


_SWAP = ClassSwap(_FiniteOverReplicas, "_tfaccel_loss_scale_class")


def why_not_needed() -> Optional[str]:
    """Why the fix should not be applied here, or None when it should."""
    closed = gate(NAME, "Keras", keras.__version__, AFFECTED_VERSIONS,
                  f"a replica's overflow can reach the weights, see {UPSTREAM_ISSUES[0]}")
    if closed is not None:
        return closed
    if not all(hasattr(keras.optimizers.LossScaleOptimizer, name) for name in
               ("_tf_apply", "_stateful_handle_finite_grads", "_stateful_handle_non_finite_grads")):
        return "Keras' LossScaleOptimizer no longer has the methods this fix wraps; not patching"
    return None


def apply(optimizer: Any) -> bool:
    """Swaps the fix onto ``optimizer`` when it is a ``LossScaleOptimizer`` and the fix is needed; True if it is on."""
    if not isinstance(optimizer, keras.optimizers.LossScaleOptimizer) or why_not_needed() is not None:
        return is_applied(optimizer)
    _SWAP.apply(optimizer)
    return True


def apply_over_ranks(optimizer: Any, sum_over_ranks: Callable[[Any], Any]) -> bool:
    """:func:`apply` where every process is one replica and ``sum_over_ranks`` sums a scalar over the processes
    inside the train function (Horovod's ranks): the count of ranks whose gradients are not finite is summed, so
    every rank takes the same branch around the exchange in the update. True if the fix is on."""
    if not apply(optimizer):
        return False
    optimizer.tfaccel_sum_over_ranks = sum_over_ranks
    return True


def remove(optimizer: Any) -> None:
    """Gives ``optimizer`` its own class back (its state stays)."""
    _SWAP.remove(optimizer)
    if getattr(optimizer, "tfaccel_sum_over_ranks", None) is not None:
        del optimizer.tfaccel_sum_over_ranks


def is_applied(optimizer: Any) -> bool:
    """True while the fix is on ``optimizer``."""
    return _SWAP.is_applied(optimizer)
