"""What the training flow asks of resilience, in one place: where to resume, the callbacks that back the job up,
the preemption watch, and what a finished job leaves behind.

``tfaccel.train.context`` calls, in order: :func:`resume` (the elastic check, the backup read and loaded, the
position to start from), :func:`backup_callbacks` (the journal, the step backup, the chief's checkpoints),
:func:`add_preemption` (last, after every epoch-end writer), then, after the loop, :func:`finish` and
:func:`job_history`. The launchers use :mod:`tfaccel.resilience.contract` (environment) and
:mod:`tfaccel.resilience.restarts` (restart records) directly.
"""

import os
from typing import Any, Dict, List, Optional, Tuple

from tfaccel.compat.keras_zero_accumulate import update_boundary
from tfaccel.errors import ConfigError
from tfaccel.log import get_logger
from tfaccel.resilience.backup_check import check_position
from tfaccel.resilience.backups import ChiefCheckpoint, StepBackup, load_backup_weights, read_backup, remove_backup
from tfaccel.resilience.contract import RESIZE_FROM_ENV, RESIZE_REASON_ENV, elastic_range
from tfaccel.resilience.elastic import (check_elastic_batch, journal_callback, merged_history, per_replica_statistics,
                                        world_size_changes)
from tfaccel.resilience.keras_callbacks import keras_resume_epoch
from tfaccel.resilience.preemption import make_preemption, preemption_callback
from tfaccel.resilience.restarts import Progress, restarts_details
from tfaccel.train.fit_context import FitContext

__all__ = ["resume", "backup_callbacks", "add_preemption", "settle", "finish", "job_history"]


def resume(ctx: FitContext) -> Tuple[Optional[Dict[str, Any]], List[Dict[str, Any]]]:
    """Sets ``ctx.start_epoch``, ``ctx.start_step`` and ``ctx.resumed`` from the backup (its weights and optimizer
    state loaded) or the user's ``BackupAndRestore``; ``(the backup's state or None, details["restarts"])``.

    Raises:
        ConfigError: an elastic job's batch that does not split over every size, or a backup this job cannot use.
    """
    _check_elastic(ctx)
    state, (start_epoch, ctx.start_step) = _read_and_load(ctx)
    start_epoch = max(start_epoch, keras_resume_epoch(ctx.user_callbacks, model=ctx.model, backend=ctx.backend))
    ctx.start_epoch, ctx.resumed = max(start_epoch, ctx.request.initial_epoch), state is not None
    restarts = restarts_details(ctx.request.backups.backup_dir, resumed_from=(ctx.start_epoch, ctx.start_step)
                                if ctx.resumed else None, backup=state, steps_per_epoch=ctx.data.steps_per_epoch or 0,
                                is_chief=ctx.backend.is_chief)
    return state, restarts


