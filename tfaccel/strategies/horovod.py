"""The ``horovod`` backend: ring all-reduce through Horovod's low-level TensorFlow collectives, for Keras 3.

Horovod 0.28.1 (June 2023, the newest release) predates Keras 3. Its Keras integration
(``horovod.tensorflow.keras.DistributedOptimizer``) hooks Keras 2's ``_aggregate_gradients``, which Keras 3
never calls, so under Keras 3 it *silently does not average gradients* (ranks diverge); its
``BroadcastGlobalVariablesCallback`` fails with ``'Variable' object has no attribute 'ref'`` on TF >= 2.16
(horovod#4290). Both were seen on TF 2.21 / Keras 3.15. This module therefore uses only
``horovod.tensorflow``'s collectives:

* :func:`distributed_optimizer` subclasses the user's Keras 3 optimizer so that ``apply()`` first averages
  the gradients over all ranks with one grouped all-reduce (optionally fp16-compressed);
* :class:`BroadcastVariablesCallback` builds the optimizer and broadcasts model and optimizer variables from
  rank 0 at train begin, on the underlying ``tf.Variable``s (broadcasting Keras 3 variables directly fails
  with ``'SymbolicTensor' object has no attribute 'assign'``);
* :class:`GlobalMetricsCallback` sums the ranks' metric states, so every rank's logs are the global batch's;
* :func:`check_optimizer` refuses an optimizer already wrapped by ``horovod.tensorflow.keras``;
* :func:`agree_on_backup` makes every rank resume from rank 0's backup (``backup_dir``, issue 9 R1).

Batch semantics: Horovod has no ``tf.distribute`` strategy spreading a batch; each rank runs the default
strategy on its own shard. A tfaccel ``global_batch_size`` still means the global batch: each rank gets
``global_batch_size // backend.num_workers`` examples per step from shard ``backend.input_shard``.

Build Horovod first with ``bash scripts/install_horovod.sh .venv`` and start ranks with
``tfaccel launch --backend horovod -np 2 -- python train.py``.
"""

import os
from typing import Any, List, Mapping, Optional, Sequence, Tuple

import keras
import numpy as np
import tensorflow as tf

from tfaccel.errors import BackendUnavailableError, ConfigError, DeviceError, TfaccelError, invalid_choice
from tfaccel.log import get_logger
from tfaccel.strategies.base import Backend

__all__ = [
    "COMPRESSION_NAMES",
    "INSTALL_HINT",
    "BroadcastVariablesCallback",
    "GlobalMetricsCallback",
    "StopTogetherCallback",
    "agree_on_backup",
    "check_optimizer",
    "distributed_optimizer",
    "distribute_in_place",
    "import_horovod",
    "is_distributed_optimizer",
    "launched_by_horovod",
    "make_backend",
    "pin_gpu_to_local_rank",
]

#: The gradient compressions :func:`distributed_optimizer` accepts (one source of truth for CLI and docs).
COMPRESSION_NAMES: Tuple[str, ...] = ("none", "fp16")

#: make_backend's options besides devices/task (the registry lists them).
OPTION_NAMES: Tuple[str, ...] = ("compression", "pin_gpu")

INSTALL_HINT = ("Horovod 0.28.1 must be built against the installed TensorFlow: run "
                "`bash scripts/install_horovod.sh .venv` (plain `pip install horovod` cannot build against "
                "TF >= 2.19); see the README section 'Horovod'")

# Variables horovodrun (Gloo) sets in every rank; MPI launches are recognised by Horovod's own variables only.
_HOROVOD_ENV_VARS = ("HOROVOD_RANK", "HOROVOD_GLOO_RENDEZVOUS_ADDR")
_WRAPPED_ATTR = "_tfaccel_horovod_wrapped"


def launched_by_horovod(environ: Optional[Mapping[str, str]] = None) -> bool:
    """True when this process is a rank started by ``horovodrun`` (cheap: imports nothing).

    Args:
        environ: the environment to read. Defaults to ``os.environ``.

    Returns:
        Whether Horovod's rank variables are present.
    """
    env = os.environ if environ is None else environ
    return any(name in env for name in _HOROVOD_ENV_VARS)


