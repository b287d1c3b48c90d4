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
from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple

import keras

from tfaccel.compat.keras_callless import build_callless_container
from tfaccel.compat.keras_compile_args import compile_jit_request
from tfaccel.compat.keras_sharded import placements
from tfaccel.compat.keras_zero import is_sharded, slot_bytes_per_device
from tfaccel.devices import detect_devices
from tfaccel.errors import ConfigError
from tfaccel.integrations.ray_train import report_callbacks
from tfaccel.log import get_logger
from tfaccel.memory import enable_recompute
from tfaccel.precision import check_output_dtype, unwrap_loss_scale
from tfaccel.resilience import job as resilience
from tfaccel.resilience.evaluator import evaluator_callbacks
from tfaccel.resilience.keras_callbacks import worker_callbacks
from tfaccel.train.data import check_data_for_backend, example_shape, prepare_data, validation_batch_size
from tfaccel.train.fit_context import FitContext
from tfaccel.train.loops import choose
from tfaccel.train.loops.multi_step import uneven_batch_warning
from tfaccel.train.optim import adapt_optimizer, restore_optimizer_class, scale_learning_rate as scale_lr
from tfaccel.train.phases import Phases
from tfaccel.train.request import FitRequest
from tfaccel.train.result import FitResult
from tfaccel.train.scope import plan_for_model
from tfaccel.train.seeds import agree_on_seed
from tfaccel.train.throughput import Throughput
from tfaccel.train.xla_payback import job_decision
from tfaccel.train.zero import give_back_callbacks, shard_optimizer_state, xla_fallback
from tfaccel.xla import decided_per_job, resolve_compile_jit

if TYPE_CHECKING:
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
    phases = Phases()
    with phases("plan_s"):
        plan, backend, requested_jit = plan_for_model(model)
    with phases("data_s"):
        data = prepare_data(request.x, request.y, sample_weight=request.sample_weight,
                            class_weight=request.class_weight, validation_split=request.validation.split,
                            validation_data=request.validation.data, batch_size=request.batch_size,
                            shuffle=request.shuffle, steps_per_epoch=request.steps_per_epoch, seed=request.seed)
        check_data_for_backend(data, num_workers=backend.num_workers, uses_keras_fit=backend.uses_keras_fit)
        given = request.validation
        request = dataclasses.replace(request, validation=dataclasses.replace(given, batch_size=validation_batch_size(
            data, batch_size=request.batch_size, validation_batch_size=given.batch_size, validation_steps=given.steps)))
    ctx = FitContext(model, request, plan, backend, requested_jit, data, _verbose(request.verbose, backend.is_chief),
                     user_callbacks=list(request.callbacks), phases=phases)
    with phases("loop_choice_s"):
        loop, loop_reason, rejected = choose(ctx)
        _warn_slow_path(ctx, loop)
    with phases("example_order_s"):
        if loop.orders_examples(ctx):
            ctx.data = dataclasses.replace(data, seed=agree_on_seed(data.seed, backend=backend,
                                                                    announce=request.verbose != 0))
    with phases("model_changes_s"):
        changes = _adapt(ctx, loop.name)
        if request.recompute is not None:
            changes["recompute"] = "blocks " + ", ".join(enable_recompute(model, request.recompute))
    with phases("resume_s"):
        state, restarts = resilience.resume(ctx)
    with phases("callbacks_s"):
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


