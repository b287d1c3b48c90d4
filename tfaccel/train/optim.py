"""The user's optimizer, made to work under every strategy without being replaced.

tfaccel never rebuilds an optimizer from its config: the object the user compiled is the one that trains,
with its schedule, clipping and hyper-parameters. Where a strategy needs a different behaviour, the
instance's class is swapped *in place* for a subclass (same name, same module, same config), and the swap
is announced in the plan. Two Keras 3.15 behaviours are corrected that way (seen on Keras 3.15.1 / TF 2.21.0):

* ``clipnorm`` / ``clipvalue`` / ``global_clipnorm`` are applied in ``BaseOptimizer.apply`` *before* the TF
  backend all-reduces the gradients (``TFOptimizer._backend_update_step``), so under MirroredStrategy /
  MultiWorkerMirroredStrategy each replica clips its own partial gradient and the result depends on the
  number of replicas. tfaccel clips after the all-reduce, as one device at the same global batch would.
* Keras' ``gradient_accumulation_steps`` wraps the update in ``ops.cond``; the update calls ``merge_call``
  inside the cond branch and fails under MirroredStrategy (``RuntimeError: merge_call called while defining
  a new graph``). tfaccel's accumulation reduces every micro-step, accumulates the reduced gradients, and
  puts the condition *inside* the per-variable update (``extended.update``), where no ``merge_call`` happens.

Learning-rate scaling is opt-in (``scale_learning_rate="linear"|"sqrt"``): it wraps the optimizer's own rate
or schedule in :class:`ScaledSchedule` (registered for Keras serialisation as ``tfaccel>ScaledSchedule``).
"""

import math
from typing import Any, Dict, Optional, Tuple

import keras

from tfaccel.compat import keras_ema_overwrite, keras_internals, keras_loss_scale
from tfaccel.compat.keras_optimizer import adapted_class
from tfaccel.compat.keras_zero import is_sharded
from tfaccel.errors import ConfigError, invalid_choice
from tfaccel.precision import unwrap_loss_scale
from tfaccel.strategies.horovod import check_optimizer
from tfaccel.train.request import LR_SCALING

__all__ = ["scale_factor", "scaled_schedule", "users_schedule", "adapt_optimizer",
           "restore_optimizer_class"]



def scale_factor(rule: Optional[str], *, global_batch: int, base_batch: int) -> Tuple[float, str]:
    """The learning-rate multiplier for ``global_batch`` when the rate was tuned at ``base_batch``.

    Goyal et al. (2017): ``"linear"`` multiplies by ``global_batch / base_batch``, ``"sqrt"`` by its root.

    Returns:
        (factor, reason).

    Raises:
        ConfigError: an unknown rule.
    """
    rule = "none" if rule in (None, False) else rule
    if rule not in LR_SCALING:
        raise invalid_choice("scale_learning_rate", rule, LR_SCALING)
    ratio = global_batch / base_batch
    if rule == "linear":
        return ratio, f"linear: x{ratio:g} (global batch {global_batch} / base batch {base_batch})"
    if rule == "sqrt":
        return math.sqrt(ratio), f"sqrt: x{math.sqrt(ratio):g} (sqrt of {global_batch} / {base_batch})"
    return 1.0, "not scaled"


_SCHEDULE_CLASS = None


