"""In which precision a model computes: float32, mixed_float16 or mixed_bfloat16 — decided from the hardware.

``"auto"`` picks mixed_bfloat16 on a TPU and on GPUs of compute capability >= 8.0 (Ampere and later),
mixed_float16 on 7.x (Volta/Turing tensor cores), float32 on older GPUs and on CPUs. An explicit mixed policy
on a CPU is honoured but warned about (it is slower there). Loss scaling is needed whenever float16 is used:
Keras 3 ``model.compile`` wraps the optimizer in a ``LossScaleOptimizer`` by itself; custom loops (tfaccel's
ParameterServer loop) use :func:`wrap_loss_scale`. A model whose outputs come out in float16 gets a warning
from :func:`check_output_dtype` (the Keras mixed precision guide's rule: keep the last layer, e.g. the
softmax, in float32); tfaccel does not insert a cast itself, so the model stays what the user built.
"""

from typing import Any, List, Literal, Optional, Tuple, get_args

from tfaccel.errors import ConfigError, invalid_choice
from tfaccel.log import get_logger

__all__ = ["PrecisionName", "PRECISION_NAMES", "POLICY_NAMES", "resolve_precision", "set_precision",
           "precision_warning", "user_global_policy", "wrap_loss_scale", "unwrap_loss_scale", "check_output_dtype"]

PrecisionName = Literal["auto", "float32", "mixed_float16", "mixed_bfloat16"]
# The one list of precision names (validation, CLI choices, docs); "auto" resolves to one of the others.
PRECISION_NAMES: Tuple[str, ...] = get_args(PrecisionName)
POLICY_NAMES: Tuple[str, ...] = PRECISION_NAMES[1:]


def _check_name(requested: Any) -> str:
    if not isinstance(requested, str) or requested not in PRECISION_NAMES:
        raise invalid_choice("precision", requested, PRECISION_NAMES,
                             hint="'auto' picks mixed_bfloat16 on TPUs and GPUs with compute capability >= 8.0, "
                                  "mixed_float16 on 7.x and float32 elsewhere")
    return requested


def _gpu_caps(devices: Any) -> str:
    return ", ".join(f"{g.name} cc {'.'.join(map(str, g.compute_capability)) if g.compute_capability else '?'}"
                     for g in devices.gpus)


def user_global_policy() -> Optional[str]:
    """The global dtype policy the user chose before tfaccel decides, or None where Keras' default stands.

    ``keras.mixed_precision.set_global_policy(...)`` (or ``keras.config.set_dtype_policy``, or a ``floatx`` other
    than float32) is an explicit choice that ``precision="auto"`` keeps. A float32 policy is Keras' default and
    cannot be told apart from one set on purpose: it counts as no choice (pass ``precision="float32"`` to keep
    float32 where ``auto`` would pick a mixed policy).

    Returns:
        The policy's name (``"mixed_float16"``, ``"float64"``, ...), or None for float32.
    """
    import keras

    name = keras.config.dtype_policy().name
    return None if name == "float32" else name


def resolve_precision(requested: str = "auto", *, devices: Any,
                      global_policy: Optional[str] = None) -> Tuple[str, str]:
    """Decides the Keras dtype policy, without setting it.

    Args:
        requested: one of ``PRECISION_NAMES``. Defaults to ``"auto"``.
        devices: the ``tfaccel.devices.DeviceInfo`` to decide from.
        global_policy: the global policy the user set (:func:`user_global_policy`); ``"auto"`` keeps it. Defaults
            to None (none set).

    Returns:
        (policy name, reason).

    Raises:
        ConfigError: ``requested`` is not a known name, or it differs from the global policy the user set.

    Example:
        >>> from tfaccel.devices import DeviceInfo, GpuInfo
        >>> resolve_precision("auto", devices=DeviceInfo(gpus=(GpuInfo(0, "A100", (8, 0)),)))[0]
        'mixed_bfloat16'
    """
    requested = _check_name(requested)
    if global_policy is not None:
        return _keep_user_policy(requested, global_policy, devices)
    if requested != "auto":
        warning = precision_warning(requested, devices=devices)
        return requested, "requested explicitly" + (f" ({warning})" if warning else "")
    if devices.tpu_address:
        return "mixed_bfloat16", "TPU: bfloat16 is its native matmul type"
    if devices.num_gpus:
        cap = devices.min_compute_capability
        if cap is None or len([g for g in devices.gpus if g.compute_capability is None]):
            return "float32", f"GPU compute capability unknown ({_gpu_caps(devices)}); staying in float32"
        if cap >= (8, 0):
            return "mixed_bfloat16", f"GPUs with compute capability >= 8.0 ({_gpu_caps(devices)})"
        if cap >= (7, 0):
            return "mixed_float16", f"GPUs with compute capability 7.x ({_gpu_caps(devices)}): float16 tensor cores"
        return "float32", f"GPUs older than compute capability 7.0 ({_gpu_caps(devices)}): no tensor cores"
    return "float32", "CPU only: mixed precision is slower than float32 on CPUs"