def backup_callbacks(ctx: FitContext, state: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """tfaccel's callbacks that back the job up, by role: ``journal`` and ``backup`` (``backup_dir``, the Keras
    paths; the parameter-server coordinator writes its own) and ``checkpoint`` (``checkpoint_dir``)."""
    backend, data, backups = ctx.backend, ctx.data, ctx.request.backups
    named: Dict[str, Any] = {}
    if backups.backup_dir and backend.uses_keras_fit:
        named["journal"] = _journal(ctx, state)  # before the backup: an epoch's backup holds that epoch's logs
        named["backup"] = StepBackup(backups.backup_dir, save_freq=backups.backup_freq, is_chief=backend.is_chief,
                                     step_offset=ctx.start_step, steps_per_epoch=data.steps_per_epoch or 0,
                                     record=named["journal"].record, total=backend.sum_over_processes)
    if backups.checkpoint_dir:
        named["checkpoint"] = ChiefCheckpoint(backups.checkpoint_dir, is_chief=backend.is_chief,
                                              every_worker_saves=backend.traits.every_worker_saves)
    return named


def settle(ctx: FitContext) -> None:
    """Waits for the backup in flight when the loop stopped with an error, so that the job's last backup is on disk
    before the error goes on (a restart resumes from it). A write that failed is logged: the loop's error is the one
    raised."""
    backup = ctx.named.get("backup")
    if backup is None:
        return
    try:
        backup.writer.wait()
    except Exception as exc:  # noqa: BLE001 - the error that stopped the loop is the one to raise
        get_logger().warning("backup: the write in flight when the loop stopped failed: %s: %s", type(exc).__name__,
                             exc)


def finish(ctx: FitContext) -> None:
    """A job that completed leaves nothing to resume: the chief removes its backup (once no write is pending)."""
    if "backup" in ctx.named:
        ctx.named["backup"].writer.wait()
    if ctx.request.backups.backup_dir and ctx.backend.is_chief:
        remove_backup(ctx.request.backups.backup_dir)


def job_history(ctx: FitContext, history: Dict[str, List[float]]) -> Dict[str, List[float]]:
    """The whole job's history: a resumed job's finished epochs (from its backup's journal) before this run's."""
    if "journal" in ctx.named:
        return merged_history(ctx.named["journal"].before, history)
    return history


def _check_elastic(ctx: FitContext) -> None:
    """An elastic job (``tfaccel launch --workers MIN:MAX``): its batches must split evenly over every size."""
    workers = elastic_range()
    if workers is not None:
        backend, data = ctx.backend, ctx.data
        check_elastic_batch(batch_size=data.batch_size, num_examples=data.num_examples, what=data.what,
                            workers=workers,
                            replicas_per_worker=max(1, backend.num_replicas_in_sync // max(1, backend.num_workers)))
        per_replica = per_replica_statistics(ctx.model)
        if per_replica and backend.is_chief:
            get_logger().warning("elastic: %s normalize(s) with each replica's own batch statistics, so the "
                                 "training changes when the world size (and the per-replica batch) does; "
                                 "BatchNormalization(synchronized=True) uses the whole global batch",
                                 ", ".join(per_replica[:5]))


def _read_and_load(ctx: FitContext) -> tuple:
    """(state, (epoch, step)) of the backup to resume from; the weights and optimizer state are loaded."""
    backup_dir, backend, model = ctx.request.backups.backup_dir, ctx.backend, ctx.model
    state = read_backup(backup_dir)
    if state and state.get("format") and backend.uses_keras_fit:
        raise ConfigError(f"backup_dir {backup_dir}: holds {state['weights']}, a {state['format']} backup written by "
                          f"a parameter_server job; {backend.describe()} resumes only from its own Keras weight "
                          "backups. Resume it with strategy='parameter_server', or give this job another backup_dir")
    if backup_dir:  # every process resumes from the chief's backup (Horovod: rank 0's; multi_worker: the chief's)
        state = backend.agree_on_backup(state, lambda: read_backup(backup_dir))
    if not state or not backend.uses_keras_fit:
        return state, (state.epoch, state.step) if state else (0, 0)
    if not model.built:
        raise ConfigError("resuming from backup_dir needs a built model: give the model an Input layer "
                          "(keras.Input(shape)) so its weights exist before training")
    with backend.scope():
        # model.optimizer: under mixed_float16 the LossScaleOptimizer, whose own variables the backup holds too.
        model.optimizer.build(model.trainable_variables)
    if state["weights_path"]:  # None: a Horovod rank without rank 0's file gets rank 0's broadcast
        load_backup_weights(model, state, backup_dir=backup_dir)
    # Keras weight backups only: the coordinator checks its own (in updates, gradient accumulation included).
    check_position(state, backup_dir=backup_dir, steps_per_epoch=ctx.data.steps_per_epoch)
    return state, (state.epoch, state.step)


def add_preemption(ctx: FitContext) -> None:
    """The job's preemption watch; on the Keras paths its callback goes last, after every epoch-end writer."""
    backend, backup, backup_dir = ctx.backend, ctx.named.get("backup"), ctx.request.backups.backup_dir
    task = f"process {backend.worker_index} of {backend.num_workers}" if backend.uses_keras_fit else "the coordinator"
    progress = Progress(backup_dir, is_chief=backend.is_chief, steps_per_epoch=ctx.data.steps_per_epoch or 0)
    # the stop's backup is on disk before the process exits 75 (save_durably waits for the background write)
    ctx.preemption = make_preemption(backend, save=backup.save_durably if backup is not None else None,
                                     can_save=bool(backup_dir), epochs=ctx.request.epochs, task=task, progress=progress,
                                     update_every=update_boundary(ctx.model.optimizer))
    if backend.uses_keras_fit:  # parameter_server: the coordinator loop checks between its joins
        ctx.named["preemption"] = preemption_callback(ctx.preemption, steps_per_epoch=ctx.data.steps_per_epoch or 0,
                                                      step_offset=ctx.start_step)
        ctx.callbacks.append(ctx.named["preemption"])


def _journal(ctx: FitContext, state: Optional[Dict[str, Any]]) -> Any:
    """The world size and finished epochs a backup records; logs each change of world size on the chief."""
    backend, previous = ctx.backend, os.environ.get(RESIZE_FROM_ENV, "")
    changes = world_size_changes(state, workers=backend.num_workers, reason=os.environ.get(RESIZE_REASON_ENV),
                                 previous=int(previous) if previous.isdigit() else None)
    if len(changes) > len((state or {}).get("world_size_changes", [])) and backend.is_chief:
        get_logger().warning("elastic: world size %(from)d -> %(to)d workers at epoch %(epoch)d step %(step)d "
                             "(%(reason)s); same global batch, per-replica batch recomputed", changes[-1])
    backups = ctx.request.backups
    return journal_callback(state, workers=backend.num_workers, replicas=backend.num_replicas_in_sync,
                            changes=changes, save_freq=backups.backup_freq,
                            steps_per_epoch=ctx.data.steps_per_epoch or 0,
                            metric_state=not backend.traits.shards_by_rank)
