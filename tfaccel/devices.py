"""What devices are here, and how TensorFlow should use them.

``configure_devices`` must run before TensorFlow initialises its runtime (the first op, the first
``list_logical_devices``, the first strategy). ``detect_devices`` describes the hardware for the
"auto" decisions; both take an injectable device backend so the GPU/TPU paths are testable on a CPU.
"""

import dataclasses
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from tfaccel.errors import ConfigError, DeviceError
from tfaccel.log import get_logger

__all__ = ["GpuInfo", "DeviceInfo", "configure_devices", "detect_devices", "tpu_address_hint"]


@dataclasses.dataclass(frozen=True)
class GpuInfo:
    """One physical GPU as TensorFlow reports it."""

    index: int
    name: str
    compute_capability: Optional[Tuple[int, int]] = None
    memory_mb: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """The hardware this process can use.

    Attributes:
        gpus: the visible physical GPUs.
        num_cpu_devices: logical CPU devices (more than 1 when virtual CPUs are configured).
        tpu_address: where a TPU is reachable according to the environment (``COLAB_TPU_ADDR``,
            ``TPU_NAME``, or ``"local"`` on a TPU VM), else None.
    """

    gpus: Tuple[GpuInfo, ...] = ()
    num_cpu_devices: int = 1
    tpu_address: Optional[str] = None

    @property
    def num_gpus(self) -> int:
        return len(self.gpus)

    @property
    def min_compute_capability(self) -> Optional[Tuple[int, int]]:
        caps = [g.compute_capability for g in self.gpus if g.compute_capability is not None]
        return min(caps) if caps else None


class _TFDeviceBackend:
    """The real ``tf.config`` calls; tests substitute an object with the same methods."""

    def __init__(self) -> None:
        import tensorflow as tf  # imported lazily: importing tfaccel must stay cheap

        self._tf = tf

    def is_initialized(self) -> bool:
        from tfaccel.compat.tf_runtime import runtime_initialised  # imported lazily, as TensorFlow above

        return runtime_initialised()

    def list_physical_devices(self, device_type: str) -> List[Any]:
        return self._tf.config.list_physical_devices(device_type)

    def list_logical_devices(self, device_type: str) -> List[Any]:
        return self._tf.config.list_logical_devices(device_type)

    def get_visible_devices(self, device_type: str) -> List[Any]:
        return self._tf.config.get_visible_devices(device_type)

    def set_visible_devices(self, devices: Sequence[Any], device_type: str) -> None:
        self._tf.config.set_visible_devices(list(devices), device_type)

    def set_memory_growth(self, device: Any, enable: bool) -> None:
        self._tf.config.experimental.set_memory_growth(device, enable)

    def set_memory_limit(self, device: Any, memory_limit_mb: int) -> None:
        self._tf.config.set_logical_device_configuration(
            device, [self._tf.config.LogicalDeviceConfiguration(memory_limit=memory_limit_mb)])

    def set_virtual_devices(self, device: Any, count: int) -> None:
        self._tf.config.set_logical_device_configuration(
            device, [self._tf.config.LogicalDeviceConfiguration() for _ in range(count)])

    def get_device_details(self, device: Any) -> Dict[str, Any]:
        try:
            return dict(self._tf.config.experimental.get_device_details(device))
        except (ValueError, RuntimeError, AttributeError):
            return {}

    def get_memory_info_mb(self, device: Any) -> Optional[int]:
        return None  # TF only reports total memory after initialisation; details carry what it knows


def device_backend(backend: Optional[Any] = None) -> Any:
    """``backend`` (a test's stand-in for ``tf.config``), else the one that calls TensorFlow's ``tf.config``."""
    return backend if backend is not None else _TFDeviceBackend()