def _adapt(ctx: FitContext, loop_name: str) -> Dict[str, Any]:
    """Everything tfaccel changes on the user's model before training, each change named for the plan."""
    model, backend, data, request = ctx.model, ctx.backend, ctx.data, ctx.request
    if getattr(model, "optimizer", None) is None or not getattr(model, "compiled", False):
        raise ConfigError("fit: the model is not compiled; call model.compile(optimizer=..., loss=...) inside "
                          "`with tfaccel.scope():` first")

    changes: Dict[str, Any] = {}
    built = build_callless_container(model)  # keras-io's GAN / VAE: no call(), unbuildable under a strategy
    if built:
        changes["build"] = built
    if backend.uses_keras_fit:  # the coordinator loop warns itself
        check_output_dtype(model)  # float16/bfloat16 outputs: the Keras mixed precision guide's warning
    accumulation = request.loop.gradient_accumulation_steps
    sharded = shard_optimizer_state(model, request.loop.shard_optimizer_state, accumulation_steps=accumulation,
                                    batch_size=data.batch_size, device_memory_bytes=_device_memory_bytes(),
                                    checkpoint_dir=request.backups.checkpoint_dir, backend=backend,
                                    input_shape=example_shape(data), callbacks=request.callbacks,
                                    backup_dir=request.backups.backup_dir, backup_freq=request.backups.backup_freq,
                                    steps_per_epoch=data.steps_per_epoch)
    if sharded:  # the plan says whether the optimizer state is sharded, and why
        changes["optimizer_state"] = sharded
        ctx.plan = dataclasses.replace(ctx.plan, notes=ctx.plan.notes + (sharded,))
    note = adapt_optimizer(model, replicas=backend.num_replicas_in_sync, accumulation_steps=accumulation)
    if note:
        changes["optimizer"] = note
    updates = max(1, (data.steps_per_epoch or 1) // accumulation)
    lr = request.learning_rate
    base = lr.base_batch_size or (data.batch_size // backend.num_replicas_in_sync if data.batch_size else None)
    # The coordinator loop (parameter_server) applies once per update; every other loop's accumulating optimizer
    # reads a schedule at the micro-batches so far (tfaccel.compat.keras_optimizer).
    per_update = accumulation if backend.uses_keras_fit else 1
    changes["learning_rate"] = scale_lr(model, lr.rule, global_batch=data.batch_size, base_batch=base,
                                        warmup_steps=int(round(lr.warmup_epochs * updates)),
                                        steps_per_update=per_update)
    backend.wrap_optimizer(model.optimizer)  # in place (Horovod): the user keeps their object
    if backend.optimizer_change:
        changes[backend.optimizer_change[0]] = backend.optimizer_change[1]

    _decide_jit(ctx, loop_name, changes)
    return changes


def _decide_jit(ctx: FitContext, loop_name: str, changes: Dict[str, Any]) -> None:
    """The one XLA decision of a job: an explicit ``compile(jit_compile=...)`` stands; else the plan's, refined on
    this model and job where ``"auto"`` is decided per job."""
    model, backend = ctx.model, ctx.backend
    devices = detect_devices()
    jit, jit_reason = bool(ctx.plan.jit_compile), ctx.plan.jit_reason
    at_compile = compile_jit_request(model)
    if at_compile != "auto":  # the user's explicit compile(jit_compile=...) stands
        jit, jit_reason = resolve_compile_jit(at_compile, scope_requested=ctx.requested_jit, backend=backend,
                                              devices=devices)
    elif decided_per_job(ctx.requested_jit, backend=backend, devices=devices):
        jit, jit_reason, ctx.xla_auto = job_decision(model, backend=backend, data=ctx.data, epochs=ctx.request.epochs,
                                                     loop_name=loop_name)
    fallback = xla_fallback(model, jit)  # sharded optimizer state across processes: collectives XLA cannot compile
    if fallback:
        get_logger().warning("jit_compile=True cannot work here, falling back to jit_compile=False: %s", fallback)
        jit, jit_reason = False, f"{jit_reason}; fell back to off: {fallback}"
    if bool(model.jit_compile) != jit or jit_reason != ctx.plan.jit_reason:  # decided on this model and job
        changes["jit_compile"] = f"{model.jit_compile} -> {jit} ({jit_reason})"
        ctx.plan = dataclasses.replace(ctx.plan, jit_compile=jit, jit_reason=jit_reason)  # what this job starts with
        model.jit_compile = jit
        model.train_function = model.test_function = model.predict_function = None


def _device_memory_bytes() -> Optional[int]:
    """The memory of the smallest visible GPU, None on CPUs (or where a GPU reports no size)."""
    sizes = [gpu.memory_mb for gpu in detect_devices().gpus]
    return min(sizes) * 2**20 if sizes and None not in sizes else None


def _add_callbacks(ctx: FitContext, state: Optional[Dict[str, Any]] = None) -> None:
    """tfaccel's callbacks around the user's: the backend's first, then the user's, then tfaccel's own."""
    backend, data, backups = ctx.backend, ctx.data, ctx.request.backups
    chief = backend.is_chief
    named: Dict[str, Any] = {"timer": Throughput(examples_per_step=data.batch_size or 0),
                             **resilience.backup_callbacks(ctx, state)}
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
    resilience.add_preemption(ctx)


def _warn_slow_path(ctx: FitContext, loop: "Loop") -> None:
    """A WARNING (on the chief) where the job leaves tfaccel's multi-step loop for a reason the user can change."""
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
    """Runs the loop from where the context starts; the ``FitResult`` (``details["phases"]``: each phase's seconds).
    A finished job's backup is removed."""
    t0 = time.perf_counter()
    try:
        with ctx.preemption.watch:
            outcome = loop.run(ctx) if ctx.start_epoch < ctx.request.epochs else None
    except BaseException:
        resilience.settle(ctx)  # the last backup durable before the error goes on
        raise
    finally:
        restore_optimizer_class(ctx.model)
        give_back_callbacks(ctx.request.callbacks)
    seconds = time.perf_counter() - t0
    _loop_phases(ctx.phases, outcome, seconds)
    with ctx.phases("result_s"):
        resilience.finish(ctx)
        result = _result(ctx, outcome, seconds)
    result.details["phases"] = ctx.phases.as_dict()
    if ctx.backend.is_chief and ctx.verbose:
        get_logger().info("%s", result.summary())
    return result


def _loop_phases(phases: Phases, outcome: Optional["LoopResult"], seconds: float) -> None:
    """The loop's seconds: what it measured itself (the compiled loop: ``to_device_s``, ``trace_s``,
    ``first_call_s``), the epochs' training (``epochs_s``), and the rest (``loop_other_s``: callbacks, validation,
    the epoch driver)."""
    own = outcome.details.pop("phases", {}) if outcome is not None else {}
    own.setdefault("epochs_s", sum(outcome.epoch_seconds) if outcome is not None else 0.0)
    for name, value in own.items():
        phases.add(name, value)
    phases.add("loop_other_s", max(0.0, seconds - sum(own.values())))


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
        details["variable_placement"] = placements(ctx.model.variables)
    if is_sharded(unwrap_loss_scale(ctx.model.optimizer)):  # ZeRO-1: the bytes of optimizer state each device holds
        details["optimizer_state_bytes"] = slot_bytes_per_device(ctx.model.optimizer, ctx.model.distribute_strategy)
    if "backup" in ctx.named:
        details["backups_written"] = ctx.named["backup"].saves
        details["backup_writer"] = ctx.named["backup"].writer.details()
    if "checkpoint" in ctx.named:
        details["checkpoints"] = list(ctx.named["checkpoint"].saved)
    details["preemption"] = ctx.preemption.details()
    history = resilience.job_history(ctx, outcome.history if outcome else {})
    return FitResult(model=ctx.model, history=history, plan=ctx.plan,
                     examples_per_sec=examples_per_sec, seconds=seconds, global_batch_size=data.batch_size,
                     steps_per_epoch=data.steps_per_epoch, steps=outcome.steps if outcome else 0,
                     resumed_from=(ctx.start_epoch, ctx.start_step) if ctx.resumed else None, details=details)