def import_horovod() -> Any:
    """Imports ``horovod.tensorflow`` and checks that its TensorFlow ops and Gloo were built.

    Returns:
        The ``horovod.tensorflow`` module.

    Raises:
        BackendUnavailableError: Horovod is not installed, its TensorFlow ops do not load, or it was built
            without Gloo; the message says how to build it.
    """
    try:
        import horovod.tensorflow as hvd

        gloo = hvd.gloo_built()  # loads the compiled ops library
    except ImportError as exc:
        raise BackendUnavailableError(f"strategy 'horovod': cannot import horovod.tensorflow ({exc}). "
                                      f"{INSTALL_HINT}") from exc
    except Exception as exc:  # a wheel built against another TF fails to load its .so with other errors
        raise BackendUnavailableError(f"strategy 'horovod': horovod.tensorflow is installed but does not load "
                                      f"({type(exc).__name__}: {exc}); it was probably built against another "
                                      f"TensorFlow. Rebuild it: {INSTALL_HINT} (add --force)") from exc
    if not gloo:
        raise BackendUnavailableError("strategy 'horovod': this Horovod was built without Gloo, which tfaccel "
                                      f"uses to start ranks. Rebuild it: {INSTALL_HINT} (add --force)")
    return hvd


# ----------------------------------------------------------------------------------------------- optimizer

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


def _compression(name: str, hvd: Any) -> Any:
    if name not in COMPRESSION_NAMES:
        raise invalid_choice("compression", name, COMPRESSION_NAMES,
                             hint="fp16 halves the all-reduce traffic of float32 gradients")
    return hvd.Compression.fp16 if name == "fp16" else hvd.Compression.none


def _allreduce_gradients(hvd: Any, grads: Sequence[Any], *, compression: Any) -> List[Any]:
    """Averages the non-None gradients over all ranks with one grouped all-reduce; keeps the order."""
    grads = list(grads)
    # Sparse gradients (embeddings) are densified: one grouped all-reduce, identical on every rank.
    index = [i for i, g in enumerate(grads) if g is not None]
    if not index:
        return grads
    dense = [tf.convert_to_tensor(grads[i]) for i in index]
    reduced = hvd.grouped_allreduce(dense, op=hvd.Average, compression=compression)
    for i, g in zip(index, reduced):
        grads[i] = g
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
        return base.apply(self, _allreduce_gradients(hvd, grads, compression=comp), trainable_variables)

    return type(base.__name__, (base,), {
        "apply": apply,
        _WRAPPED_ATTR: True,
        "__module__": base.__module__,
        "__doc__": f"{base.__name__} whose apply() averages gradients over Horovod ranks (tfaccel).",
    })


def distribute_in_place(optimizer: Any, *, compression: str = "none", _hvd: Any = None) -> Any:
    """Makes the user's compiled optimizer average gradients over all ranks, keeping the object (and its state,
    schedule and clipping): its class is swapped for an averaging subclass. ``tfaccel.fit`` calls it on
    ``model.optimizer`` (a LossScaleOptimizer under mixed_float16, so every rank skips or applies the same steps).

    Returns:
        The same optimizer.
    """
    check_optimizer(optimizer)
    if is_distributed_optimizer(optimizer):
        return optimizer
    hvd = _hvd if _hvd is not None else import_horovod()
    optimizer.__class__ = _averaging_class(type(optimizer), hvd, _compression(compression, hvd))
    return optimizer


# ----------------------------------------------------------------------------------------------- callbacks

def _tf_variable(variable: Any) -> Any:
    """The ``tf.Variable`` behind a Keras 3 variable (Horovod's broadcast needs ``assign`` on a real one)."""
    if isinstance(variable, tf.Variable):
        return variable
    value = variable.value
    if isinstance(value, tf.Variable):
        return value
    raw = getattr(variable, "_value", None)  # .value is an autocast tensor inside an autocast scope
    if isinstance(raw, tf.Variable):
        return raw
    raise TfaccelError(f"cannot broadcast variable {getattr(variable, 'path', variable)!r}: no tf.Variable "
                       f"behind it (got {type(value).__name__}); build the model before training")


class BroadcastVariablesCallback(keras.callbacks.Callback):
    """Broadcasts model and optimizer variables from ``root_rank`` at the start of every ``fit``.

    The optimizer is built first so that its slots exist and are broadcast too. Keras 3 variables are
    broadcast through their underlying ``tf.Variable``s (see the module docstring).

    Args:
        root_rank: the rank whose values every rank takes. Defaults to 0.
    """

    def __init__(self, *, root_rank: int = 0, _hvd: Any = None) -> None:
        super().__init__()
        self.root_rank = root_rank
        self._hvd = _hvd
        self.broadcasts = 0

    def on_train_begin(self, logs: Optional[dict] = None) -> None:
        hvd = self._hvd if self._hvd is not None else import_horovod()
        model = self.model
        optimizer = getattr(model, "optimizer", None)
        if optimizer is not None and not optimizer.built:
            optimizer.build(model.trainable_variables)
        variables = list(model.variables) + (list(optimizer.variables) if optimizer is not None else [])
        hvd.broadcast_variables([_tf_variable(v) for v in variables], root_rank=self.root_rank)
        self.broadcasts += 1
        get_logger().debug("horovod: broadcast %d variables from rank %d", len(variables), self.root_rank)


