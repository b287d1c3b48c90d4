"""The factories of the built-in tf.distribute strategies (their registry entries: ``tfaccel.strategies.entries``).

TensorFlow is imported inside the factories, never at module import.
"""

import contextlib
import functools
import numbers
from typing import Any, Dict, Optional, Sequence, Tuple

import tensorflow as tf

from tfaccel.compat import keras_mwms, keras_sharded, tf_sigterm
from tfaccel.errors import ConfigError, DeviceError, invalid_choice
from tfaccel.resilience.backup_agreement import agree_with_chief
from tfaccel.strategies import peer_health
from tfaccel.strategies._task import training_roles, worker_position
from tfaccel.strategies.base import Backend
from tfaccel.strategies.process_sum import strategy_sum
from tfaccel.xla import MULTI_WORKER_CPU_NOTE

__all__ = ["CROSS_DEVICE_OPS", "COLLECTIVE_IMPLEMENTATIONS", "MIRRORED_MULTI_DEVICE_JIT_NOTE"]

CROSS_DEVICE_OPS = ("auto", "nccl", "hierarchical_copy", "reduce_to_one_device")
COLLECTIVE_IMPLEMENTATIONS = ("auto", "ring", "nccl")
MIRRORED_MULTI_DEVICE_JIT_NOTE = (
    "jit_compile=True fails under MirroredStrategy over several devices on TF 2.21 / Keras 3 (\"Trying to access "
    "resource ... located in device CPU:1 from device CPU:0\"); Keras' own 'auto' also turns XLA off there")
PS_JIT_NOTE = ("parameter_server runs tfaccel's ClusterCoordinator loop whose step functions are scheduled on "
               "remote workers; XLA is not used there")


def _tf() -> Any:
    return tf


def _check_device_names(what: str, names: Sequence[str]) -> None:
    """Every name must parse and name a logical device of this process (TensorFlow accepts '/cpu:9' silently)."""
    tf = _tf()
    local = tf.config.list_logical_devices()
    known = {(d.device_type.upper(), int(d.name.rsplit(":", 1)[1])) for d in local}
    for name in names:
        try:
            spec = tf.DeviceSpec.from_string(name)
        except ValueError as exc:
            raise ConfigError(f"{what}: {name!r} is not a device name ({exc}); valid devices here: "
                              f"{[d.name for d in local]}") from exc
        if spec.job not in (None, "localhost") or spec.device_type is None:
            continue  # remote or partial names are TensorFlow's to resolve
        if (spec.device_type.upper(), spec.device_index or 0) not in known:
            raise ConfigError(f"{what}: no device {name!r} in this process; valid devices here: "
                              f"{[d.name for d in local]}")
    if len(set(names)) != len(names):
        raise ConfigError(f"{what}: a device is repeated; received {list(names)!r}")


def _canonical_device(name: str) -> str:
    """``'/cpu:0'``, ``'/device:CPU:0'`` and ``'/job:localhost/replica:0/task:0/device:CPU:0'`` name one device."""
    spec = _tf().DeviceSpec.from_string(name)
    if spec.job in (None, "localhost") and spec.device_type is not None:
        spec = _tf().DeviceSpec(device_type=spec.device_type.upper(), device_index=spec.device_index or 0)
    return spec.to_string()


def _cluster_key(task: Optional[Any]) -> Optional[str]:
    """This task and its cluster, as one string (part of a multi_worker / parameter_server request)."""
    if task is None:
        return None
    roles = "; ".join(f"{role} {', '.join(addrs)}" for role, addrs in training_roles(task).items())
    return f"{task.name} of {getattr(task, 'source', 'TF_CONFIG')} cluster ({roles})"


# --------------------------------------------------------------------------------------------------- default
def default_request(*, devices: Any, task: Optional[Any]) -> Dict[str, Any]:
    """Every ``default`` request is the same one (the devices and task do not change the default strategy)."""
    return {}