def configure_devices(
    *,
    visible_gpus: Optional[Sequence[int]] = None,
    memory_growth: bool = True,
    memory_limit_mb: Optional[int] = None,
    virtual_cpus: Optional[int] = None,
    _backend_override: Optional[Any] = None,
) -> Dict[str, Any]:
    """Configures which devices TensorFlow uses. Call it once, before any TensorFlow op runs.

    Everything is validated before anything is changed, so a bad argument leaves TensorFlow untouched.

    Args:
        visible_gpus: indices of the physical GPUs to use (the ``CUDA_VISIBLE_DEVICES`` equivalent through
            ``tf.config``); ``[]`` hides every GPU. Defaults to None (all GPUs stay visible).
        memory_growth: let GPU memory grow on demand instead of reserving it all. Ignored for GPUs that get a
            ``memory_limit_mb`` (TensorFlow cannot combine the two). Defaults to True.
        memory_limit_mb: cap each visible GPU at this many MiB through a logical device. Defaults to None.
        virtual_cpus: split the CPU into this many logical devices so multi-replica code (MirroredStrategy)
            runs on a CPU-only machine. Defaults to None (one CPU device).

    Returns:
        What was configured: ``{"visible_gpus": [...], "memory_growth": bool, "memory_limit_mb": ...,
        "virtual_cpus": int, "changed": bool}``.

    Raises:
        ConfigError: an argument is out of range (bad GPU index, non-positive memory limit or CPU count).
        DeviceError: TensorFlow has already initialised its devices.

    Example:
        >>> import tfaccel
        >>> tfaccel.configure_devices(virtual_cpus=2)["virtual_cpus"]  # doctest: +SKIP
        2
    """
    be = device_backend(_backend_override)
    _check_counts(memory_limit_mb, virtual_cpus)
    gpus = be.list_physical_devices("GPU")
    _check_visible_gpus(visible_gpus, len(gpus))
    chosen = [gpus[i] for i in visible_gpus] if visible_gpus is not None else list(gpus)
    cpus = be.list_physical_devices("CPU")

    if be.is_initialized():
        if _already_matches(be, visible_gpus, chosen, memory_limit_mb, virtual_cpus):
            return _summary(visible_gpus, chosen, gpus, memory_growth, memory_limit_mb, virtual_cpus, changed=False)
        raise DeviceError(
            "configure_devices() was called after TensorFlow initialised its devices, so it can no longer change "
            f"them (asked for visible_gpus={visible_gpus!r}, memory_limit_mb={memory_limit_mb!r}, "
            f"virtual_cpus={virtual_cpus!r}). Call tfaccel.configure_devices(...) first thing in the process, "
            "before creating tensors, models or strategies (or pass the same settings to compile_and_fit).")

    _apply(be, chosen if visible_gpus is not None else None, chosen, memory_limit_mb=memory_limit_mb,
           memory_growth=memory_growth, cpu=cpus[0] if cpus and virtual_cpus is not None else None,
           virtual_cpus=virtual_cpus)
    summary = _summary(visible_gpus, chosen, gpus, memory_growth, memory_limit_mb, virtual_cpus, changed=True)
    get_logger().debug("configured devices: %s", summary)
    return summary


def _apply(be: Any, visible: Optional[List[Any]], chosen: List[Any], *, memory_limit_mb: Optional[int],
           memory_growth: bool, cpu: Optional[Any], virtual_cpus: Optional[int]) -> None:
    """Makes ``visible`` the visible GPUs (None: leave them), limits or grows each chosen GPU's memory and splits
    ``cpu`` into ``virtual_cpus`` logical devices (when more than one).

    Raises:
        DeviceError: TensorFlow refused (another thread initialised it meanwhile).
    """
    try:
        if visible is not None:
            be.set_visible_devices(visible, "GPU")
        for gpu in chosen:
            if memory_limit_mb is not None:
                be.set_memory_limit(gpu, memory_limit_mb)
            elif memory_growth:
                be.set_memory_growth(gpu, True)
        if virtual_cpus is not None and virtual_cpus > 1 and cpu is not None:
            be.set_virtual_devices(cpu, virtual_cpus)
    except RuntimeError as exc:  # a race with another thread initialising TF; say so plainly
        raise DeviceError(f"TensorFlow refused the device configuration: {exc}. Call configure_devices() before "
                          "any TensorFlow op runs.") from exc


def _check_counts(memory_limit_mb: Any, virtual_cpus: Any) -> None:
    """configure_devices' memory limit and CPU count (ConfigError naming the one that is wrong)."""
    if memory_limit_mb is not None and (isinstance(memory_limit_mb, bool) or not isinstance(memory_limit_mb, int)
                                        or memory_limit_mb <= 0):
        raise ConfigError(f"memory_limit_mb must be a positive whole number of MiB; received {memory_limit_mb!r}. "
                          "Example: configure_devices(memory_limit_mb=4096)")
    if virtual_cpus is not None and (isinstance(virtual_cpus, bool) or not isinstance(virtual_cpus, int)
                                     or virtual_cpus < 1):
        raise ConfigError(f"virtual_cpus must be a whole number >= 1; received {virtual_cpus!r}. "
                          "Example: configure_devices(virtual_cpus=2)")


