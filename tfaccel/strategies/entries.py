"""The built-in registry entries (the factories: ``tfaccel.strategies.builtin``, ``.tpu`` and the lazy Horovod
entry), and a sketch of each entry's backend for describing ``"auto"`` without building anything."""

from typing import Any, Dict, Optional, Tuple

from tfaccel.strategies import tpu
from tfaccel.strategies.base import Backend
from tfaccel.strategies.builtin import (MIRRORED_MULTI_DEVICE_JIT_NOTE, PS_JIT_NOTE, default_request, make_default,
                                        make_mirrored, make_multi_worker, make_one_device, make_parameter_server,
                                        mirrored_request, multi_worker_request, one_device_request,
                                        parameter_server_request)
from tfaccel.strategies.horovod import make_backend
from tfaccel.xla import MULTI_WORKER_CPU_NOTE

__all__ = ["BUILTIN_ENTRIES", "sketch_backend", "make_horovod"]


# --------------------------------------------------------------------------------------------------- horovod
def make_horovod(*, devices: Any, task: Optional[Any], **options: Any) -> Backend:
    """The Horovod backend (``tfaccel.strategies.horovod``; Horovod itself, an optional compiled dependency, is
    loaded when the backend starts, with its install hint)."""
    return make_backend(devices=devices, task=task, **options)


def sketch_backend(*, strategy: str, devices: Any) -> Backend:
    """The Backend entry ``strategy`` would build on ``devices``, as far as the "auto" XLA decision reads it, built
    without TensorFlow (``tfaccel.plan.describe_auto``)."""
    replicas = max(devices.num_gpus, 2) if strategy == "mirrored" else 1
    jit_off = {"mirrored": MIRRORED_MULTI_DEVICE_JIT_NOTE, "parameter_server": PS_JIT_NOTE,
               "multi_worker": "" if devices.num_gpus else MULTI_WORKER_CPU_NOTE}.get(strategy, "")
    return Backend(name=strategy, strategy=None, num_replicas_in_sync=replicas, supports_jit=not jit_off, jit_note=jit_off)


# The registry adds these (``register_strategy``'s keywords) before any other entry, the first time it is read.
# mirrored and multi_worker are collective: one of them per process (see tfaccel.strategies.registry).
BUILTIN_ENTRIES: Tuple[Dict[str, Any], ...] = (
    dict(name="default", description="TensorFlow's default strategy: one replica, no distribution",
         factory=make_default, request=default_request),
    dict(name="one_device", description="OneDeviceStrategy: everything on one device (a GPU when present)",
         factory=make_one_device, options=("device",), request=one_device_request),
    dict(name="mirrored", description="MirroredStrategy: synchronous data parallelism over the GPUs (or "
         "virtual CPUs) of one process", factory=make_mirrored, options=("device_names", "cross_device_ops"),
         request=mirrored_request, collective=True),
    dict(name="multi_worker", description="MultiWorkerMirroredStrategy: synchronous data parallelism over "
         "several processes/hosts (TF_CONFIG), with tfaccel's Keras 3 fit fix",
         factory=make_multi_worker, options=("implementation", "bytes_per_pack", "timeout_seconds",
                                            "apply_compat", "startup_timeout_seconds",
                                            "heartbeat_timeout_seconds"),
         request=multi_worker_request, collective=True),
    dict(name="parameter_server", description="ParameterServerStrategy + ClusterCoordinator: asynchronous "
         "training with ps tasks, run by tfaccel's coordinator loop (not Keras fit)",
         factory=make_parameter_server, options=("variable_partitioner", "min_shard_bytes", "max_shards"),
         request=parameter_server_request),
    dict(name="tpu", description="TPUStrategy: Cloud TPU, Colab TPU or a TPU VM (TPUClusterResolver)",
         factory=tpu.make_tpu, options=tpu.OPTIONS),
    dict(name="horovod", description="Horovod all-reduce over ranks started by horovodrun/mpirun (optional "
         "dependency)", factory=make_horovod, options=("compression", "pin_gpu")),
)