def make_default(*, devices: Any, task: Optional[Any]) -> Backend:
    """TensorFlow's default strategy: one replica on the default device, no distribution."""
    return Backend(name="default", strategy=_tf().distribute.get_strategy())


# ------------------------------------------------------------------------------------------------ one_device
def one_device_request(*, devices: Any, task: Optional[Any], device: Optional[str] = None) -> Dict[str, Any]:
    """Validates ``device`` (defaults to the first GPU, else the CPU) and names it canonically."""
    if device is None:
        device = "/gpu:0" if devices.num_gpus else "/cpu:0"
    if not isinstance(device, str) or not device:
        raise ConfigError(f"one_device: device must be a device name such as '/gpu:0' or '/cpu:0'; received "
                          f"{device!r}")
    _check_device_names("one_device: device", [device])
    return {"device": _canonical_device(device)}


def make_one_device(*, devices: Any, task: Optional[Any], device: Optional[str] = None) -> Backend:
    """``OneDeviceStrategy`` on ``device`` (defaults to the first GPU, else the CPU)."""
    device = one_device_request(devices=devices, task=task, device=device)["device"]
    strategy = _tf().distribute.OneDeviceStrategy(device)
    return Backend(name="one_device", strategy=strategy)


# -------------------------------------------------------------------------------------------------- mirrored
def _cross_device_ops_choice(value: Any, device_names: Sequence[str]) -> Any:
    """Validates ``cross_device_ops``; returns the instance given or the name it comes to ('auto' resolved)."""
    tf = _tf()
    if isinstance(value, tf.distribute.CrossDeviceOps):
        return value
    if not isinstance(value, str) or value not in CROSS_DEVICE_OPS:
        hint = ("'ring' is a multi-worker collective implementation: use get_strategy('multi_worker', "
                "implementation='ring')" if value == "ring" else
                "Or pass a tf.distribute.CrossDeviceOps instance")
        raise invalid_choice("mirrored: cross_device_ops", value, CROSS_DEVICE_OPS, hint=hint)
    on_gpus = bool(device_names) and all("GPU" in name.upper() for name in device_names)
    if value == "nccl" and not on_gpus:
        raise ConfigError(f"mirrored: cross_device_ops='nccl' needs GPUs; the devices here are {list(device_names)}. "
                          "Use cross_device_ops='auto' or 'reduce_to_one_device' on CPUs")
    # 'auto': TF's own choice for GPUs (NCCL collectives); on CPUs only reduction to one device works.
    return "reduce_to_one_device" if value == "auto" and not on_gpus else value


def _cross_device_ops(choice: Any) -> Any:
    """The ``CrossDeviceOps`` of a validated choice (None: TensorFlow's own)."""
    tf = _tf()
    if isinstance(choice, tf.distribute.CrossDeviceOps):
        return choice
    return {"auto": lambda: None, "nccl": tf.distribute.NcclAllReduce,
            "hierarchical_copy": tf.distribute.HierarchicalCopyAllReduce,
            "reduce_to_one_device": tf.distribute.ReductionToOneDevice}[choice]()


def mirrored_request(*, devices: Any, task: Optional[Any], device_names: Optional[Sequence[str]] = None,
                     cross_device_ops: Any = "auto") -> Dict[str, Any]:
    """Validates the options; returns the canonical device names and the cross-device ops they come to."""
    if device_names is None:
        kind = "GPU" if devices.num_gpus else "CPU"
        device_names = [d.name for d in _tf().config.list_logical_devices(kind)]
    elif isinstance(device_names, str) or not all(isinstance(d, str) and d for d in device_names) \
            or not device_names:
        raise ConfigError(f"mirrored: device_names must be a non-empty list of device names such as "
                          f"['/gpu:0', '/gpu:1']; received {device_names!r}")
    device_names = list(device_names)
    _check_device_names("mirrored: device_names", device_names)
    return {"device_names": tuple(_canonical_device(d) for d in device_names),
            "cross_device_ops": _cross_device_ops_choice(cross_device_ops, device_names)}


