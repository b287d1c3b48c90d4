"""TPUStrategy through ``TPUClusterResolver``: Colab (``COLAB_TPU_ADDR``), ``TPU_NAME``, ``"local"`` (TPU VMs)
or an explicit address; connect, initialise the TPU system once per process, build the strategy.

This machine has no TPU: the resolution and every error path are tested with an injected API (``_API``);
nothing here has run against a real TPU.
"""

import threading
from typing import Any, Optional, Set

import tensorflow as tf

from tfaccel.errors import BackendUnavailableError, ConfigError
from tfaccel.log import get_logger
from tfaccel.strategies.base import Backend

__all__ = ["OPTIONS", "make_tpu", "resolve_tpu_address"]

OPTIONS = ("tpu", "zone", "project", "cluster_resolver")
TPU_JIT_NOTE = "TPU programs are always compiled by XLA"


class _TFTpuApi:
    """The real TensorFlow calls; tests substitute an object with the same methods."""

    def resolver(self, tpu: str, zone: Optional[str], project: Optional[str]) -> Any:
        return tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu, zone=zone, project=project)

    def connect(self, resolver: Any) -> None:
        tf.config.experimental_connect_to_cluster(resolver)

    def initialize(self, resolver: Any) -> None:
        tf.tpu.experimental.initialize_tpu_system(resolver)

    def strategy(self, resolver: Any) -> Any:
        return tf.distribute.TPUStrategy(resolver)


_API: Any = _TFTpuApi()
_lock = threading.Lock()
_initialised: Set[str] = set()  # initialize_tpu_system wipes TPU memory: once per address and process


def resolve_tpu_address(tpu: Optional[str], devices: Any) -> str:
    """The TPU to connect to: the explicit ``tpu`` option, else what the environment says.

    Args:
        tpu: ``"local"`` (a TPU VM), a TPU name, ``"grpc://host:port"``, or None.
        devices: the ``DeviceInfo`` whose ``tpu_address`` comes from ``COLAB_TPU_ADDR`` / ``TPU_NAME`` / TPU VM.

    Returns:
        The address or name to hand to ``TPUClusterResolver``.

    Raises:
        ConfigError: ``tpu`` is not a non-empty string.
        BackendUnavailableError: no TPU is named and the environment names none.
    """
    if tpu is not None:
        if not isinstance(tpu, str) or not tpu.strip():
            raise ConfigError(f"tpu: tpu must be 'local', a TPU name or an address like 'grpc://10.0.0.2:8470'; "
                              f"received {tpu!r}")
        return tpu.strip()
    if devices.tpu_address:
        return devices.tpu_address
    raise BackendUnavailableError(
        "tpu: no TPU is reachable from here: none of COLAB_TPU_ADDR (Colab), TPU_NAME (Cloud TPU) or a TPU VM's "
        "environment is set, and no tpu= option was given. Pass tpu='local' on a TPU VM, tpu='<name>' or "
        "tpu='grpc://<host>:8470', or pick another strategy")


def make_tpu(*, devices: Any, task: Optional[Any], tpu: Optional[str] = None, zone: Optional[str] = None,
             project: Optional[str] = None, cluster_resolver: Any = None) -> Backend:
    """Connects to the TPU, initialises it (once per process) and builds ``TPUStrategy``.

    Args:
        devices: the ``DeviceInfo``.
        task: unused (TPU pods are described by the resolver, not TF_CONFIG).
        tpu: which TPU (see ``resolve_tpu_address``). Defaults to the environment's.
        zone: GCP zone of a named Cloud TPU. Defaults to None (the metadata server's).
        project: GCP project of a named Cloud TPU. Defaults to None.
        cluster_resolver: a ready ``TPUClusterResolver``; overrides ``tpu``/``zone``/``project``.

    Returns:
        The TPU backend (XLA always on; batches should use ``drop_remainder=True``).

    Raises:
        BackendUnavailableError: no TPU named, or connecting/initialising failed.
    """
    api = _API
    if cluster_resolver is None:
        address = resolve_tpu_address(tpu, devices)
        try:
            cluster_resolver = api.resolver(address, zone, project)
        except (ValueError, RuntimeError, OSError) as exc:  # TF raises these for unknown names / no metadata
            raise BackendUnavailableError(
                f"tpu: TPUClusterResolver could not find TPU {address!r} ({type(exc).__name__}: {exc}). Check the "
                "name/address (and zone/project for a Cloud TPU), or use tpu='local' on a TPU VM") from exc
    else:
        address = str(getattr(cluster_resolver, "master", lambda: "<given resolver>")())
    with _lock:
        try:
            if address != "local":
                api.connect(cluster_resolver)  # a TPU VM's chips are local: nothing to connect to
            if address not in _initialised:
                api.initialize(cluster_resolver)
                _initialised.add(address)
            strategy = api.strategy(cluster_resolver)
        except Exception as exc:  # noqa: BLE001 - any failure here means "this TPU cannot be used", said plainly
            raise BackendUnavailableError(
                f"tpu: connecting to / initialising TPU {address!r} failed ({type(exc).__name__}: {exc}). Is the TPU "
                "up, reachable from this host and not used by another process?") from exc
    hosts = getattr(getattr(strategy, "extended", None), "num_hosts", 1)
    get_logger().debug("TPU %s: %s replicas on %s host(s)", address, strategy.num_replicas_in_sync, hosts)
    return Backend(name="tpu", strategy=strategy, num_replicas_in_sync=strategy.num_replicas_in_sync,
                   supports_jit=True, jit_note=TPU_JIT_NOTE)