def _check_visible_gpus(visible_gpus: Any, num_gpus: int) -> None:
    """configure_devices' GPU indices: whole numbers, each an existing GPU, none repeated."""
    if visible_gpus is None:
        return
    if isinstance(visible_gpus, (str, bytes)) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in visible_gpus):
        raise ConfigError(f"visible_gpus must be a list of GPU indices; received {visible_gpus!r}. "
                          "Example: configure_devices(visible_gpus=[0, 1])")
    bad = [i for i in visible_gpus if not 0 <= i < num_gpus]
    if bad:
        valid = f"0..{num_gpus - 1}" if num_gpus else "none (no GPU is visible to TensorFlow here)"
        raise ConfigError(f"visible_gpus: GPU index {bad[0]} does not exist; received {list(visible_gpus)!r}, "
                          f"valid indices: {valid}")
    if len(set(visible_gpus)) != len(visible_gpus):
        raise ConfigError(f"visible_gpus: an index is repeated; received {list(visible_gpus)!r}")


def _already_matches(be: Any, visible_gpus: Optional[Sequence[int]], chosen: List[Any],
                     memory_limit_mb: Optional[int], virtual_cpus: Optional[int]) -> bool:
    """After initialisation, asking again for what is already in force is not an error (idempotent set-up)."""
    if memory_limit_mb is not None:
        return False
    if visible_gpus is not None and [d.name for d in be.get_visible_devices("GPU")] != [d.name for d in chosen]:
        return False
    if virtual_cpus is not None and len(be.list_logical_devices("CPU")) != virtual_cpus:
        return False
    return True


def _summary(visible_gpus: Optional[Sequence[int]], chosen: List[Any], gpus: List[Any], memory_growth: bool,
             memory_limit_mb: Optional[int], virtual_cpus: Optional[int], *, changed: bool) -> Dict[str, Any]:
    indices = list(visible_gpus) if visible_gpus is not None else list(range(len(gpus)))
    return {
        "visible_gpus": indices,
        "memory_growth": bool(memory_growth and memory_limit_mb is None and chosen),
        "memory_limit_mb": memory_limit_mb,
        "virtual_cpus": virtual_cpus if virtual_cpus is not None else 1,
        "changed": changed,
    }


def tpu_address_hint(environ: Optional[Dict[str, str]] = None) -> Optional[str]:
    """Where the environment says a TPU is: ``COLAB_TPU_ADDR`` (Colab), ``TPU_NAME``, or ``"local"`` on a TPU VM."""
    env = os.environ if environ is None else environ
    if env.get("COLAB_TPU_ADDR"):
        return "grpc://" + env["COLAB_TPU_ADDR"]
    if env.get("TPU_NAME"):
        return env["TPU_NAME"]
    if env.get("TPU_ACCELERATOR_TYPE") or env.get("TPU_WORKER_ID") is not None and env.get("TPU_WORKER_HOSTNAMES"):
        return "local"
    return None


def _parse_capability(details: Dict[str, Any]) -> Optional[Tuple[int, int]]:
    cap = details.get("compute_capability")
    if isinstance(cap, (tuple, list)) and len(cap) == 2:
        return int(cap[0]), int(cap[1])
    if isinstance(cap, str) and "." in cap:
        major, minor = cap.split(".", 1)
        return int(major), int(minor)
    return None


def detect_devices(*, _backend_override: Optional[Any] = None, environ: Optional[Dict[str, str]] = None,
                   initialise: bool = True) -> DeviceInfo:
    """Describes the devices this process can use.

    Args:
        initialise: count logical CPU devices, which initialises TensorFlow's runtime. Defaults to True;
            pass False to keep ``configure_devices`` possible afterwards.

    Returns:
        A ``DeviceInfo``.
    """
    be = device_backend(_backend_override)
    gpus = []
    for index, dev in enumerate(be.get_visible_devices("GPU")):
        details = be.get_device_details(dev)
        memory = details.get("memory_mb") or be.get_memory_info_mb(dev)
        gpus.append(GpuInfo(index=index, name=str(details.get("device_name") or dev.name),
                            compute_capability=_parse_capability(details),
                            memory_mb=int(memory) if memory else None))
    num_cpu = len(be.list_logical_devices("CPU")) if initialise else 1
    return DeviceInfo(gpus=tuple(gpus), num_cpu_devices=max(num_cpu, 1), tpu_address=tpu_address_hint(environ))