def make_mirrored(*, devices: Any, task: Optional[Any], device_names: Optional[Sequence[str]] = None,
                  cross_device_ops: Any = "auto") -> Backend:
    """``MirroredStrategy`` over the GPUs (or the logical CPU devices when there is no GPU)."""
    tf = _tf()
    request = mirrored_request(devices=devices, task=task, device_names=device_names,
                               cross_device_ops=cross_device_ops)
    strategy = tf.distribute.MirroredStrategy(devices=list(request["device_names"]),
                                              cross_device_ops=_cross_device_ops(request["cross_device_ops"]))
    several = strategy.num_replicas_in_sync > 1
    return Backend(name="mirrored", strategy=strategy, num_replicas_in_sync=strategy.num_replicas_in_sync,
                   supports_jit=not several, jit_note=MIRRORED_MULTI_DEVICE_JIT_NOTE if several else "")


# ---------------------------------------------------------------------------------------------- multi_worker
def _check_timeout(name: str, value: Any) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value < 0:
        raise ConfigError(f"{name}: timeout_seconds must be a number of seconds >= 0 (0 disables it) or None; "
                          f"received {value!r}")
    return float(value)


def _check_bytes_per_pack(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ConfigError(f"multi_worker: bytes_per_pack must be a whole number of bytes >= 0 (0: every gradient in "
                          f"one all-reduce, TensorFlow's default; N: all-reduces of about N bytes each, which can "
                          f"start before the whole backward pass ends); received {value!r}. "
                          f"E.g. bytes_per_pack=4 * 1024 * 1024")
    return int(value)


def _resolver_for(task: Optional[Any], devices: Any) -> Any:
    """TF_CONFIG tasks use TF's own resolver; other sources (SLURM) get one built from the TaskInfo."""
    tf = _tf()
    if task is None or getattr(task, "source", "TF_CONFIG") == "TF_CONFIG":
        return None
    cluster = tf.train.ClusterSpec({role: list(addrs) for role, addrs in task.spec.roles.items()})
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        cluster, task_type=task.task_type, task_id=task.task_index, rpc_layer="grpc",
        num_accelerators={"GPU": devices.num_gpus} if devices.num_gpus else None)


def _multi_worker_settings(devices: Any, *, implementation: Any, timeout_seconds: Any,
                           startup_timeout_seconds: Any, heartbeat_timeout_seconds: Any) -> Tuple[str, Any]:
    """Validates the options; returns (implementation, the effective ``PeerTimeouts``)."""
    if not isinstance(implementation, str) or implementation not in COLLECTIVE_IMPLEMENTATIONS:
        raise invalid_choice("multi_worker: implementation", implementation, COLLECTIVE_IMPLEMENTATIONS)
    if implementation == "nccl" and not devices.num_gpus:
        raise ConfigError("multi_worker: implementation='nccl' needs GPUs and this process sees none; use "
                          "implementation='ring' or 'auto' on CPUs")
    timeout = _check_timeout("multi_worker", timeout_seconds)
    # issue 9 (R2): bounded start-up and lost-peer detection by default, stated in the plan notes.

    return implementation, peer_health.resolve_timeouts(startup_timeout_seconds=startup_timeout_seconds,
                                                        heartbeat_timeout_seconds=heartbeat_timeout_seconds,
                                                        timeout_seconds=timeout)


def multi_worker_request(*, devices: Any, task: Optional[Any], implementation: str = "auto",
                         timeout_seconds: Optional[float] = None, apply_compat: bool = True,
                         startup_timeout_seconds: Optional[float] = None,
                         heartbeat_timeout_seconds: Optional[float] = None, bytes_per_pack: int = 0) -> Dict[str, Any]:
    """Validates the options; returns them at their effective values (timeouts resolved) and the cluster task."""
    implementation, timeouts = _multi_worker_settings(
        devices, implementation=implementation, timeout_seconds=timeout_seconds,
        startup_timeout_seconds=startup_timeout_seconds, heartbeat_timeout_seconds=heartbeat_timeout_seconds)
    return {"implementation": implementation, "bytes_per_pack": _check_bytes_per_pack(bytes_per_pack),
            "startup_timeout_seconds": timeouts.startup,
            "heartbeat_timeout_seconds": timeouts.heartbeat, "timeout_seconds": timeouts.collective,
            "apply_compat": bool(apply_compat), "task": _cluster_key(task)}