def _schedule_class() -> type:
    global _SCHEDULE_CLASS
    if _SCHEDULE_CLASS is not None:
        return _SCHEDULE_CLASS

    @keras.saving.register_keras_serializable(package="tfaccel")
    class ScaledSchedule(keras.optimizers.schedules.LearningRateSchedule):
        """The user's rate (a number or a schedule) times a factor reached after ``warmup_steps`` linear steps."""

        def __init__(self, inner: Any, factor: float, warmup_steps: int = 0) -> None:
            if isinstance(inner, dict):
                inner = keras.optimizers.schedules.deserialize(inner)
            self.inner = inner
            self.factor = float(factor)
            self.warmup_steps = int(warmup_steps)

        def __call__(self, step: Any) -> Any:
            ops = keras.ops
            base = self.inner(step) if callable(self.inner) else self.inner
            frac = ops.minimum(ops.cast(step, "float32") / float(max(self.warmup_steps, 1)), 1.0) \
                if self.warmup_steps else 1.0
            return ops.cast(base, "float32") * (1.0 + (self.factor - 1.0) * frac)

        def get_config(self) -> Dict[str, Any]:
            inner = keras.optimizers.schedules.serialize(self.inner) if callable(self.inner) else self.inner
            return {"inner": inner, "factor": self.factor, "warmup_steps": self.warmup_steps}

    _SCHEDULE_CLASS = ScaledSchedule
    return ScaledSchedule


def scaled_schedule(inner: Any, factor: float, warmup_steps: int = 0) -> Any:
    """A LearningRateSchedule: ``inner`` (number or schedule) times ``factor``, ramped over ``warmup_steps``."""
    return _schedule_class()(inner, factor, warmup_steps)


def users_schedule(optimizer: Any) -> Optional[Any]:
    """The user's own learning-rate schedule (inside tfaccel's ``ScaledSchedule`` too), or None for a constant rate."""
    given = keras_internals.learning_rate_or_schedule(unwrap_loss_scale(optimizer))
    if isinstance(given, _schedule_class()):
        given = given.inner
    return given if isinstance(given, keras.optimizers.schedules.LearningRateSchedule) else None


_ORIGINAL_CLASS = "_tfaccel_original_class"


def adapt_optimizer(model: Any, *, replicas: int, accumulation_steps: int) -> Optional[str]:
    """Swaps the class of the model's (inner) optimizer where the job needs tfaccel's behaviour.

    Needed for clipping under several replicas and for gradient accumulation, and (the ``LossScaleOptimizer``'s
    class, tfaccel.compat.keras_loss_scale) for loss scaling over several replicas; otherwise nothing changes.
    ``restore_optimizer_class`` undoes it.

    Returns:
        What was changed (for the plan), or None.

    Raises:
        ConfigError: accumulation asked for an optimizer that is already built, or one that uses Keras' own
            ``gradient_accumulation_steps``.
    """
    opt = model.optimizer
    inner = unwrap_loss_scale(opt)
    check_optimizer(inner)
    bound = keras_internals.optimizer_strategy(inner)  # Keras 3's TF optimizer binds to it when created
    if bound is not None and bound is not model.distribute_strategy and not inner.built:
        raise ConfigError(
            f"optimizer {type(inner).__name__} was created under a {type(bound).__name__}, but the model is built "
            f"under a {type(model.distribute_strategy).__name__}; Keras 3 optimizers bind to the strategy they are "
            "created under (building its variables would fail with 'Mixing different tf.distribute.Strategy "
            "objects'). Create the optimizer inside `with tfaccel.scope():`, e.g. model.compile(optimizer="
            "keras.optimizers.Adam(1e-3), ...) there")
    if inner.gradient_accumulation_steps and (replicas > 1 or accumulation_steps > 1):
        raise ConfigError(
            f"optimizer {type(inner).__name__}(gradient_accumulation_steps={inner.gradient_accumulation_steps}): "
            "Keras' own accumulation fails under MirroredStrategy ('merge_call called while defining a new graph'). "
            "Compile without it and pass gradient_accumulation_steps= to tfaccel.fit")
    in_sync = model.distribute_strategy.num_replicas_in_sync
    parts = []
    if in_sync > 1 and keras_loss_scale.apply(opt):
        parts.append("loss scaling skips a step when any replica's gradients overflow (Keras 3.15 asks the first "
                     f"replica only, before the all-reduce: {keras_loss_scale.UPSTREAM_ISSUES[0]})")
    # sharded state and tfaccel's accumulation write use_ema's averages outside Keras' cond themselves
    if not is_sharded(inner) and accumulation_steps <= 1 and keras_ema_overwrite.apply(inner, in_sync):
        parts.append(f"use_ema's averages written to the weights every {inner.ema_overwrite_frequency} steps outside "
                     "Keras' tf.cond, which fails under several replicas (the pattern of "
                     f"{keras_ema_overwrite.UPSTREAM_ISSUES[0]})")
    clips = any(getattr(inner, k, None) is not None for k in ("clipnorm", "clipvalue", "global_clipnorm"))
    if is_sharded(inner) or not ((clips and replicas > 1) or accumulation_steps > 1):  # sharded: clips when reduced
        return f"optimizer {type(inner).__name__}: " + "; ".join(parts) if parts else None
    if accumulation_steps > 1 and inner.built:
        raise ConfigError("gradient_accumulation_steps needs an optimizer that is not built yet; compile a fresh "
                          "optimizer (tfaccel.fit builds it)")
    original = type(inner)
    if not hasattr(inner, _ORIGINAL_CLASS):
        setattr(inner, _ORIGINAL_CLASS, original)
        inner.__class__ = adapted_class(original)
    inner.tfaccel_accumulation_steps = int(accumulation_steps)
    if clips and replicas > 1:
        parts.append("gradients clipped after the all-reduce (Keras 3.15 clips each replica's partial gradient)")
    if accumulation_steps > 1:
        parts.append(f"gradients accumulated over {accumulation_steps} micro-batches per update")
    return f"optimizer {original.__name__}: " + "; ".join(parts)


