"""Gradient averaging for Keras 3 optimizers over Horovod ranks, and the refusal of Horovod's own Keras 2 wrapper
(which Keras 3 never calls, so ranks would silently diverge)."""

from typing import Any, Dict, List, Optional, Sequence, Tuple

import keras
import tensorflow as tf

from tfaccel.compat.keras_zero import is_sharded
from tfaccel.errors import ConfigError, invalid_choice
from tfaccel.precision import unwrap_loss_scale
from tfaccel.strategies.horovod.runtime import import_horovod

__all__ = ["COMPRESSION_NAMES", "check_compression", "is_distributed_optimizer", "check_optimizer",
           "allreduce_gradients", "distributed_optimizer", "distribute_in_place"]

#: The gradient compressions :func:`distributed_optimizer` accepts (one source of truth for CLI and docs).
COMPRESSION_NAMES: Tuple[str, ...] = ("none", "fp16")

_WRAPPED_ATTR = "_tfaccel_horovod_wrapped"


def is_distributed_optimizer(optimizer: Any) -> bool:
    """True when ``optimizer`` is tfaccel's Keras 3 Horovod wrapper (from :func:`distributed_optimizer`)."""
    return bool(getattr(type(optimizer), _WRAPPED_ATTR, False))


def _upstream_wrapper_class(optimizer: Any) -> Optional[type]:
    """The class in the optimizer's MRO that Horovod's own Keras integration created, if any."""
    if is_distributed_optimizer(optimizer):
        return None
    for cls in type(optimizer).__mro__:
        for value in vars(cls).values():
            func = getattr(value, "__func__", value)
            module = getattr(func, "__module__", "") or ""
            if callable(func) and module.split(".")[0] == "horovod":
                return cls
    return None


def check_optimizer(optimizer: Any) -> None:
    """Refuses optimizers that cannot train correctly under the Horovod backend with Keras 3.

    ``horovod.tensorflow.keras.DistributedOptimizer`` (and ``horovod.keras``'s) overrides Keras 2's
    ``_aggregate_gradients``; Keras 3 never calls it, so with Keras 3 such an optimizer trains each rank on
    its own gradients without any error (seen with horovod 0.28.1, TF 2.21, Keras 3.15).

    Args:
        optimizer: the optimizer given to ``compile_and_fit`` / ``model.compile``.

    Raises:
        ConfigError: ``optimizer`` was wrapped by Horovod's own Keras integration, or is not a Keras 3
            optimizer.
    """
    upstream = _upstream_wrapper_class(optimizer)
    if upstream is not None:
        base = next((c.__name__ for c in type(optimizer).__mro__[1:]
                     if c.__module__.split(".")[0] != "horovod" and c is not upstream), "the optimizer")
        raise ConfigError(
            f"optimizer: received {type(optimizer).__name__} wrapped by Horovod's Keras 2 integration "
            f"({upstream.__module__}.{upstream.__qualname__}), e.g. horovod.tensorflow.keras.DistributedOptimizer. "
            "Under Keras 3 it silently does not average gradients (ranks diverge). Pass the plain Keras 3 "
            f"optimizer (e.g. keras.optimizers.{base}(...)) and let strategy='horovod' wrap it, or wrap it "
            "yourself with tfaccel.strategies.horovod.distributed_optimizer(optimizer)")
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ConfigError(f"optimizer: received {type(optimizer).__module__}.{type(optimizer).__name__}, which is "
                          "not a Keras 3 optimizer; valid: an instance of keras.optimizers.Optimizer "
                          "(e.g. keras.optimizers.Adam(1e-3))")


def check_compression(name: str) -> None:
    """Raises ``ConfigError`` unless ``name`` is one of :data:`COMPRESSION_NAMES`."""
    if name not in COMPRESSION_NAMES:
        raise invalid_choice("compression", name, COMPRESSION_NAMES,
                             hint="fp16 halves the all-reduce traffic of float32 gradients")


def _compression(name: str, hvd: Any) -> Any:
    check_compression(name)
    return hvd.Compression.fp16 if name == "fp16" else hvd.Compression.none


