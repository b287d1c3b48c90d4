"""The ``horovod`` registry entry: Horovod initialised and described as a tfaccel ``Backend``."""

from typing import Any, Tuple

import tensorflow as tf

from tfaccel.errors import ConfigError
from tfaccel.log import get_logger
from tfaccel.strategies.base import Backend
from tfaccel.strategies.horovod.callbacks import (BroadcastVariablesCallback, GlobalMetricsCallback,
                                                  StopTogetherCallback, agree_on_backup)
from tfaccel.strategies.horovod.optimizer import check_compression, distribute_in_place
from tfaccel.strategies.horovod.runtime import import_horovod, launched_by_horovod, pin_gpu_to_local_rank
from tfaccel.strategies.horovod.zero import shard_optimizer

__all__ = ["OPTION_NAMES", "make_backend"]

#: make_backend's options besides devices/task (the registry lists them).
OPTION_NAMES: Tuple[str, ...] = ("compression", "pin_gpu")


def make_backend(*, devices: Any = None, task: Any = None, compression: str = "none", pin_gpu: bool = True,
                 _hvd: Any = None, _device_backend: Any = None, **options: Any) -> Backend:
    """Initialises Horovod and describes it as a tfaccel ``Backend`` (the ``"horovod"`` registry entry).

    Args:
        devices: this host's ``DeviceInfo`` (informational; GPUs are pinned from what TensorFlow lists).
        task: the cluster task from TF_CONFIG/SLURM, if any. Horovod ignores it (ranks come from horovodrun).
        compression: gradient compression for the all-reduce, one of ``COMPRESSION_NAMES``.
            Defaults to ``"none"``.
        pin_gpu: make only the GPU of this rank's local index visible. Defaults to True.

    Returns:
        ``Backend(name="horovod", strategy=<default strategy>, num_replicas_in_sync=size, num_workers=size,
        worker_index=rank, is_chief=rank == 0, supports_jit=False, wrap_optimizer=<Keras 3 all-reduce
        wrapper>, extra_callbacks=<[BroadcastVariablesCallback, GlobalMetricsCallback]>)``.

    Raises:
        ConfigError: an unknown option or compression.
        BackendUnavailableError: Horovod is not built here.
    """
    if options:
        raise ConfigError(f"strategy 'horovod': unknown option(s) {sorted(options)}; valid options are: "
                          f"{', '.join(OPTION_NAMES)}")
    check_compression(compression)
    hvd = _hvd if _hvd is not None else import_horovod()
    _init(hvd, task, pin_gpu=pin_gpu, device_backend=_device_backend)
    size, rank = int(hvd.size()), int(hvd.rank())
    return Backend(
        name="horovod",
        strategy=tf.distribute.get_strategy(),
        num_replicas_in_sync=size,
        num_workers=size,
        worker_index=rank,
        is_chief=rank == 0,
        reason=f"Horovod with {size} rank(s) (Gloo ring all-reduce), this is rank {rank}",
        supports_jit=False,
        jit_note="Horovod's all-reduce ops are not XLA ops (horovod 0.28.1 only has experimental XLA ops "
                 "behind HOROVOD_ENABLE_XLA_OPS), so the train step cannot be jit-compiled",
        wrap_optimizer=lambda optimizer: distribute_in_place(optimizer, compression=compression, _hvd=hvd),
        extra_callbacks=lambda: [BroadcastVariablesCallback(root_rank=0, _hvd=hvd), GlobalMetricsCallback(_hvd=hvd)],
        batch_sync_callbacks=lambda: [StopTogetherCallback(_hvd=hvd)],
        broadcast=lambda value, name: hvd.broadcast_object(value, root_rank=0, name=name),
        agree_on_backup=lambda state, reread: agree_on_backup(state, reread=reread, _hvd=hvd),
        sum_over_processes=lambda value: float(hvd.allreduce(tf.constant(float(value)), op=hvd.Sum,
                                                             name="tfaccel_sum_over_processes")),
        shard_optimizer=lambda model, **where: shard_optimizer(model, hvd=hvd, compression=compression, **where),
        optimizer_change=("horovod", "optimizer averages gradients over ranks; weights broadcast from rank 0; "
                                     "metrics averaged"),
    )


def _init(hvd: Any, task: Any, *, pin_gpu: bool, device_backend: Any) -> None:
    """``hvd.init()``, saying when this process was not started by horovodrun or has a cluster task Horovod
    ignores, and pins this rank to its GPU."""
    log = get_logger()
    if not launched_by_horovod():
        log.warning("horovod: this process was not started by horovodrun; it runs as a single rank. Start "
                    "ranks with `tfaccel launch --backend horovod -np N -- CMD`")
    if task is not None and getattr(task, "num_tasks", 1) > 1:
        log.warning("horovod: ignoring the %s cluster description (task %s); Horovod ranks come from horovodrun",
                    getattr(task, "source", "TF_CONFIG"), getattr(task, "name", "?"))
    hvd.init()
    if pin_gpu:
        gpu = pin_gpu_to_local_rank(hvd.local_rank(), _backend_override=device_backend)
        if gpu is not None:
            log.info("horovod: rank %d (local %d) pinned to GPU %d", hvd.rank(), hvd.local_rank(), gpu)
