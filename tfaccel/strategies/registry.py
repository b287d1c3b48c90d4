"""The strategy registry: one entry per name, each with a description, its options and a factory."""

import dataclasses
import threading
from typing import Any, Callable, Dict, List, Literal, Mapping, Optional, Sequence, Tuple, get_args

from tfaccel.errors import ConfigError, invalid_choice
from tfaccel.log import get_logger
from tfaccel.strategies.base import Backend

__all__ = ["StrategyName", "STRATEGY_NAMES", "StrategyEntry", "register_strategy", "strategy_entries",
           "get_backend", "get_strategy"]

StrategyName = Literal["auto", "default", "one_device", "mirrored", "multi_worker", "parameter_server", "tpu",
                       "horovod"]
# The one list of built-in names (validation, CLI choices and docs use it); "auto" picks one of the others.
STRATEGY_NAMES: Tuple[str, ...] = get_args(StrategyName)

Factory = Callable[..., Backend]


@dataclasses.dataclass(frozen=True)
class StrategyEntry:
    """One registry entry.

    Attributes:
        name: the name users pass to ``get_strategy``.
        description: one line shown in errors, ``tfaccel env`` and the docs.
        factory: ``factory(*, devices, task, **options) -> Backend``.
        options: the option names the factory accepts.
    """

    name: str
    description: str
    factory: Factory
    options: Tuple[str, ...] = ()


_lock = threading.Lock()
_REGISTRY: Dict[str, StrategyEntry] = {}


def register_strategy(name: str, *, description: str, factory: Factory, options: Sequence[str] = (),
                      replace: bool = False) -> StrategyEntry:
    """Adds a strategy to the registry.

    Args:
        name: the registry name; ``"auto"`` is reserved.
        description: one line saying what it is and when to use it.
        factory: ``factory(*, devices, task, **options) -> Backend``.
        options: the option names the factory accepts; anything else is rejected by ``get_backend``.
        replace: allow replacing an existing entry. Defaults to False.

    Returns:
        The new entry.

    Raises:
        ConfigError: the name is ``"auto"``, empty, or already registered (without ``replace=True``).

    Example:
        >>> from tfaccel.strategies import register_strategy, Backend
        >>> import tensorflow as tf  # doctest: +SKIP
        >>> register_strategy("mine", description="the default strategy, renamed",  # doctest: +SKIP
        ...                   factory=lambda *, devices, task: Backend("mine", tf.distribute.get_strategy()))
    """
    if not isinstance(name, str) or not name or name == "auto":
        raise ConfigError(f"register_strategy: name must be a non-empty string other than 'auto'; received "
                          f"{name!r}")
    if not callable(factory):
        raise ConfigError(f"register_strategy({name!r}): factory must be callable; received {factory!r}")
    entry = StrategyEntry(name, description, factory, tuple(options))
    with _lock:
        if name in _REGISTRY and not replace:
            raise ConfigError(f"register_strategy: {name!r} is already registered "
                              f"({_REGISTRY[name].description}); pass replace=True to replace it")
        _REGISTRY[name] = entry
    return entry


def strategy_entries() -> Dict[str, StrategyEntry]:
    """Every registered entry by name (built-in entries first)."""
    _ensure_builtins()
    with _lock:
        return dict(_REGISTRY)


def _ensure_builtins() -> None:
    from tfaccel.strategies import builtin  # noqa: F401 - registers the built-in entries on import


def _resolve_inputs(devices: Optional[Any], task: Optional[Any]) -> Tuple[Any, Optional[Any]]:
    from tfaccel.devices import detect_devices
    from tfaccel.strategies._task import current_task

    if devices is None:
        # Never initialise TensorFlow's runtime here: MultiWorkerMirroredStrategy must be created before it is.
        devices = detect_devices(initialise=False)
    if task is None:
        task = current_task()
    return devices, task


def _count_logical_cpus() -> int:
    import tensorflow as tf

    return len(tf.config.list_logical_devices("CPU"))