class GlobalMetricsCallback(keras.callbacks.Callback):
    """Makes every rank's epoch logs (loss, metrics, ``val_*``) the metrics of the whole global batch.

    The ranks' metric *states* are summed (a Horovod all-reduce of every metric variable: totals and counts,
    confusion counts, ...), then Keras' own ``result()`` is read, as tf.distribute aggregates a metric's state
    over replicas. Averaging each rank's result instead (Horovod's own MetricAverageCallback) is wrong for every
    metric that is not a plain mean of equal-sized parts (AUC, F1Score, a loss over unequal shards). Train metrics
    are summed when validation begins (Keras then resets them), validation metrics when it ends. Put this callback
    before callbacks that act on metrics (checkpoints, early stopping, LR on plateau).
    """

    def __init__(self, *, _hvd: Any = None) -> None:
        super().__init__()
        self._hvd = _hvd
        self._train_logs: Optional[dict] = None

    def _global_results(self) -> dict:
        hvd = self._hvd if self._hvd is not None else import_horovod()
        seen: dict = {}
        for metric in self.model.metrics:
            seen.update((id(v), v) for v in metric.variables)
        variables = list(seen.values())  # the same model, so the same order on every rank
        if variables:
            summed = hvd.grouped_allreduce([tf.convert_to_tensor(_tf_variable(v)) for v in variables], op=hvd.Sum)
            for variable, value in zip(variables, summed):
                variable.assign(value)
        return {k: float(np.asarray(v)) for k, v in self.model.get_metrics_result().items() if np.ndim(v) == 0}

    def on_epoch_begin(self, epoch: int, logs: Optional[dict] = None) -> None:
        self._train_logs = None

    def on_test_begin(self, logs: Optional[dict] = None) -> None:
        if self._train_logs is None:
            self._train_logs = self._global_results()  # the train state, before evaluate resets it

    def on_test_end(self, logs: Optional[dict] = None) -> None:
        if logs is not None:
            logs.update({k: v for k, v in self._global_results().items() if k in logs})

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        if logs is None:
            return
        train = self._train_logs if self._train_logs is not None else self._global_results()
        logs.update({k: v for k, v in train.items() if k in logs})


class StopTogetherCallback(keras.callbacks.Callback):
    """After the user's per-batch callbacks: if any rank set ``model.stop_training`` (TerminateOnNaN on its local
    loss, a user's own check), every rank stops at this same step. Without it the others would go on into the
    next step's all-reduce alone and the job would hang. One scalar all-reduce per batch, so tfaccel.fit adds it
    only when a callback acts per batch."""

    def __init__(self, *, _hvd: Any = None) -> None:
        super().__init__()
        self._hvd = _hvd

    def on_train_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
        hvd = self._hvd if self._hvd is not None else import_horovod()
        stops = hvd.allreduce(tf.constant(1.0 if self.model.stop_training else 0.0), op=hvd.Sum,
                              name="tfaccel_stop_training")
        self.model.stop_training = float(stops) > 0


def agree_on_backup(state: Optional[Mapping[str, Any]], *, _hvd: Any = None) -> Optional[Mapping[str, Any]]:
    """Rank 0's backup position, for every rank: where a restarted Horovod job resumes (issue 9 R1).

    Only rank 0 writes backups (``StepBackup`` with ``is_chief``), so a rank on another host, or one that read
    ``backup_dir`` at a different moment, may see another backup or none. Every rank calls this with what it
    read; rank 0's ``(epoch, step)`` is broadcast and every rank resumes there. A rank whose own backup is not
    that one loads no file: :class:`BroadcastVariablesCallback` gives it rank 0's model and optimizer
    variables at train begin.

    Args:
        state: the ``BackupState`` this rank read from ``backup_dir`` (``tfaccel.train.backups.read_backup``), or None.

    Returns:
        None when rank 0 has no backup; ``state`` when it is rank 0's; else a ``BackupState`` at rank 0's
        position with ``weights_path`` None.
    """
    from tfaccel.train.backups import BackupState

    hvd = _hvd if _hvd is not None else import_horovod()
    mine = [1, int(state["epoch"]), int(state["step"]), int(state.get("global_step", 0))] if state else [0, 0, 0, 0]
    root = [int(v) for v in np.asarray(hvd.broadcast(tf.constant(mine, dtype=tf.int64), root_rank=0,
                                                          name="tfaccel_backup_position")).tolist()]
    if root == mine:
        return state
    if not root[0]:
        get_logger().warning("horovod: rank %d found a backup (epoch %d, step %d) but rank 0 has none; starting from "
                             "scratch like rank 0", int(hvd.rank()), mine[1], mine[2])
        return None
    get_logger().warning("horovod: rank %d resumes at rank 0's backup (epoch %d, step %d)%s; its model and optimizer "
                         "come from rank 0's broadcast", int(hvd.rank()), root[1], root[2],
                         f", not at its own (epoch {mine[1]}, step {mine[2]})" if mine[0] else
                         ", which its backup_dir does not hold (not a shared directory?)")
    return BackupState(epoch=root[1], step=root[2], global_step=root[3], weights=None, weights_path=None)