# TensorFlow 2.21's words when its runtime ran before MultiWorkerMirroredStrategy was made (a tf.data pipeline, a
# tensor or a model built first): the strategy cannot configure collectives any more, and the process cannot undo it.
_STARTED_TOO_LATE = "Collective ops must be configured at program startup"
_TOO_LATE_MESSAGE = (
    "multi_worker: TensorFlow already ran in this process before MultiWorkerMirroredStrategy was made (TensorFlow: "
    f"\"{_STARTED_TOO_LATE}\"): something used TensorFlow first, such as a tf.data pipeline, a tensor or a model "
    "built before tfaccel.scope(). Fix: enter `with tfaccel.scope():` (or call tfaccel.get_strategy()) first thing "
    "in the script, before building the dataset or the model")


def make_multi_worker(*, devices: Any, task: Optional[Any], implementation: str = "auto",
                      timeout_seconds: Optional[float] = None, apply_compat: bool = True,
                      startup_timeout_seconds: Optional[float] = None,
                      heartbeat_timeout_seconds: Optional[float] = None, bytes_per_pack: int = 0) -> Backend:
    """``MultiWorkerMirroredStrategy`` with the Keras 3 compat fix in place (see ``tfaccel.compat.keras_mwms``).

    ``implementation``, ``bytes_per_pack`` and ``timeout_seconds`` are TensorFlow's ``CommunicationOptions`` of
    every all-reduce (gradients, metrics): ``bytes_per_pack=0`` concatenates all gradients into one all-reduce.
    SIGTERM still ends the worker (``tfaccel.compat.tf_sigterm``); ``apply_compat=False`` keeps both upstream ways.

    Start-up and lost-peer (heartbeat) timeouts default to tfaccel's bounded values (see
    ``tfaccel.strategies.peer_health``), so a peer that never starts or dies fails the job instead of hanging; the
    per-collective ``timeout_seconds`` is off unless given (each collective then holds a thread for its length).
    """
    tf = _tf()
    implementation, timeouts = _multi_worker_settings(
        devices, implementation=implementation, timeout_seconds=timeout_seconds,
        startup_timeout_seconds=startup_timeout_seconds, heartbeat_timeout_seconds=heartbeat_timeout_seconds)
    impl = getattr(tf.distribute.experimental.CommunicationImplementation, implementation.upper())
    options = tf.distribute.experimental.CommunicationOptions(implementation=impl,
                                                              bytes_per_pack=_check_bytes_per_pack(bytes_per_pack),
                                                              timeout_seconds=timeouts.collective or None)
    if apply_compat:
        keras_mwms.apply()
    resolver = _resolver_for(task, devices)
    if task is not None and task.num_tasks > 1 and task.task_type in ("chief", "worker"):
        peer_health.configure_coordination(
            (resolver or tf.distribute.cluster_resolver.TFConfigClusterResolver()).cluster_spec(), timeouts)
    # TF installs a SIGTERM-swallowing preemption notifier inside this constructor (tfaccel.compat.tf_sigterm).
    sigterm_fix = tf_sigterm.around_strategy_creation() if apply_compat else contextlib.nullcontext()
    try:
        with sigterm_fix:
            strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver,
                                                                 communication_options=options)
    except tf.errors.OpError as exc:  # the start-up barrier timed out: name who never came
        raise peer_health.startup_error(exc, task=task, timeouts=timeouts) from exc
    except (RuntimeError, ValueError) as exc:
        if _STARTED_TOO_LATE in str(exc):
            raise DeviceError(_TOO_LATE_MESSAGE) from exc
        raise DeviceError(f"multi_worker: TensorFlow could not set up MultiWorkerMirroredStrategy ({exc}). Create "
                          "the strategy first thing in the process, before any TensorFlow op runs, and check "
                          "TF_CONFIG") from exc
    if task is not None:
        num_workers, index = worker_position(task)
        is_chief = bool(task.is_chief)
    else:  # a single worker without a cluster description
        num_workers, index, is_chief = 1, 0, True
    total = strategy_sum(strategy)
    return Backend(name="multi_worker", strategy=strategy, num_replicas_in_sync=strategy.num_replicas_in_sync,
                   num_workers=num_workers, worker_index=index, is_chief=is_chief,
                   supports_jit=bool(devices.num_gpus), jit_note="" if devices.num_gpus else MULTI_WORKER_CPU_NOTE,
                   notes=timeouts.notes() + ((tf_sigterm.NOTE,) if tf_sigterm.is_applied() else ()),
                   sum_over_processes=total, agree_on_backup=functools.partial(
                       agree_with_chief, total=total, is_chief=is_chief, workers=num_workers))


