"""Optimizers for distributed training: learning-rate scaling and warmup, clipping of the *aggregated*
gradients, and gradient accumulation that works under every strategy.

Two Keras 3.15 behaviours are corrected here (seen on Keras 3.15.1 / TF 2.21.0):

* ``clipnorm`` / ``global_clipnorm`` are applied in ``BaseOptimizer.apply`` *before* the TF backend
  all-reduces the gradients (``TFOptimizer._backend_update_step``), so under MirroredStrategy /
  MultiWorkerMirroredStrategy each replica clips its own partial gradient: the result depends on the
  number of replicas. tfaccel clips after the all-reduce.
* ``gradient_accumulation_steps`` wraps the update in ``ops.cond``; the update calls
  ``merge_call`` inside the cond branch and fails under MirroredStrategy with ``RuntimeError:
  merge_call called while defining a new graph``. tfaccel's accumulation reduces every micro-step,
  accumulates the reduced gradients, and puts the condition *inside* the per-variable update
  (``extended.update``), where no ``merge_call`` happens. ``optimizer.iterations`` counts updates.
"""

import math
from typing import Any, Dict, Optional, Tuple

from tfaccel.errors import ConfigError, invalid_choice

__all__ = ["LR_SCALING", "OPTIMIZER_NAMES", "scaled_learning_rate", "warmup_schedule", "make_optimizer"]

LR_SCALING = ("linear", "sqrt", "none")
OPTIMIZER_NAMES = ("adam", "adamw", "sgd", "rmsprop", "adagrad", "adamax", "nadam", "lion")


def scaled_learning_rate(base: float, replicas: int, rule: Optional[str]) -> Tuple[float, str]:
    """Scales a single-replica learning rate for ``replicas`` replicas (Goyal et al., 2017).

    Returns:
        (scaled learning rate, reason).
    """
    rule = "none" if rule in (None, False) else rule
    if rule not in LR_SCALING:
        raise invalid_choice("scale_learning_rate", rule, LR_SCALING)
    if rule == "linear":
        return base * replicas, f"linear: {base:g} x {replicas} replicas"
    if rule == "sqrt":
        return base * math.sqrt(replicas), f"sqrt: {base:g} x sqrt({replicas})"
    return base, "not scaled"


def _keras() -> Any:
    import keras

    return keras


def _make_warmup_class() -> Any:
    keras = _keras()

    @keras.saving.register_keras_serializable(package="tfaccel")
    class _WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
        """Linear warmup from ``initial`` to ``target`` over ``warmup_steps`` optimizer steps, then constant."""

        def __init__(self, initial: float, target: float, warmup_steps: int) -> None:
            self.initial = float(initial)
            self.target = float(target)
            self.warmup_steps = int(warmup_steps)

        def __call__(self, step: Any) -> Any:
            ops = keras.ops
            frac = ops.minimum(ops.cast(step, "float32") / float(max(self.warmup_steps, 1)), 1.0)
            return self.initial + (self.target - self.initial) * frac

        def get_config(self) -> Dict[str, Any]:
            return {"initial": self.initial, "target": self.target, "warmup_steps": self.warmup_steps}

    _WarmupSchedule.__name__ = "WarmupSchedule"
    return _WarmupSchedule


_WARMUP_CLASS = None


def warmup_schedule(initial: float, target: float, warmup_steps: int) -> Any:
    """A Keras LearningRateSchedule ramping linearly from ``initial`` to ``target`` over ``warmup_steps``."""
    global _WARMUP_CLASS
    if _WARMUP_CLASS is None:
        _WARMUP_CLASS = _make_warmup_class()
    return _WARMUP_CLASS(initial, target, warmup_steps)


_DISTRIBUTED_CLASSES: Dict[type, type] = {}