def _keep_user_policy(requested: str, global_policy: str, devices: Any) -> Tuple[str, str]:
    """The user's own global policy, kept for ``"auto"`` and for an equal request; a different request conflicts."""
    if requested not in ("auto", global_policy):
        raise ConfigError(f"precision={requested!r} conflicts with the global dtype policy {global_policy!r} set "
                          f"before tfaccel.scope() (keras.mixed_precision.set_global_policy or keras.config."
                          f"set_floatx); keep one: drop precision= to train in {global_policy!r}, or remove the "
                          f"set_global_policy call to train in {requested!r}")
    warning = precision_warning(global_policy, devices=devices) if global_policy in POLICY_NAMES else None
    reason = f"the global dtype policy you set ({global_policy!r}), kept"
    if warning:
        get_logger().warning("precision: %s: %s; pass precision='auto' without setting a global policy to let "
                             "tfaccel pick", reason, warning)
    return global_policy, reason + (f" ({warning})" if warning else "")


def precision_warning(policy: str, *, devices: Any) -> Optional[str]:
    """Why an explicitly requested policy is a poor fit for this hardware, or None."""
    if policy == "float32" or devices.tpu_address:
        return None
    if not devices.num_gpus:
        return f"{policy} on a CPU works but is slower than float32 there"
    cap = devices.min_compute_capability
    if cap is None:
        return None
    if policy == "mixed_float16" and cap < (7, 0):
        return f"{policy} on GPUs of compute capability {cap[0]}.{cap[1]} (< 7.0, no tensor cores) is not faster"
    if policy == "mixed_bfloat16" and cap < (8, 0):
        return f"{policy} on GPUs of compute capability {cap[0]}.{cap[1]} (< 8.0) has no native bfloat16 support"
    return None


def set_precision(name: str = "auto", *, devices: Optional[Any] = None) -> str:
    """Sets Keras' global dtype policy (call it before building the model).

    Args:
        name: one of ``PRECISION_NAMES``. Defaults to ``"auto"``.
        devices: the ``DeviceInfo`` to decide from. Defaults to ``detect_devices(initialise=False)``.

    Returns:
        The policy set: ``"float32"``, ``"mixed_float16"`` or ``"mixed_bfloat16"``.

    Raises:
        ConfigError: ``name`` is not a known precision.

    Example:
        >>> import tfaccel
        >>> tfaccel.set_precision("auto")  # doctest: +SKIP
        'float32'
    """
    _check_name(name)
    if devices is None:
        from tfaccel.devices import detect_devices

        devices = detect_devices(initialise=False)
    policy, reason = resolve_precision(name, devices=devices)
    warning = precision_warning(policy, devices=devices) if name != "auto" else None
    if warning:
        get_logger().warning("precision: %s; use precision='auto' to let tfaccel pick", warning)
    import keras

    keras.mixed_precision.set_global_policy(policy)
    get_logger().debug("precision %s: %s", policy, reason)
    return policy


def _policy_name(policy: Any) -> str:
    if policy is None:
        import keras

        return keras.mixed_precision.global_policy().name
    return policy if isinstance(policy, str) else getattr(policy, "name", str(policy))


def wrap_loss_scale(optimizer: Any, policy: Any = None) -> Any:
    """Wraps an optimizer in Keras 3's ``LossScaleOptimizer`` when the policy computes in float16.

    ``model.compile`` does this by itself; custom loops must do it, then scale the loss before taking
    gradients: ``grads = tape.gradient(opt.scale_loss(loss), vars); opt.apply(grads, vars)`` (``apply``
    unscales and skips steps whose gradients overflowed).

    Args:
        optimizer: a Keras 3 optimizer.
        policy: a policy name or ``keras.DTypePolicy``. Defaults to Keras' global policy.

    Returns:
        The optimizer, wrapped when the policy is ``mixed_float16`` (never wrapped twice).

    Example:
        >>> import keras
        >>> opt = wrap_loss_scale(keras.optimizers.Adam(), "mixed_float16")  # doctest: +SKIP
        >>> type(opt).__name__  # doctest: +SKIP
        'LossScaleOptimizer'
    """
    import keras

    if _policy_name(policy) != "mixed_float16" or isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return optimizer
    return keras.optimizers.LossScaleOptimizer(optimizer)


def unwrap_loss_scale(optimizer: Any) -> Any:
    """The optimizer that holds the slots and runs the updates: the one a ``LossScaleOptimizer`` wraps, or
    ``optimizer`` itself.

    Args:
        optimizer: a Keras 3 optimizer (or None).

    Returns:
        Its ``inner_optimizer`` when it has one (Keras' ``LossScaleOptimizer``, the only Keras optimizer that wraps
        another), else ``optimizer``.
    """
    inner = getattr(optimizer, "inner_optimizer", None)  # no Keras import: this module loads without TensorFlow
    return optimizer if inner is None else inner


def check_output_dtype(model: Any) -> List[str]:
    """Warns about model outputs computed in float16/bfloat16 (the loss loses precision, float16 can overflow).

    Args:
        model: a built Keras model.

    Returns:
        The names of the float16/bfloat16 outputs (empty when every output is float32).
    """
    bad, dtypes = [], []
    for index, output in enumerate(getattr(model, "outputs", None) or []):
        dtype = str(getattr(output, "dtype", ""))
        if dtype in ("float16", "bfloat16"):
            bad.append(getattr(output, "name", None) or f"output {index}")
            dtypes.append(dtype)
    if bad:
        get_logger().warning(
            "model %r: output(s) %s come out in %s; compute the last layer in float32 (e.g. "
            "keras.layers.Dense(n, dtype='float32') or keras.layers.Activation('softmax', dtype='float32')), as the "
            "Keras mixed precision guide advises, so the loss is computed in float32",
            getattr(model, "name", "model"), ", ".join(bad), "/".join(sorted(set(dtypes))))
    return bad
