"""The strategy registry: one entry per name, each with a description, its options and a factory.

One backend per request per process: ``get_backend`` / ``get_strategy`` (and the plan, which calls
``get_backend``) hand out the same ``Backend`` object for the same request, where a request is the resolved
registry name (``"auto"`` and the name it picks are the same request) plus the entry's normalised options and
what of the devices/task it was decided from (see ``BackendRequest``). A request for a second, different
*collective* strategy (``mirrored``, ``multi_worker``) is a ``ConfigError``: TensorFlow numbers the collective
groups of every such strategy in a process from the same key, so a second one collides with the first (two
``MultiWorkerMirroredStrategy`` objects hung both workers in 2 of 10 runs here; two ``MirroredStrategy``
objects, even over disjoint devices, failed with ``group is already full`` / ``expected shape``).
"""

import dataclasses
import inspect
import threading
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import tensorflow as tf

from tfaccel.devices import detect_devices
from tfaccel.errors import ConfigError, invalid_choice
from tfaccel.log import get_logger
from tfaccel.strategies._task import current_task
from tfaccel.strategies.auto import choose_strategy, horovod_auto_strategy_error
from tfaccel.strategies.base import Backend
from tfaccel.strategies.entries import BUILTIN_ENTRIES
from tfaccel.strategies.names import STRATEGY_NAMES, StrategyName

__all__ = ["StrategyName", "STRATEGY_NAMES", "StrategyEntry", "BackendRequest", "register_strategy",
           "strategy_entries", "get_backend", "get_strategy", "reset_backends"]


Factory = Callable[..., Backend]
RequestFn = Callable[..., Mapping[str, Any]]


@dataclasses.dataclass(frozen=True)
class StrategyEntry:
    """One registry entry.

    Attributes:
        name: the name users pass to ``get_strategy``.
        description: one line shown in errors, ``tfaccel env`` and the docs.
        factory: ``factory(*, devices, task, **options) -> Backend``.
        options: the option names the factory accepts.
        request: ``request(*, devices, task, **options) -> {key: value}``: what identifies a request of this
            entry (every option at its effective value, plus what of the devices/task the factory uses). It
            validates like the factory and builds nothing. None: the options with the factory's defaults filled
            in, plus ``devices`` and ``task`` as given.
        collective: the entry builds a strategy that runs TensorFlow collectives (at most one per process).
    """

    name: str
    description: str
    factory: Factory
    options: Tuple[str, ...] = ()
    request: Optional[RequestFn] = None
    collective: bool = False


@dataclasses.dataclass(frozen=True)
class BackendRequest:
    """What identifies a backend within a process: a registry name and its normalised options.

    Attributes:
        name: the resolved registry name (never ``"auto"``).
        options: ``((key, value), ...)`` sorted by key, values at their effective setting.
        collective: whether it builds a collective strategy (at most one per process).
    """

    name: str
    options: Tuple[Tuple[str, Any], ...]
    collective: bool = False

    def describe(self) -> str:
        """``multi_worker(implementation='ring', ...)``."""
        return f"{self.name}({', '.join(f'{k}={v!r}' for k, v in self.options)})"

    def differences(self, other: "BackendRequest") -> List[str]:
        """What differs from ``other``: ``["implementation ('ring' here, 'auto' before)", ...]``."""
        if self.name != other.name:
            return [f"the strategy ({self.name!r} here, {other.name!r} before)"]
        mine, theirs = dict(self.options), dict(other.options)
        return [f"{key} ({mine.get(key)!r} here, {theirs.get(key)!r} before)" for key in sorted({*mine, *theirs})
                if not _same(mine.get(key), theirs.get(key))]

    def same_as(self, other: "BackendRequest") -> bool:
        """Equal name and options (values compared with ``==``, objects without a working ``==`` by identity)."""
        return self.name == other.name and not self.differences(other)


_lock = threading.Lock()
_REGISTRY: Dict[str, StrategyEntry] = {}
_builtins_added = False
# The backends built in this process, with their requests. Building happens under the re-entrant lock, so two
# threads asking at once still build one backend.
_build_lock = threading.RLock()
_BACKENDS: List[Tuple[BackendRequest, Backend]] = []


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - an object whose == raises or is ambiguous (arrays) is equal only to itself
        return False


def _freeze(value: Any) -> Any:
    """Lists become tuples and dicts sorted tuples, so equal options compare equal however they were spelt."""
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))
    if isinstance(value, set):
        return frozenset(value)
    return value