def _distributed_class(base: type) -> type:
    """A subclass of ``base`` that clips after the all-reduce and accumulates gradients under any strategy."""
    if base in _DISTRIBUTED_CLASSES:
        return _DISTRIBUTED_CLASSES[base]
    import tensorflow as tf

    class _Distributed(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, tfaccel_accumulation_steps: int = 1, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.tfaccel_accumulation_steps = int(tfaccel_accumulation_steps)

        def get_config(self) -> Dict[str, Any]:
            config = super().get_config()
            config["tfaccel_accumulation_steps"] = self.tfaccel_accumulation_steps
            return config

        def build(self, variables: Any) -> None:
            super().build(variables)
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
            clipped = super()._clip_gradients([grads[i] for i in present])
            out = list(grads)
            for i, g in zip(present, clipped):
                out[i] = g
            return out

        def _all_reduce_sum_gradients(self, grads_and_vars: Any) -> Any:
            reduced = list(super()._all_reduce_sum_gradients(grads_and_vars))
            if self.tfaccel_accumulation_steps > 1:
                return reduced  # clipped once, on the accumulated mean, in apply()
            grads = self._tfaccel_clip([g for g, _ in reduced])
            return list(zip(grads, [v for _, v in reduced]))

        def apply(self, grads: Any, trainable_variables: Any = None) -> Any:
            if self.tfaccel_accumulation_steps <= 1:
                return super().apply(grads, trainable_variables)
            return self._tfaccel_accumulate_apply(list(grads), trainable_variables)

        def _tfaccel_accumulate_apply(self, grads: Any, trainable_variables: Any) -> None:
            if trainable_variables is None:
                trainable_variables = self._trainable_variables
            trainable_variables = list(trainable_variables)
            if not self.built:
                self.build(trainable_variables)
            steps = self.tfaccel_accumulation_steps
            reduced = [g for g, _ in super()._all_reduce_sum_gradients(list(zip(grads, trainable_variables)))]
            accs = [self._tfaccel_accumulators[self._get_variable_index(v)] for v in trainable_variables]
            for acc, g in zip(accs, reduced):
                if g is not None:
                    acc.assign_add(tf.cast(g, acc.dtype))
            is_update = tf.equal((self._tfaccel_micro_step + 1) % steps, 0)
            mean = self._tfaccel_clip([acc / steps if g is not None else None for acc, g in zip(accs, reduced)])
            learning_rate = self.learning_rate
            tvars = [v.value if hasattr(v, "value") and not isinstance(v, tf.Variable) else v
                     for v in trainable_variables]

            def update(distribution: Any, pairs: Any) -> None:
                for grad, var in pairs:
                    if grad is None:
                        continue

                    def step(v: Any, g: Any) -> Any:
                        def do() -> Any:
                            self.update_step(g, v, learning_rate)
                            return tf.constant(True)

                        return tf.cond(is_update, do, lambda: tf.constant(False))

                    distribution.extended.update(var, step, args=(grad,), group=False)

            tf.__internal__.distribute.interim.maybe_merge_call(update, self._distribution_strategy,
                                                                list(zip(mean, tvars)))
            for acc in accs:
                acc.assign(tf.where(is_update, tf.zeros_like(acc), acc))
            self._iterations.assign_add(tf.cast(is_update, "int64"))
            self._tfaccel_micro_step.assign_add(1)

    _Distributed.__name__ = base.__name__
    _Distributed.__qualname__ = base.__qualname__
    _DISTRIBUTED_CLASSES[base] = _Distributed
    return _Distributed


def validate_optimizer_args(optimizer: Any, *, learning_rate: Optional[float], scale_learning_rate: Optional[str],
                            clipnorm: Optional[float], global_clipnorm: Optional[float]) -> None:
    """Checks the optimizer options without building anything (compile_and_fit calls it before training).

    Raises:
        ConfigError: naming the option, what was received and what is valid.
    """
    if clipnorm is not None and global_clipnorm is not None:
        raise ConfigError(f"give clipnorm or global_clipnorm, not both (received clipnorm={clipnorm!r}, "
                          f"global_clipnorm={global_clipnorm!r})")
    for name, value in (("clipnorm", clipnorm), ("global_clipnorm", global_clipnorm), ("learning_rate", learning_rate)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            raise ConfigError(f"{name} must be a positive number; received {value!r}")
    if isinstance(optimizer, str) and optimizer.lower() not in OPTIMIZER_NAMES:
        raise invalid_choice("optimizer", optimizer, OPTIMIZER_NAMES, "Or pass a keras.optimizers.Optimizer.")
    scaled_learning_rate(1.0, 1, scale_learning_rate)  # raises on an unknown rule


def make_optimizer(optimizer: Any, *, learning_rate: Optional[float], replicas: int,
                   scale_learning_rate: Optional[str], warmup_steps: int = 0, clipnorm: Optional[float] = None,
                   global_clipnorm: Optional[float] = None, gradient_accumulation_steps: int = 1
                   ) -> Tuple[Any, Dict[str, Any]]:
    """Builds the optimizer compile_and_fit uses. Call inside the strategy scope.

    Args:
        optimizer: a name (``"adam"``, ``"sgd"``, ...), a Keras optimizer instance (its config is reused),
            or a zero-argument callable returning one.
        learning_rate: single-replica learning rate; None keeps the optimizer's own default.
        replicas: replicas in sync, for scaling.
        scale_learning_rate: ``"linear"``, ``"sqrt"`` or ``"none"``.
        warmup_steps: optimizer steps of linear warmup from the unscaled to the scaled rate.
        clipnorm, global_clipnorm: clipping applied to the aggregated gradients.
        gradient_accumulation_steps: micro-batches per optimizer update.

    Returns:
        (optimizer, description dict for the plan).
    """
    keras = _keras()
    validate_optimizer_args(optimizer, learning_rate=learning_rate, scale_learning_rate=scale_learning_rate,
                            clipnorm=clipnorm, global_clipnorm=global_clipnorm)
    if isinstance(optimizer, str):
        template = keras.optimizers.get(optimizer.lower())
    elif isinstance(optimizer, keras.optimizers.Optimizer):
        template = optimizer
    elif callable(optimizer):
        template = optimizer()
        if not isinstance(template, keras.optimizers.Optimizer):
            raise ConfigError(f"optimizer callable returned {type(template).__name__}, not a keras Optimizer")
    else:
        raise ConfigError(f"optimizer must be a name {OPTIMIZER_NAMES}, a keras Optimizer or a callable returning "
                          f"one; received {type(optimizer).__name__}")
    _refuse_keras2_wrappers(template)
    config = template.get_config()
    if config.get("gradient_accumulation_steps"):
        raise ConfigError("pass gradient_accumulation_steps to compile_and_fit, not to the optimizer: Keras' own "
                          "accumulation fails under MirroredStrategy ('merge_call called while defining a new graph')")
    base_lr = float(learning_rate) if learning_rate is not None else float(keras.ops.convert_to_numpy(
        template.learning_rate))
    target, scale_reason = scaled_learning_rate(base_lr, replicas, scale_learning_rate)
    if warmup_steps > 0 and target != base_lr:
        lr: Any = warmup_schedule(base_lr, target, warmup_steps)
        lr_note = f"{scale_reason}, warmup over {warmup_steps} steps from {base_lr:g}"
    else:
        lr = target
        lr_note = scale_reason
    config.update(learning_rate=lr, clipnorm=clipnorm, global_clipnorm=global_clipnorm, clipvalue=None)
    for key in ("gradient_accumulation_steps",):
        config.pop(key, None)
    cls = _distributed_class(type(template))
    opt = cls.from_config({**config, "tfaccel_accumulation_steps": int(gradient_accumulation_steps)})
    info = {"optimizer": type(template).__name__, "learning_rate": target, "base_learning_rate": base_lr,
            "learning_rate_note": lr_note, "clipnorm": clipnorm, "global_clipnorm": global_clipnorm,
            "gradient_accumulation_steps": int(gradient_accumulation_steps)}
    return opt, info


def _refuse_keras2_wrappers(optimizer: Any) -> None:
    module = type(optimizer).__module__
    if module.startswith("horovod.") or type(optimizer).__name__.startswith("_DistributedOptimizer"):
        raise ConfigError(
            "optimizer is wrapped by horovod.tensorflow.keras.DistributedOptimizer, which under Keras 3 silently "
            "does not average gradients (ranks diverge). Pass the plain Keras optimizer and "
            "strategy='horovod'; tfaccel wraps it correctly.")