# ------------------------------------------------------------------------------------------ parameter_server
DEFAULT_MIN_SHARD_BYTES = 256 << 10


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"parameter_server: {name} must be an integer >= 1; received {value!r}")


def _partitioner_settings(value: Any, num_ps: int, *, min_shard_bytes: Optional[int],
                          max_shards: Optional[int]) -> Dict[str, Any]:
    """Validates the partitioner options; returns them at their effective values (defaults filled in)."""
    partitioners = _tf().distribute.experimental.partitioners
    custom = value is not None and (isinstance(value, partitioners.Partitioner) or callable(value))
    if not (value is None or custom or value == "min_size"
            or (isinstance(value, int) and not isinstance(value, bool) and value >= 1)):
        raise ConfigError(f"parameter_server: variable_partitioner must be None, a number of shards >= 1, 'min_size' "
                          f"(shards of at least min_shard_bytes, default 256 KiB, at most max_shards, default one per "
                          f"ps task) or a tf.distribute.experimental.partitioners.Partitioner; received {value!r}")
    for name, given in (("min_shard_bytes", min_shard_bytes), ("max_shards", max_shards)):
        if given is None:
            continue
        _positive_int(name, given)
        if value != "min_size":
            raise ConfigError(f"parameter_server: {name}={given!r} applies to variable_partitioner='min_size' only; "
                              f"received variable_partitioner={value!r}. Use variable_partitioner='min_size', or "
                              f"leave {name} out")
    if value != "min_size":
        return {"variable_partitioner": value}
    return {"variable_partitioner": value,
            "min_shard_bytes": DEFAULT_MIN_SHARD_BYTES if min_shard_bytes is None else min_shard_bytes,
            "max_shards": num_ps if max_shards is None else max_shards}


def _partitioner(settings: Dict[str, Any]) -> Any:
    partitioners = _tf().distribute.experimental.partitioners
    value = settings["variable_partitioner"]
    if value == "min_size":
        return partitioners.MinSizePartitioner(min_shard_bytes=settings["min_shard_bytes"],
                                               max_shards=settings["max_shards"])
    if isinstance(value, int) and not isinstance(value, bool):
        return partitioners.FixedShardsPartitioner(num_shards=value)
    return value


def _partitioner_note(settings: Dict[str, Any], num_ps: int) -> str:
    value = settings["variable_partitioner"]
    if value == "min_size":
        what = (f"'min_size': variables of at least 2 x {settings['min_shard_bytes']} bytes split along axis 0 into "
                f"shards of >= {settings['min_shard_bytes']} bytes, at most {settings['max_shards']}")
    elif isinstance(value, int):
        what = f"every variable split along axis 0 into {value} shards"
    else:
        what = f"a custom partitioner ({type(value).__name__})"
    return (f"variable_partitioner {what}, placed round-robin over the {num_ps} ps task(s); Keras 3 trains them "
            "through tfaccel.compat.keras_sharded (keras-team/keras#18624)")