def register_strategy(name: str, *, description: str, factory: Factory, options: Sequence[str] = (),
                      replace: bool = False, request: Optional[RequestFn] = None,
                      collective: bool = False) -> StrategyEntry:
    """Adds a strategy to the registry.

    Args:
        name: the registry name; ``"auto"`` is reserved.
        description: one line saying what it is and when to use it.
        factory: ``factory(*, devices, task, **options) -> Backend``.
        options: the option names the factory accepts; anything else is rejected by ``get_backend``.
        replace: allow replacing an existing entry (its cached non-collective backends are forgotten).
            Defaults to False.
        request: ``request(*, devices, task, **options) -> {key: value}``, what identifies a request (see
            ``StrategyEntry``). Defaults to None (the options with the factory's defaults, devices and task).
        collective: the strategy runs TensorFlow collectives, so a process may build only one such request.
            Defaults to False.

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
    entry = StrategyEntry(name, description, factory, tuple(options), request, bool(collective))
    with _lock:
        if name in _REGISTRY and not replace:
            raise ConfigError(f"register_strategy: {name!r} is already registered "
                              f"({_REGISTRY[name].description}); pass replace=True to replace it")
        _REGISTRY[name] = entry
    with _build_lock:
        _BACKENDS[:] = [(req, b) for req, b in _BACKENDS if req.name != name or req.collective]
    return entry


def strategy_entries() -> Dict[str, StrategyEntry]:
    """Every registered entry by name (built-in entries first)."""
    _ensure_builtins()
    with _lock:
        return dict(_REGISTRY)


def _ensure_builtins() -> None:
    """Adds the built-in entries once, ahead of any entry registered before the registry was first read."""
    global _builtins_added
    if _builtins_added:
        return

    with _lock:
        if _builtins_added:
            return
        registered_first = dict(_REGISTRY)
        _REGISTRY.clear()
        for given in BUILTIN_ENTRIES:
            _REGISTRY[given["name"]] = StrategyEntry(
                given["name"], given["description"], given["factory"], tuple(given.get("options", ())),
                given.get("request"), bool(given.get("collective", False)))
        _REGISTRY.update(registered_first)
        _builtins_added = True


def _resolve_inputs(devices: Optional[Any], task: Optional[Any]) -> Tuple[Any, Optional[Any]]:
    if devices is None:
        # Never initialise TensorFlow's runtime here: MultiWorkerMirroredStrategy must be created before it is.
        devices = detect_devices(initialise=False)
    if task is None:
        task = current_task()
    return devices, task


def count_logical_cpus() -> int:
    """The logical CPU devices of TensorFlow's runtime (virtual CPUs included); initialises the runtime."""
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

    chosen, reason = choose_strategy(devices=devices, task=task, environ=environ,
                                     count_cpus=count_logical_cpus if detected else None)
    return chosen, reason, devices, task


def _request_for(entry: StrategyEntry, devices: Any, task: Optional[Any], options: Mapping[str, Any]
                 ) -> BackendRequest:
    """The request's identity: the entry's own ``request`` hook, else the factory's defaults + devices + task."""
    if entry.request is not None:
        key = dict(entry.request(devices=devices, task=task, **options))
    else:
        try:
            params = inspect.signature(entry.factory).parameters.values()
        except (TypeError, ValueError):  # a callable without a signature: the options as given
            params = ()
        key = {p.name: p.default for p in params if p.name in entry.options and p.default is not p.empty}
        key.update(options, devices=devices, task=task)
    return BackendRequest(entry.name, tuple(sorted((k, _freeze(v)) for k, v in key.items())), entry.collective)


def _cached(request: BackendRequest) -> Optional[Backend]:
    for known, backend in _BACKENDS:
        if known.same_as(request):
            return backend
    return None


def _refuse_second_collective(request: BackendRequest, how: str) -> None:
    """A second, different collective strategy in this process would collide with the first: say so instead."""
    for known, _ in _BACKENDS:
        if not known.collective:
            continue
        raise ConfigError(
            f"strategy {request.name!r}{how}: this process already built {known.describe()}, and the request "
            f"{request.describe()} would build a second collective strategy; they differ in "
            f"{'; '.join(request.differences(known))}. TensorFlow numbers the collectives of every "
            "MirroredStrategy / MultiWorkerMirroredStrategy in a process from the same keys, so a second one "
            "collides with the first (a hang in the first variable's broadcast, or 'group is already full' / "
            "'expected shape' errors). Fix: ask for the same strategy and options as the first request (tfaccel's "
            "scope(), fit() and get_strategy()/get_backend() then hand back that one), or restart the process "
            "(in a notebook: restart the kernel) to use other options")


def _backend_for(chosen: str, reason: str, devices: Any, task: Optional[Any], options: Mapping[str, Any], *,
                 requested: str) -> Backend:
    """The backend of an already-resolved name: the one built earlier for the same request, else a new one."""
    entry = strategy_entries()[chosen]
    how = f" ('auto' chose {chosen!r} because {reason})" if requested == "auto" else ""
    unknown = sorted(set(options) - set(entry.options))
    if unknown:
        valid = ", ".join(entry.options) if entry.options else "none"
        raise ConfigError(f"strategy {chosen!r}{how}: unknown option(s) {', '.join(map(repr, unknown))}; received "
                          f"{dict((k, options[k]) for k in unknown)!r}; valid options for {chosen!r}: {valid}")
    request = _request_for(entry, devices, task, options)  # validates the options before anything is built
    log = get_logger()
    with _build_lock:
        backend = _cached(request)
        if backend is not None:
            log.debug("strategy %s: reusing the backend built earlier in this process for %s", chosen,
                      request.describe())
            return backend
        if entry.collective:
            _refuse_second_collective(request, how)
        backend = entry.factory(devices=devices, task=task, **options)
        if not backend.reason:
            backend.reason = reason
        _BACKENDS.append((request, backend))
    log.debug("strategy %s: %s", backend.name, backend.reason)
    return backend


