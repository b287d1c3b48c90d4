"""``prepare`` a ``fit`` request into a ``FitContext`` (data, loop, resume, optimizer, XLA, callbacks), ``train`` it.

``prepare`` does, in order: the plan the model was built under, the one preparation of the data, the choice of
the loop (``tfaccel.train.loops.choose``), one seed for every process where tfaccel orders the examples, what
tfaccel changes on the model (optimizer adaptation, learning-rate scaling, XLA, recomputation), the resume from
a backup, tfaccel's callbacks, steps per execution, and the plan's announcement. ``train`` runs the loop and
makes the ``FitResult``.
"""

import dataclasses
import sys
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from tfaccel.errors import ConfigError
from tfaccel.log import get_logger
from tfaccel.train.data import FitData
from tfaccel.train.fit_context import FitContext
from tfaccel.train.request import FitRequest
from tfaccel.train.result import FitResult

if TYPE_CHECKING:
    from tfaccel.plan import Plan
    from tfaccel.strategies.base import Backend
    from tfaccel.train.loops.base import Loop, LoopResult

__all__ = ["FitContext", "prepare", "train"]


def _verbose(verbose: Any, chief: bool) -> int:
    if verbose == "auto":
        return (1 if sys.stdout.isatty() else 2) if chief else 0
    return int(verbose) if chief else 0


def prepare(model: Any, request: FitRequest) -> Tuple[FitContext, "Loop"]:
    """The context of one ``fit`` call and the loop that trains it (see the module doc for the order).

    Raises:
        ConfigError: what the data, the loop, the backup or the model cannot honour, before training starts.
    """
    from tfaccel.train.data import agree_on_seed, check_data_for_backend, prepare_data
    from tfaccel.train.keras_callbacks import keras_resume_epoch, worker_callbacks
    from tfaccel.train.loops import choose
    from tfaccel.train.restarts import restarts_details
    from tfaccel.train.scope import plan_for_model

    plan, backend, requested_jit = plan_for_model(model)
    data = prepare_data(request.x, request.y, sample_weight=request.sample_weight, class_weight=request.class_weight,
                        validation_split=request.validation.split, validation_data=request.validation.data,
                        batch_size=request.batch_size, shuffle=request.shuffle,
                        steps_per_epoch=request.steps_per_epoch, seed=request.seed)
    check_data_for_backend(data, num_workers=backend.num_workers, uses_keras_fit=backend.uses_keras_fit)
    ctx = FitContext(model, request, plan, backend, requested_jit, data, _verbose(request.verbose, backend.is_chief),
                     user_callbacks=list(request.callbacks))
    loop, loop_reason, rejected = choose(ctx)
    _warn_slow_path(ctx, loop)
    if loop.orders_examples(ctx):
        ctx.data = dataclasses.replace(data, seed=agree_on_seed(data.seed, backend=backend,
                                                                announce=request.verbose != 0))
    changes = _adapt(ctx, loop.name)
    if request.recompute is not None:
        from tfaccel.memory import enable_recompute

        changes["recompute"] = "blocks " + ", ".join(enable_recompute(model, request.recompute))
    _check_elastic(ctx)
    state, (start_epoch, ctx.start_step) = _resume(ctx)
    start_epoch = max(start_epoch, keras_resume_epoch(ctx.user_callbacks, model=model, backend=backend))
    ctx.start_epoch, ctx.resumed = max(start_epoch, request.initial_epoch), state is not None
    restarts = restarts_details(request.backups.backup_dir, resumed_from=(ctx.start_epoch, ctx.start_step)
                                if ctx.resumed else None, backup=state, steps_per_epoch=ctx.data.steps_per_epoch or 0,
                                is_chief=backend.is_chief)
    ctx.user_callbacks = worker_callbacks(ctx.user_callbacks, backend=backend)  # the chief alone writes user paths
    _add_callbacks(ctx, state)
    spe = loop.steps_per_execution(ctx)
    if spe is not None:
        if spe[0] != model.steps_per_execution:
            model.steps_per_execution, model.train_function = spe[0], None
        changes["steps_per_execution"] = f"{spe[0]} ({spe[1]})"
    _announce(ctx, loop_reason=loop_reason, changes=changes)
    ctx.details = {"loop": loop_reason, "loop_name": loop.name, "loops_rejected": rejected, "data": ctx.data.note,
                   "seed": ctx.data.seed,
                   **changes, "restarts": restarts}
    if "journal" in ctx.named:
        ctx.details["world_size"] = ctx.named["journal"].record(ctx.start_epoch, ctx.start_step)["world_size_changes"]
    return ctx, loop