def choose(name: str = "auto", *, devices: Optional[Any] = None, task: Optional[Any] = None,
           environ: Optional[Mapping[str, str]] = None) -> Tuple[str, str, Any, Optional[Any]]:
    """Resolves a name (``"auto"`` included) without building anything.

    Returns:
        (registry name, reason, devices, task).
    """
    entries = strategy_entries()
    if not isinstance(name, str) or (name != "auto" and name not in entries):
        raise invalid_choice("strategy", name, ["auto", *entries],
                             hint="Pick one of these, or 'auto' to decide from the hardware and the cluster")
    detected = devices is None
    if devices is not None and not hasattr(devices, "num_gpus"):
        raise ConfigError(f"devices must be a tfaccel.devices.DeviceInfo (what the decision is made from); received "
                          f"{devices!r}. To choose the devices MirroredStrategy uses, pass device_names=[...]; for "
                          "OneDeviceStrategy pass device='/gpu:0'")
    devices, task = _resolve_inputs(devices, task)
    if name != "auto":
        return name, "requested explicitly", devices, task
    from tfaccel.strategies.auto import choose_strategy

    chosen, reason = choose_strategy(devices=devices, task=task, environ=environ,
                                     count_cpus=_count_logical_cpus if detected else None)
    return chosen, reason, devices, task


def get_backend(name: str = "auto", *, devices: Optional[Any] = None, task: Optional[Any] = None,
                **options: Any) -> Backend:
    """Builds the backend for a strategy name.

    Args:
        name: a registry name (see ``STRATEGY_NAMES``) or ``"auto"``. Defaults to ``"auto"``.
        devices: the ``DeviceInfo`` to decide from. Defaults to ``detect_devices(initialise=False)``.
        task: this process's ``TaskInfo``. Defaults to ``tfaccel.cluster.task_from_env()``.
        **options: options of the chosen entry, e.g. ``cross_device_ops="nccl"`` for ``mirrored`` or
            ``implementation="ring"`` for ``multi_worker``.

    Returns:
        A ``Backend`` whose ``reason`` says why it was chosen.

    Raises:
        ConfigError: unknown name or option, or an option value that is not valid.
        BackendUnavailableError: the backend cannot run here (no TPU reachable, Horovod not installed, ...).

    Example:
        >>> from tfaccel.strategies import get_backend
        >>> backend = get_backend("auto")  # doctest: +SKIP
        >>> backend.name, backend.reason  # doctest: +SKIP
        ('mirrored', 'no GPU; 2 virtual CPU devices are configured')
    """
    chosen, reason, devices, task = choose(name, devices=devices, task=task)
    entry = strategy_entries()[chosen]
    unknown = sorted(set(options) - set(entry.options))
    if unknown:
        valid = ", ".join(entry.options) if entry.options else "none"
        how = f" ('auto' chose {chosen!r} because {reason})" if name == "auto" else ""
        raise ConfigError(f"strategy {chosen!r}{how}: unknown option(s) {', '.join(map(repr, unknown))}; received "
                          f"{dict((k, options[k]) for k in unknown)!r}; valid options for {chosen!r}: {valid}")
    backend = entry.factory(devices=devices, task=task, **options)
    if not backend.reason:
        backend.reason = reason
    get_logger().debug("strategy %s: %s", backend.name, backend.reason)
    return backend


def get_strategy(name: str = "auto", **options: Any) -> Any:
    """Returns a ``tf.distribute.Strategy`` for a registry name or ``"auto"``.

    Same as ``get_backend(name, **options).strategy``; ``compile_and_fit`` uses the whole ``Backend``.

    Args:
        name: a registry name or ``"auto"``. Defaults to ``"auto"``.
        **options: ``devices``/``task`` to decide from, and the chosen entry's options.

    Returns:
        The strategy.

    Example:
        >>> import tfaccel
        >>> strategy = tfaccel.get_strategy("auto")  # doctest: +SKIP
        >>> with strategy.scope():  # doctest: +SKIP
        ...     model = build_model()
    """
    return get_backend(name, **options).strategy


def describe_entries() -> List[Tuple[str, str, Tuple[str, ...]]]:
    """(name, description, options) of every entry, for docs and ``tfaccel env``."""
    return [(e.name, e.description, e.options) for e in strategy_entries().values()]