def parameter_server_request(*, devices: Any, task: Optional[Any], variable_partitioner: Any = None,
                             min_shard_bytes: Optional[int] = None, max_shards: Optional[int] = None
                             ) -> Dict[str, Any]:
    """The partitioner options at their effective values and this task's cluster."""
    num_ps = len(training_roles(task).get("ps", ())) if task is not None else 0
    settings = _partitioner_settings(variable_partitioner, max(num_ps, 1), min_shard_bytes=min_shard_bytes,
                                     max_shards=max_shards)
    return {**settings, "task": _cluster_key(task)}


def make_parameter_server(*, devices: Any, task: Optional[Any], variable_partitioner: Any = None,
                          min_shard_bytes: Optional[int] = None, max_shards: Optional[int] = None) -> Backend:
    """``ParameterServerStrategy`` + ``ClusterCoordinator``, built on the chief (the coordinator).

    Worker and ps tasks do not build a strategy: they run a server (``python -m tfaccel.launch.server``).

    ``variable_partitioner`` splits large variables (embeddings) along axis 0 over the ps tasks: a number of
    shards (every variable), ``"min_size"`` (``MinSizePartitioner``: shards of at least ``min_shard_bytes``,
    default 256 KiB, at most ``max_shards``, default one per ps task) or a TensorFlow ``Partitioner``. Keras 3
    cannot train such variables by itself; ``tfaccel.compat.keras_sharded`` makes it (keras-team/keras#18624).
    """
    tf = _tf()
    if task is None:
        raise ConfigError("parameter_server: no cluster is described; set TF_CONFIG (or use a cluster file with "
                          "`tfaccel launch`) with chief, worker and ps tasks")
    roles = training_roles(task)
    missing = [role for role in ("worker", "ps") if not roles.get(role)]
    if missing:
        raise ConfigError(f"parameter_server: the cluster has no {' and no '.join(missing)} task(s); received "
                          f"roles {sorted(roles)}. ParameterServerStrategy needs worker and ps tasks (and a chief "
                          "to coordinate)")
    if task.task_type != "chief":
        raise ConfigError(f"parameter_server: this process is task {task.name}; only the chief (the coordinator) "
                          "builds ParameterServerStrategy. Run `python -m tfaccel.launch.server` on worker and ps "
                          "tasks (tfaccel launch does this)")
    settings = _partitioner_settings(variable_partitioner, len(roles["ps"]), min_shard_bytes=min_shard_bytes,
                                     max_shards=max_shards)
    partitioner = _partitioner(settings)
    if partitioner is not None:
        keras_sharded.apply()
    resolver = _resolver_for(task, devices) or tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if task.spec.roles.get("evaluator"):  # no member of the training cluster: the coordinator would wait for it
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec({role: list(addrs) for role, addrs in roles.items()}), task_type=task.task_type,
            task_id=task.task_index, rpc_layer="grpc")
    try:
        strategy = tf.distribute.experimental.ParameterServerStrategy(resolver, variable_partitioner=partitioner)
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    except (RuntimeError, ValueError) as exc:
        raise DeviceError(f"parameter_server: could not connect to the cluster ({exc}). Check that every worker "
                          "and ps task is running its server and that TF_CONFIG is the same everywhere") from exc
    return Backend(name="parameter_server", strategy=strategy, num_replicas_in_sync=strategy.num_replicas_in_sync,
                   num_workers=len(roles["worker"]), worker_index=0, is_chief=True, uses_keras_fit=False,
                   coordinator=coordinator, supports_jit=False, jit_note=PS_JIT_NOTE,
                   notes=(_partitioner_note(settings, len(roles["ps"])),) if partitioner is not None else ())