def _check_elastic(ctx: FitContext) -> None:
    """An elastic job (``tfaccel launch --workers MIN:MAX``): its batches must split evenly over every size."""
    from tfaccel.train.elastic import check_elastic_batch, elastic_range, per_replica_statistics

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


def _resume(ctx: FitContext) -> tuple:
    """(state, (epoch, step)) of the backup to resume from; the weights and optimizer state are loaded."""
    from tfaccel.train.backup_check import check_position
    from tfaccel.train.backups import load_backup_weights, read_backup

    backup_dir, backend, model = ctx.request.backups.backup_dir, ctx.backend, ctx.model
    state = read_backup(backup_dir)
    if state and state.get("format") and backend.uses_keras_fit:
        raise ConfigError(f"backup_dir {backup_dir}: holds {state['weights']}, a {state['format']} backup written by "
                          f"a parameter_server job; {backend.describe()} resumes only from its own Keras weight "
                          "backups. Resume it with strategy='parameter_server', or give this job another backup_dir")
    if backup_dir:  # Horovod: only rank 0 writes backups, so every rank resumes from rank 0's
        state = backend.agree_on_backup(state)
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


def _adapt(ctx: FitContext, loop_name: str) -> Dict[str, Any]:
    """Everything tfaccel changes on the user's model before training, each change named for the plan."""
    from tfaccel.train.optim import adapt_optimizer, scale_learning_rate as scale_lr

    model, backend, data, request = ctx.model, ctx.backend, ctx.data, ctx.request
    if getattr(model, "optimizer", None) is None or not getattr(model, "compiled", False):
        raise ConfigError("fit: the model is not compiled; call model.compile(optimizer=..., loss=...) inside "
                          "`with tfaccel.scope():` first")
    from tfaccel.compat.keras_callless import build_callless_container

    changes: Dict[str, Any] = {}
    built = build_callless_container(model)  # keras-io's GAN / VAE: no call(), unbuildable under a strategy
    if built:
        changes["build"] = built
    if backend.uses_keras_fit:  # the coordinator loop warns itself
        from tfaccel.precision import check_output_dtype

        check_output_dtype(model)  # float16/bfloat16 outputs: the Keras mixed precision guide's warning
    accumulation = request.loop.gradient_accumulation_steps
    note = adapt_optimizer(model, replicas=backend.num_replicas_in_sync, accumulation_steps=accumulation)
    if note:
        changes["optimizer"] = note
    updates = max(1, (data.steps_per_epoch or 1) // accumulation)
    lr = request.learning_rate
    base = lr.base_batch_size or (data.batch_size // backend.num_replicas_in_sync if data.batch_size else None)
    changes["learning_rate"] = scale_lr(model, lr.rule, global_batch=data.batch_size, base_batch=base,
                                        warmup_steps=int(round(lr.warmup_epochs * updates)))
    backend.wrap_optimizer(model.optimizer)  # in place (Horovod): the user keeps their object
    if backend.optimizer_change:
        changes[backend.optimizer_change[0]] = backend.optimizer_change[1]
    from tfaccel.devices import detect_devices
    from tfaccel.xla import decided_per_job

    devices = detect_devices()
    jit, jit_reason = bool(ctx.plan.jit_compile), ctx.plan.jit_reason
    if decided_per_job(ctx.requested_jit, backend=backend, devices=devices):
        from tfaccel.train.xla_payback import job_decision

        jit, jit_reason, ctx.xla_auto = job_decision(model, backend=backend, data=data, epochs=request.epochs,
                                                     loop_name=loop_name)
    if bool(model.jit_compile) != jit or jit_reason != ctx.plan.jit_reason:  # decided on this model and job
        changes["jit_compile"] = f"{model.jit_compile} -> {jit} ({jit_reason})"
        ctx.plan = dataclasses.replace(ctx.plan, jit_compile=jit, jit_reason=jit_reason)  # what this job starts with
        model.jit_compile = jit
        model.train_function = model.test_function = model.predict_function = None
    return changes


def _add_callbacks(ctx: FitContext, state: Optional[Dict[str, Any]] = None) -> None:
    """tfaccel's callbacks around the user's: the backend's first, then the user's, then tfaccel's own."""
    import keras

    from tfaccel.integrations.ray_train import report_callbacks
    from tfaccel.train.backups import ChiefCheckpoint, StepBackup, Throughput
    from tfaccel.train.evaluator import evaluator_callbacks

    backend, data, backups = ctx.backend, ctx.data, ctx.request.backups
    chief = backend.is_chief
    named: Dict[str, Any] = {"timer": Throughput(examples_per_step=data.batch_size or 0)}
    if backups.backup_dir and backend.uses_keras_fit:  # parameter_server: the coordinator loop writes its own
        named["journal"] = _journal(ctx, state)  # before the backup: an epoch's backup holds that epoch's logs
        named["backup"] = StepBackup(backups.backup_dir, save_freq=backups.backup_freq, is_chief=chief,
                                     step_offset=ctx.start_step, steps_per_epoch=data.steps_per_epoch or 0,
                                     record=named["journal"].record)
    if backups.checkpoint_dir:
        named["checkpoint"] = ChiefCheckpoint(backups.checkpoint_dir, is_chief=chief,
                                              every_worker_saves=backend.traits.every_worker_saves)
    after = (list(backend.batch_sync_callbacks()) if ctx.per_batch else []) + list(named.values())
    after += evaluator_callbacks(checkpoint_dir=backups.checkpoint_dir, checkpoints=named.get("checkpoint"),
                                 is_chief=chief)
    if backups.tensorboard_dir and chief:
        after.append(keras.callbacks.TensorBoard(backups.tensorboard_dir))
    after += report_callbacks(is_chief=chief, checkpoint_dir=backups.checkpoint_dir)  # after the checkpoint
    # Backend callbacks first: Horovod's metric averaging must run before a user's EarlyStopping or checkpoint
    # reads the metrics, or ranks could stop at different epochs and hang.
    ctx.callbacks = list(backend.extra_callbacks()) + ctx.user_callbacks + after
    ctx.named = named
    _add_preemption(ctx)


def _add_preemption(ctx: FitContext) -> None:
    """The job's preemption watch; on the Keras paths its callback goes last, after every epoch-end writer."""
    from tfaccel.train.preemption import make_preemption, preemption_callback
    from tfaccel.train.restarts import Progress

    backend, backup, backup_dir = ctx.backend, ctx.named.get("backup"), ctx.request.backups.backup_dir
    task = f"process {backend.worker_index} of {backend.num_workers}" if backend.uses_keras_fit else "the coordinator"
    progress = Progress(backup_dir, is_chief=backend.is_chief, steps_per_epoch=ctx.data.steps_per_epoch or 0)
    ctx.preemption = make_preemption(backend, save=backup.save if backup is not None else None,
                                     can_save=bool(backup_dir), epochs=ctx.request.epochs, task=task, progress=progress)
    if backend.uses_keras_fit:  # parameter_server: the coordinator loop checks between its joins
        ctx.named["preemption"] = preemption_callback(ctx.preemption, steps_per_epoch=ctx.data.steps_per_epoch or 0,
                                                      step_offset=ctx.start_step)
        ctx.callbacks.append(ctx.named["preemption"])


def _journal(ctx: FitContext, state: Optional[Dict[str, Any]]) -> Any:
    """The world size and finished epochs a backup records; logs each change of world size on the chief."""
    import os

    from tfaccel.train.elastic import RESIZE_FROM_ENV, RESIZE_REASON_ENV, journal_callback, world_size_changes

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


def _warn_slow_path(ctx: FitContext, loop: "Loop") -> None:
    """A WARNING (on the chief) where the job leaves tfaccel's multi-step loop for a reason the user can change."""
    from tfaccel.train.loops.multi_step import uneven_batch_warning

    if loop.name != "multi_step" and ctx.backend.is_chief and ctx.request.loop.loop != "keras":
        warning = uneven_batch_warning(ctx.backend, ctx.data)
        if warning:
            get_logger().warning("%s", warning)


def _announce(ctx: FitContext, *, loop_reason: str, changes: Dict[str, Any]) -> None:
    if not ctx.backend.is_chief:
        return
    log = get_logger()  # the details at DEBUG; the one INFO line of a job is its result's summary (train())
    log.debug("plan: %s", ctx.plan.summary())
    log.debug("data: %s; loop: %s%s", ctx.data.note, loop_reason, "".join(f"; {k}: {v}" for k, v in changes.items()))


def train(ctx: FitContext, loop: "Loop") -> FitResult:
    """Runs the loop from where the context starts; the ``FitResult``. A finished job's backup is removed."""
    from tfaccel.train.backups import remove_backup
    from tfaccel.train.optim import restore_optimizer_class

    t0 = time.perf_counter()
    try:
        with ctx.preemption.watch:
            outcome = loop.run(ctx) if ctx.start_epoch < ctx.request.epochs else None
    finally:
        restore_optimizer_class(ctx.model)
    seconds = time.perf_counter() - t0
    if ctx.request.backups.backup_dir and ctx.backend.is_chief:
        remove_backup(ctx.request.backups.backup_dir)  # training completed: nothing to resume any more
    result = _result(ctx, outcome, seconds)
    if ctx.backend.is_chief and ctx.verbose:
        get_logger().info("%s", result.summary())
    return result


def _timed_epochs(start_epoch: int, epochs_run: int) -> str:
    """What ``examples_per_sec`` is measured over: the epochs after the first one run (which traces and compiles)."""
    first, last = start_epoch + (2 if epochs_run > 1 else 1), start_epoch + epochs_run
    if epochs_run == 0:
        return "no epoch run"
    return (f"epoch {first}" if first == last else f"epochs {first}-{last}") + (
        ", the first left out (it traces and compiles)" if epochs_run > 1 else ", tracing and compiling included")


def _result(ctx: FitContext, outcome: Optional["LoopResult"], seconds: float) -> FitResult:
    data, details = ctx.data, ctx.details
    epoch_seconds = outcome.epoch_seconds if outcome else []
    timed = epoch_seconds[1:] if len(epoch_seconds) > 1 else epoch_seconds
    per_epoch = data.num_examples or (data.batch_size or 0) * (data.steps_per_epoch or 0)
    examples_per_sec = len(timed) * per_epoch / sum(timed) if timed and sum(timed) > 0 else 0.0
    details["examples_per_sec_over"] = _timed_epochs(ctx.start_epoch, len(epoch_seconds))
    if outcome is not None and "examples_per_sec" in outcome.details:  # parameter_server: counted on the ps
        examples_per_sec = outcome.details.pop("examples_per_sec")
        details["examples_per_sec_over"] = "every epoch, examples counted on the ps"
    if outcome is not None:
        details.update(outcome.details)
    if not ctx.backend.uses_keras_fit:  # parameter_server: how each large variable was placed over the ps tasks
        from tfaccel.compat.keras_sharded import placements

        details["variable_placement"] = placements(ctx.model.variables)
    if "backup" in ctx.named:
        details["backups_written"] = ctx.named["backup"].saves
    if "checkpoint" in ctx.named:
        details["checkpoints"] = list(ctx.named["checkpoint"].saved)
    details["preemption"] = ctx.preemption.details()
    history = outcome.history if outcome else {}
    if "journal" in ctx.named:  # a resumed job: the finished epochs its backup recorded come first
        from tfaccel.train.elastic import merged_history

        history = merged_history(ctx.named["journal"].before, history)
    return FitResult(model=ctx.model, history=history, plan=ctx.plan,
                     examples_per_sec=examples_per_sec, seconds=seconds, global_batch_size=data.batch_size,
                     steps_per_epoch=data.steps_per_epoch, steps=outcome.steps if outcome else 0,
                     resumed_from=(ctx.start_epoch, ctx.start_step) if ctx.resumed else None, details=details)
