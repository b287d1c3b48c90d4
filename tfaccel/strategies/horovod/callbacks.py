"""Keras callbacks for Horovod ranks (variables broadcast from rank 0, metrics over the global batch, stopping
together) and the agreement on where a restarted job resumes."""

from typing import Any, Callable, Mapping, Optional

import keras
import numpy as np
import tensorflow as tf

from tfaccel.compat.keras_zero_ranks import unsharded_variables
from tfaccel.errors import ConfigError, TfaccelError
from tfaccel.log import get_logger
from tfaccel.resilience.backup_agreement import backup_position
from tfaccel.resilience.backups import BackupState
from tfaccel.strategies.horovod.runtime import import_horovod

__all__ = ["BroadcastVariablesCallback", "GlobalMetricsCallback", "StopTogetherCallback", "agree_on_backup"]


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
        # A sharded optimizer's slots are held by their owners alone (shapes differ per rank): not broadcast.
        variables = list(model.variables) + (unsharded_variables(optimizer) if optimizer is not None else [])
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


def _check_every_rank_reads(hvd: Any, *, same: bool, state: list) -> None:
    """Raises on every rank unless every rank read rank 0's backup (one all-reduce, every rank calls it)."""
    missing = int(float(hvd.allreduce(tf.constant(0.0 if same else 1.0), op=hvd.Sum, name="tfaccel_backup_shards")))
    if missing:
        raise ConfigError(f"backup_dir: rank 0's backup (epoch {state[1]}, step {state[2]}) holds optimizer state "
                          f"sharded over the ranks, one shard file each, and {missing} of {int(hvd.size())} ranks "
                          "read another backup or none from their backup_dir (not a shared directory?); every rank "
                          "must read the same backup_dir (a shared file system), or resume with "
                          "shard_optimizer_state=False from a backup written without it")



def agree_on_backup(state: Optional[Mapping[str, Any]], *, reread: Optional[Callable[[], Any]] = None,
                    _hvd: Any = None) -> Optional[Mapping[str, Any]]:
    """Rank 0's backup position, for every rank: where a restarted Horovod job resumes (issue 9 R1).

    Only rank 0 writes backups (``StepBackup`` with ``is_chief``), so a rank on another host, or one that read
    ``backup_dir`` at a different moment, may see another backup or none. Every rank calls this with what it
    read; rank 0's ``(epoch, step)`` is broadcast and every rank resumes there. A rank whose own backup is not
    that one loads no file: :class:`BroadcastVariablesCallback` gives it rank 0's model and optimizer
    variables at train begin.

    A rank whose read differs from rank 0's reads ``backup_dir`` once more (``reread``) before it settles for the
    broadcast: it may have read it before rank 0's last backup of the same processes was on disk (a ``fit`` that
    ended with an error, then ``fit`` again: each rank waits for its own writes before the error goes on, not for
    the others'); rank 0 broadcasts its position only once its own backup is durable.

    Args:
        state: the ``BackupState`` this rank read from ``backup_dir`` (``tfaccel.resilience.backups.read_backup``), or None.
        reread: reads ``backup_dir`` again (None: no second read).

    Returns:
        None when rank 0 has no backup; ``state`` when it is rank 0's; else a ``BackupState`` at rank 0's
        position with ``weights_path`` None.

    Raises:
        ConfigError: on every rank, when rank 0's backup holds optimizer state sharded over the ranks (each rank
            loads its own slots from the shard files, so none can take them from a broadcast) and a rank read
            another backup or none.
    """
    hvd = _hvd if _hvd is not None else import_horovod()
    mine = backup_position(state)
    root = [int(v) for v in np.asarray(hvd.broadcast(tf.constant(mine, dtype=tf.int64), root_rank=0,
                                                          name="tfaccel_backup_position")).tolist()]
    if root != mine and root[0] and reread is not None:
        state = reread()
        mine = backup_position(state)
    if root[4]:  # sharded optimizer state: every rank loads its slots from the shard files, so reads that backup
        _check_every_rank_reads(hvd, same=root == mine, state=root)
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