def allreduce_gradients(hvd: Any, grads: Sequence[Any], *, compression: Any, name: Optional[str] = None) -> List[Any]:
    """Averages the non-None gradients over all ranks; keeps the order, and keeps sparse gradients sparse.

    Dense gradients go through one grouped all-reduce. A sparse gradient (``tf.IndexedSlices``: an embedding's)
    is all-gathered, every rank's slices in rank order with their values divided by the number of ranks, as
    ``MirroredStrategy`` concatenates the replicas' slices: Keras' optimizers apply duplicate indices slice by slice
    (Adam's update for two slices of one row differs from its update for their sum), so densifying would train
    another model than Keras' own fit.

    Args:
        name: names every collective (``<name>_dense``, ``<name>_values_<i>``, ...) regardless of the name scope,
            for ranks whose train functions differ (Horovod matches ops across ranks by name). Default: Horovod's
            own names.
    """
    def named(suffix: str) -> Dict[str, Any]:
        return {"name": f"{name}_{suffix}", "ignore_name_scope": True} if name else {}

    grads = list(grads)
    dense = [i for i, g in enumerate(grads) if g is not None and not isinstance(g, tf.IndexedSlices)]
    if dense:
        reduced = hvd.grouped_allreduce([tf.convert_to_tensor(grads[i]) for i in dense], op=hvd.Average,
                                        compression=compression, **named("dense"))
        for i, g in zip(dense, reduced):
            grads[i] = g
    for i, g in enumerate(grads):
        if isinstance(g, tf.IndexedSlices):
            values = hvd.allgather(g.values, **named(f"values_{i}")) / tf.cast(hvd.size(), g.values.dtype)
            grads[i] = tf.IndexedSlices(values, hvd.allgather(g.indices, **named(f"indices_{i}")),
                                        dense_shape=g.dense_shape)
    return grads


def distributed_optimizer(optimizer: Any, *, compression: str = "none", _hvd: Any = None) -> Any:
    """Wraps a Keras 3 optimizer so that ``apply()`` averages gradients over all Horovod ranks first.

    The result is an instance of a subclass of ``type(optimizer)`` made from ``optimizer.get_config()``, so
    it must be called before the optimizer is built (before ``fit``). Wrapping twice returns the same object.
    Under a ``mixed_float16`` global policy the optimizer is first put in a ``LossScaleOptimizer``, so the
    all-reduce happens before the finite check and every rank skips or applies the same steps.

    Args:
        optimizer: a Keras 3 optimizer, not yet built.
        compression: ``"none"`` or ``"fp16"`` (gradients are sent as float16, averaged, cast back).
            Defaults to ``"none"``.

    Returns:
        The wrapped optimizer.

    Raises:
        ConfigError: the optimizer is Horovod's Keras 2 wrapper, not a Keras 3 optimizer, already built, or
            ``compression`` is unknown.
        BackendUnavailableError: Horovod is not built (see ``scripts/install_horovod.sh``).

    Example:
        >>> opt = distributed_optimizer(keras.optimizers.Adam(1e-3), compression="fp16")  # doctest: +SKIP
        >>> model.compile(optimizer=opt, loss="mse")  # doctest: +SKIP
    """
    check_optimizer(optimizer)
    if is_distributed_optimizer(optimizer):
        return optimizer
    hvd = _hvd if _hvd is not None else import_horovod()
    comp = _compression(compression, hvd)
    if optimizer.built:
        raise ConfigError(f"optimizer: received a built {type(optimizer).__name__} (it already has variables); "
                          "wrap it for Horovod before the first fit/build, e.g. "
                          "distributed_optimizer(keras.optimizers.Adam(1e-3))")
    if (keras.mixed_precision.dtype_policy().name == "mixed_float16"
            and not isinstance(optimizer, keras.optimizers.LossScaleOptimizer)):
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return _averaging_class(type(optimizer), hvd, comp).from_config(optimizer.get_config())


def _averaging_class(base: type, hvd: Any, comp: Any) -> type:
    """A subclass of ``base`` (same name and module, so saved files name the plain Keras class) whose
    ``apply()`` averages the gradients over all ranks first."""

    def apply(self: Any, grads: Sequence[Any], trainable_variables: Optional[Sequence[Any]] = None) -> Any:
        return base.apply(self, allreduce_gradients(hvd, grads, compression=comp), trainable_variables)

    return type(base.__name__, (base,), {
        "apply": apply,
        _WRAPPED_ATTR: True,
        "__module__": base.__module__,
        "__doc__": f"{base.__name__} whose apply() averages gradients over Horovod ranks (tfaccel).",
    })


def distribute_in_place(optimizer: Any, *, compression: str = "none", _hvd: Any = None) -> Any:
    """Makes the user's compiled optimizer average gradients over all ranks, keeping the object (and its state,
    schedule and clipping): its class is swapped for an averaging subclass. An optimizer sharded over the ranks
    (``shard_optimizer_state=True``, :mod:`tfaccel.strategies.horovod.zero`), or a LossScaleOptimizer around one,
    averages in its own update: unchanged. ``tfaccel.fit`` calls it on ``model.optimizer`` (a LossScaleOptimizer
    under mixed_float16, so every rank skips or applies the same steps).

    Returns:
        The same optimizer.
    """
    check_optimizer(optimizer)
    if is_distributed_optimizer(optimizer) or is_sharded(unwrap_loss_scale(optimizer)):  # sharded: averages itself
        return optimizer
    hvd = _hvd if _hvd is not None else import_horovod()
    optimizer.__class__ = _averaging_class(type(optimizer), hvd, _compression(compression, hvd))
    return optimizer