def get_backend(name: str = "auto", *, devices: Optional[Any] = None, task: Optional[Any] = None,
                **options: Any) -> Backend:
    """Returns the backend for a strategy name: the same object for the same request within a process.

    A request is the resolved name (``"auto"`` and the name it picks are the same request) plus the entry's
    options at their effective values and what of the devices/task it was decided from. The first request builds
    the backend; later equal requests return that object, so a MultiWorkerMirroredStrategy or MirroredStrategy is
    never built twice. ``reset_backends()`` forgets the non-collective ones (for tests).

    Args:
        name: a registry name (see ``STRATEGY_NAMES``) or ``"auto"``. Defaults to ``"auto"``.
        devices: the ``DeviceInfo`` to decide from. Defaults to ``detect_devices(initialise=False)``.
        task: this process's ``TaskInfo``. Defaults to ``tfaccel.cluster.task_from_env()``.
        **options: options of the chosen entry, e.g. ``cross_device_ops="nccl"`` for ``mirrored`` or
            ``implementation="ring"`` for ``multi_worker``.

    Returns:
        A ``Backend`` whose ``reason`` says why it was chosen (when it was first built).

    Raises:
        ConfigError: unknown name or option, an option value that is not valid, or a request for a second,
            different collective strategy (``mirrored`` / ``multi_worker``) in this process.
        BackendUnavailableError: the backend cannot run here (no TPU reachable, Horovod not installed, ...).

    Example:
        >>> from tfaccel.strategies import get_backend
        >>> backend = get_backend("auto")  # doctest: +SKIP
        >>> backend.name, backend.reason  # doctest: +SKIP
        ('mirrored', 'no GPU; 2 virtual CPU devices are configured')
        >>> get_backend("mirrored") is backend  # doctest: +SKIP
        True
    """
    chosen, reason, devices, task = choose(name, devices=devices, task=task)
    return _backend_for(chosen, reason, devices, task, options, requested=name)


def get_strategy(name: str = "auto", **options: Any) -> Any:
    """Returns a ``tf.distribute.Strategy`` for a registry name or ``"auto"``: the same one for the same request.

    Same as ``get_backend(name, **options).strategy``; ``compile_and_fit`` uses the whole ``Backend``. Under
    Horovod's launch environment ``"auto"`` is an error: Horovod has no strategy (it would be TensorFlow's
    default one, and a plain ``model.fit`` under it trains one independent model per rank); the message says
    what to use instead.

    Args:
        name: a registry name or ``"auto"``. Defaults to ``"auto"``.
        **options: ``devices``/``task`` to decide from, and the chosen entry's options.

    Returns:
        The strategy.

    Raises:
        ConfigError: as ``get_backend``, and ``"auto"`` under Horovod's launch environment.

    Example:
        >>> import tfaccel
        >>> strategy = tfaccel.get_strategy("auto")  # doctest: +SKIP
        >>> with strategy.scope():  # doctest: +SKIP
        ...     model = build_model()
        >>> tfaccel.get_strategy("auto") is strategy  # doctest: +SKIP
        True
    """
    devices, task = options.pop("devices", None), options.pop("task", None)
    chosen, reason, devices, task = choose(name, devices=devices, task=task)
    if name == "auto" and chosen == "horovod":
        raise horovod_auto_strategy_error(reason)
    return _backend_for(chosen, reason, devices, task, options, requested=name).strategy


def reset_backends() -> List[BackendRequest]:
    """Forgets the non-collective backends built in this process, so the next request builds a new one (tests).

    Only ``default``, ``one_device``, ``parameter_server``, ``tpu``, ``horovod`` and registered non-collective
    entries are forgotten. Collective strategies (``mirrored``, ``multi_worker``) stay: they cannot be safely
    rebuilt in a process (a second one collides with the first in TensorFlow's collective keys: a hang or
    ``group is already full``), so they live as long as the process; restart it to change them.

    Returns:
        The requests that were forgotten.
    """
    with _build_lock:
        dropped = [req for req, _ in _BACKENDS if not req.collective]
        _BACKENDS[:] = [(req, b) for req, b in _BACKENDS if req.collective]
    return dropped


def describe_entries() -> List[Tuple[str, str, Tuple[str, ...]]]:
    """(name, description, options) of every entry, for docs and ``tfaccel env``."""
    return [(e.name, e.description, e.options) for e in strategy_entries().values()]