# ------------------------------------------------------------------------------------------------- devices

def pin_gpu_to_local_rank(local_rank: int, *, _backend_override: Any = None) -> Optional[int]:
    """Makes only GPU ``local_rank % num_gpus`` visible to this process (with memory growth).

    Must run before TensorFlow initialises its devices. Does nothing when there is no GPU.

    Args:
        local_rank: this rank's index on its host (``hvd.local_rank()``).

    Returns:
        The index of the pinned physical GPU, or None when there is no GPU.

    Raises:
        DeviceError: TensorFlow already initialised its devices with another GPU visible.
    """
    from tfaccel.devices import device_backend

    be = device_backend(_backend_override)
    gpus = be.list_physical_devices("GPU")
    if not gpus:
        return None
    index = local_rank % len(gpus)
    if len(gpus) < local_rank + 1:
        get_logger().warning("horovod: local rank %d shares GPU %d: only %d GPU(s) on this host for more ranks",
                             local_rank, index, len(gpus))
    if be.is_initialized():
        visible = be.get_visible_devices("GPU")
        if list(visible) == [gpus[index]]:
            return index
        raise DeviceError(f"horovod: cannot pin local rank {local_rank} to GPU {index}: TensorFlow already "
                          f"initialised its devices with {len(visible)} visible GPU(s). Create the 'horovod' "
                          "backend before any TensorFlow op runs (first thing in the script)")
    be.set_visible_devices([gpus[index]], "GPU")
    be.set_memory_growth(gpus[index], True)
    return index


# ------------------------------------------------------------------------------------------------- backend

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
    if compression not in COMPRESSION_NAMES:
        raise invalid_choice("compression", compression, COMPRESSION_NAMES,
                             hint="fp16 halves the all-reduce traffic of float32 gradients")
    hvd = _hvd if _hvd is not None else import_horovod()
    log = get_logger()
    if not launched_by_horovod():
        log.warning("horovod: this process was not started by horovodrun; it runs as a single rank. Start "
                    "ranks with `tfaccel launch --backend horovod -np N -- CMD`")
    if task is not None and getattr(task, "num_tasks", 1) > 1:
        log.warning("horovod: ignoring the %s cluster description (task %s); Horovod ranks come from horovodrun",
                    getattr(task, "source", "TF_CONFIG"), getattr(task, "name", "?"))
    hvd.init()
    if pin_gpu:
        gpu = pin_gpu_to_local_rank(hvd.local_rank(), _backend_override=_device_backend)
        if gpu is not None:
            log.info("horovod: rank %d (local %d) pinned to GPU %d", hvd.rank(), hvd.local_rank(), gpu)
    size, rank = int(hvd.size()), int(hvd.rank())

    def wrap_optimizer(optimizer: Any) -> Any:
        return distribute_in_place(optimizer, compression=compression, _hvd=hvd)

    def extra_callbacks() -> List[Any]:
        return [BroadcastVariablesCallback(root_rank=0, _hvd=hvd), GlobalMetricsCallback(_hvd=hvd)]

    def batch_sync_callbacks() -> List[Any]:
        return [StopTogetherCallback(_hvd=hvd)]

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
        wrap_optimizer=wrap_optimizer,
        extra_callbacks=extra_callbacks,
        batch_sync_callbacks=batch_sync_callbacks,
        broadcast=lambda value, name: hvd.broadcast_object(value, root_rank=0, name=name),
        agree_on_backup=lambda state: agree_on_backup(state, _hvd=hvd),
        sum_over_processes=lambda value: float(hvd.allreduce(tf.constant(float(value)), op=hvd.Sum,
                                                             name="tfaccel_preemption")),
        optimizer_change=("horovod", "optimizer averages gradients over ranks; weights broadcast from rank 0; "
                                     "metrics averaged"),
    )

