"""Whether XLA compiles the training step: ``jit_compile="auto" | True | False`` resolved per plan.

Keras' own ``"auto"`` turns XLA off on CPU-only machines and under any ``tf.distribute`` strategy. tfaccel's
``"auto"`` turns it on where it is known to work *and* was measured to help, off where it fails or was not
measured, and says why. An explicit ``True`` that cannot work falls back to ``False`` with a warning.

What was checked on this stack (TF 2.21, Keras 3.15, 2-core CPU; see docs/guides/one-machine.md):

* MirroredStrategy over several devices + XLA fails ("Trying to access resource ... located in device CPU:1
  from device CPU:0").
* MultiWorkerMirroredStrategy on CPUs + XLA fails ("Collectives are not yet implemented for CPU devices when
  compiling with XLA"), with the Keras compat fix in place.
* One device on a CPU: ``"auto"`` is decided per job, once the model and the data are known
  (``tfaccel.train.xla_payback``); every plan made before that says so (``CPU_PER_JOB_NOTE``).
* GPUs and TPUs were not available here; GPU "on" follows Keras' own default for one GPU without a strategy.
"""

from typing import Any, Tuple, Union

from tfaccel.errors import ConfigError
from tfaccel.log import get_logger

__all__ = ["JIT_CHOICES", "resolve_jit", "resolve_compile_jit", "decided_per_job", "has_convolutions", "CPU_PER_JOB_NOTE"]

JIT_CHOICES = ("auto", True, False)

# On one CPU device "auto" is decided per job by tfaccel.fit (tfaccel.train.xla_payback): the plan made before the
# model exists says so, and fit's plan says what the job started with and why.
CPU_PER_JOB_NOTE = ("auto, one CPU device: decided per job by tfaccel.fit: off to start unless the decision cache "
                    "holds figures of this model that predict a shorter job with XLA; the compiled loop may turn it on "
                    "between epochs where the remaining steps pay its compilation back (FitResult.plan says what ran)")
MULTI_WORKER_CPU_NOTE = ("MultiWorkerMirroredStrategy on CPUs: XLA cannot compile collectives for CPU devices "
                         "(\"Collectives are not yet implemented for CPU devices when compiling with XLA\", TF 2.21)")
MULTI_WORKER_GPU_NOTE = ("MultiWorkerMirroredStrategy on GPUs: XLA was not measured on multi-GPU workers here; "
                         "pass jit_compile=True to try it")
HOROVOD_NOTE = ("Horovod: its all-reduce ops are not XLA-compilable unless Horovod is built with "
                "HOROVOD_ENABLE_XLA_OPS; pass jit_compile=True to try it")
TPU_NOTE = "TPU: every TPU program is compiled by XLA already; Keras' jit_compile does not apply"


def _check(requested: Any) -> Union[str, bool]:
    if isinstance(requested, bool) or requested == "auto":
        return requested
    raise ConfigError(f"jit_compile: unknown value {requested!r}; valid values are: 'auto', True, False. 'auto' "
                      "turns XLA on where it works and helps on this hardware and strategy")


def resolve_jit(requested: Union[str, bool], *, backend: Any, devices: Any) -> Tuple[bool, str]:
    """Decides whether Keras compiles the step with XLA.

    Args:
        requested: ``"auto"``, True or False.
        backend: the ``Backend`` the job runs on.
        devices: the ``DeviceInfo``.

    Returns:
        (jit on?, reason).

    Raises:
        ConfigError: ``requested`` is not ``"auto"``, True or False.

    Example:
        >>> from tfaccel.devices import DeviceInfo
        >>> from tfaccel.strategies.base import Backend
        >>> resolve_jit(False, backend=Backend("default", None), devices=DeviceInfo())
        (False, 'requested off')
    """
    requested = _check(requested)
    if requested is False:
        return False, "requested off"
    traits = backend.traits
    if traits.compiled_by_xla:
        return False, traits.compiled_by_xla
    if not backend.supports_jit:
        if requested is True:
            get_logger().warning("jit_compile=True cannot work here, falling back to jit_compile=False: %s",
                                 backend.jit_note)
            return False, f"requested on, fell back to off: {backend.jit_note}"
        return False, backend.jit_note
    if requested is True:
        return True, "requested on"
    return _auto(backend, traits, devices)


def resolve_compile_jit(at_compile: bool, *, scope_requested: Union[str, bool], backend: Any,
                        devices: Any) -> Tuple[bool, str]:
    """An explicit ``model.compile(jit_compile=...)``: the user's choice stands (an explicit True that cannot work
    here falls back to False with a warning, as ``scope(jit_compile=True)`` does).

    Raises:
        ConfigError: ``scope(jit_compile=...)`` asked for the other value explicitly (a conflict, not a pick).
    """
    if isinstance(scope_requested, bool) and scope_requested != at_compile:
        raise ConfigError(f"jit_compile: model.compile(jit_compile={at_compile}) conflicts with "
                          f"tfaccel.scope(jit_compile={scope_requested}); pass the same value to both, or leave "
                          "scope()'s at 'auto' so that the model's own setting stands")
    jit, reason = resolve_jit(at_compile, backend=backend, devices=devices)
    if jit == at_compile:
        return jit, f"jit_compile={at_compile} set at compile, kept"
    return jit, f"jit_compile={at_compile} set at compile: {reason}"


def _auto(backend: Any, traits: Any, devices: Any) -> Tuple[bool, str]:
    """``"auto"`` where XLA can work: on where it was measured to help, off with the reason elsewhere."""
    cpu_note, gpu_note = traits.xla_auto_off
    if cpu_note:
        return False, gpu_note if devices.num_gpus else cpu_note
    if traits.xla_one_replica and backend.num_replicas_in_sync == 1:
        if devices.num_gpus:
            return True, "one GPU replica: XLA fuses the step (Keras' own default for one GPU without a strategy)"
        return False, CPU_PER_JOB_NOTE
    if traits.xla_several_replicas:
        return False, backend.jit_note or traits.xla_several_replicas
    return False, f"{backend.describe(quoted=True)}: XLA not measured with it; pass jit_compile=True to try it"


def decided_per_job(requested: Union[str, bool], *, backend: Any, devices: Any) -> bool:
    """Whether ``jit_compile=requested`` is left to ``tfaccel.fit``'s per-job decision: ``"auto"`` for one replica on
    one CPU device of a backend where XLA can work (``CPU_PER_JOB_NOTE``)."""
    traits = backend.traits
    return (requested == "auto" and not isinstance(requested, bool) and not devices.num_gpus
            and not devices.tpu_address and backend.supports_jit and not traits.compiled_by_xla
            and not traits.xla_auto_off[0] and traits.xla_one_replica and backend.num_replicas_in_sync == 1)


def has_convolutions(model: Any) -> bool:
    """Whether the model has a convolution layer (Conv1D/2D/3D, depthwise, separable, transposed), nested ones
    included: XLA:CPU's convolutions were measured far slower than TensorFlow's own, so ``"auto"`` assumes a
    slow-down for such a model on a CPU until it is measured (``tfaccel.train.xla_payback.CONV_CPU_PRIOR``)."""
    import keras

    from tfaccel.compat.keras_internals import flatten_layers

    conv_types = (keras.layers.Conv1D, keras.layers.Conv2D, keras.layers.Conv3D, keras.layers.DepthwiseConv2D,
                  keras.layers.SeparableConv2D, keras.layers.Conv2DTranspose)
    return any(isinstance(layer, conv_types) for layer in flatten_layers(model))