def restore_optimizer_class(model: Any) -> None:
    """Gives the model's optimizer its own class back after training (its state stays)."""
    opt = getattr(model, "optimizer", None)
    keras_loss_scale.remove(opt)
    inner = unwrap_loss_scale(opt)
    original = getattr(inner, _ORIGINAL_CLASS, None)
    if original is not None:  # accumulators, if any, stay among its variables, unused by its own apply()
        inner.__class__ = original
        delattr(inner, _ORIGINAL_CLASS)
    keras_ema_overwrite.remove(inner)  # swapped on first: given back last


def scale_learning_rate(model: Any, rule: Optional[str], *, global_batch: Optional[int], base_batch: Optional[int],
                        warmup_steps: int, steps_per_update: int = 1) -> str:
    """Wraps the optimizer's rate in a ``ScaledSchedule`` when scaling or warmup was asked for.

    Args:
        warmup_steps: the optimizer updates the warmup lasts.
        steps_per_update: the steps the optimizer reads its schedule at per update (the micro-batches of tfaccel's
            gradient accumulation, as Keras' own accumulation reads it; 1 where the schedule is read per update).

    Returns:
        The learning-rate note for the plan.

    Raises:
        ConfigError: scaling asked for without a global batch (a batched dataset), or an unknown rule.
    """
    if rule in (None, False, "none") and not warmup_steps:
        return "learning rate as compiled"
    if not global_batch or not base_batch:
        raise ConfigError(f"scale_learning_rate={rule!r} needs the global batch size and base_batch_size (the batch "
                          f"the rate was tuned for); received global batch {global_batch!r}, base_batch_size "
                          f"{base_batch!r}. Pass batch_size= to fit, or scale the rate yourself")
    factor, reason = scale_factor(rule, global_batch=global_batch, base_batch=base_batch)
    opt = model.optimizer
    inner = unwrap_loss_scale(opt)
    if inner.built:
        raise ConfigError("scale_learning_rate needs an optimizer that is not built yet (its rate is wrapped before "
                          "the first step)")
    given = keras_internals.learning_rate_or_schedule(inner)
    current = given if callable(given) else float(keras.ops.convert_to_numpy(inner.learning_rate))
    inner.learning_rate = scaled_schedule(current, factor, warmup_steps * steps_per_update)
    return reason + (f", warmup over {warmup_steps} updates" if warmup_steps else "")
