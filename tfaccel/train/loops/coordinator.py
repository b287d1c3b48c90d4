"""The parameter-server loop: the user's compiled Keras 3 model trained by a ClusterCoordinator, as ``fit`` would.

Keras 3 ``fit`` does not run ParameterServerStrategy (keras-team/keras#18624), so this loop schedules the steps
itself. Each step is Keras' ``train_step`` taken apart only where PS needs it: the model's forward pass, its own
``compute_loss`` (compiled loss, ``model.losses``, sample weights), its loss tracker and ``compute_metrics``, the
user's optimizer (schedule, clipping, loss scaling). The example order is a function of ``(seed, epoch)`` and
is chosen by the coordinator: every closure gets the indices of its batches and gathers them from the arrays
held on its worker (a per-worker dataset built on the worker), so each epoch sees every example once, the
partial last batch included, whichever worker runs which batch. With one worker this is ``fit``'s own order.
A ``dataset_fn(input_context)`` is called for each worker with ``InputContext(num_workers, worker index)``
(``tfaccel.train.loops.ps_input``), so every worker streams its own files and no example passes through the
coordinator; an epoch is ``steps_per_epoch`` batches taken from whichever workers run the closures.

Step accounting: ClusterCoordinator runs a closure again when its worker is lost, and the updates it had already
applied stay. Every update is counted on the ps right after it is applied, per worker, with its examples;
``details["ps_accounting"]`` reports them against what was scheduled (``ps_step.Accounting``).

Pitfalls handled here (measured on TF 2.21 / Keras 3.15 with real ps/worker processes):

* The optimizer is built inside the strategy scope, or its slot variables land on the chief.
* Keras 3 ``Variable.assign_add`` is ``assign(read + value)``; concurrent workers lost updates of
  ``optimizer.iterations`` (143 of 200). The counters are switched to TensorFlow's atomic ``assign_add``.
* Keras metric objects miscount inside scheduled functions (3072 of 4096 examples). The metric updates of a step
  run in a ``keras.StatelessScope`` that starts every metric variable at zero, so a closure returns its batches'
  totals; the coordinator adds them up and writes them into the model's metrics, whose ``result()`` then gives
  Keras' logs. Exact for metrics whose state is a sum of per-batch values (``Mean``/``Sum`` and every
  ``MeanMetricWrapper``: accuracy variants, mae, mse, ...); others are refused.

Backups (``backup_dir``): only the coordinator knows how far training got, so it writes a ``tf.train.Checkpoint``
of model, optimizer and step counter after ``coordinator.join()`` (no closure in flight: one consistent point),
at every epoch end and every ``backup_freq`` steps; a restarted coordinator restores it and runs the rest.
"""

import math
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

import keras
import numpy as np
import tensorflow as tf

from tfaccel.compat.keras_ps_model import release_from_strategy
from tfaccel.errors import ConfigError
from tfaccel.log import get_logger
from tfaccel.precision import check_output_dtype, unwrap_loss_scale
from tfaccel.resilience.backups import PS_BACKUP_FORMAT, read_backup, restore_checkpoint_backup, write_checkpoint_backup
from tfaccel.train.data import FitData
from tfaccel.train.fit_context import FitContext
from tfaccel.train.loops.base import (EpochHooks, Loop, LoopResult, evaluation_pass, run_epochs, should_validate,
                                      step_data)
from tfaccel.train.loops.compiled import compiled_blockers
from tfaccel.train.loops.ps_step import (STEPS_PER_CLOSURE, WHY_NO_METRIC_OBJECTS, Accounting, Schedule, WorkerStep,
                                         build_on_ps, check_metrics)
from tfaccel.train.optim import restore_optimizer_class, users_schedule

if TYPE_CHECKING:
    from tfaccel.train.request import FitRequest

__all__ = ["CoordinatorLoop", "run_coordinator"]


def _refuse(model: Any, data: FitData, callbacks: Sequence[Any], accum: int, validation_freq: Any) -> None:
    """ConfigError for what this loop cannot train exactly as Keras fit would, before anything runs."""
    if data.validation is not None:
        should_validate(0, validation_freq)  # raises on a value Keras refuses too

    if type(model).train_step is not keras.Model.train_step:
        raise ConfigError(
            f"model {type(model).__name__} overrides train_step, which strategy parameter_server cannot run: Keras 3 "
            "fit does not run ParameterServerStrategy (keras-team/keras#18624) and tfaccel's coordinator loop "
            f"computes the step itself ({WHY_NO_METRIC_OBJECTS}). Override compute_loss / compute_metrics instead "
            "(both are honoured), or train with strategy 'multi_worker' or 'mirrored'")
    if data.kind in ("dataset", "py_dataset"):
        raise ConfigError(
            f"strategy parameter_server: x is {data.what}; every worker builds its own input "
            "pipeline, so pass arrays (x, y[, sample_weight]) or a dataset_fn(input_context) that builds the dataset "
            "on the worker (with steps_per_epoch)")
    if data.kind == "arrays" and data.steps_per_epoch != math.ceil(data.num_examples / data.batch_size):
        raise ConfigError(
            f"strategy parameter_server: steps_per_epoch={data.steps_per_epoch} with arrays of {data.num_examples} "
            f"examples and batch {data.batch_size} ({math.ceil(data.num_examples / data.batch_size)} batches) cannot "
            "keep Keras' one pass over the examples per epoch; leave steps_per_epoch unset")
    if data.steps_per_epoch % accum:
        raise ConfigError(
            f"strategy parameter_server: gradient_accumulation_steps={accum} does not divide the "
            f"{data.steps_per_epoch} steps of an epoch; an update cannot span two epochs of closures. Choose a batch "
            "size or gradient_accumulation_steps so that they divide (e.g. gradient_accumulation_steps=1)")
    _refuse_accumulation(model.optimizer, accum)
    per_batch = [b for b in compiled_blockers(model, callbacks=[cb for cb in callbacks
                                                                if not type(cb).__module__.startswith("tfaccel.")])
                 if b.startswith("callback ")]
    if per_batch:
        raise ConfigError("strategy parameter_server: " + "; ".join(per_batch) + ". The coordinator loop runs "
                          "batches in closures on the workers and calls callbacks once per epoch; use epoch-level "
                          "callbacks (EarlyStopping, ModelCheckpoint(save_freq='epoch'), CSVLogger, ...)")


def _refuse_accumulation(optimizer: Any, accum: int) -> None:
    """What Keras' own accumulation does at every micro-batch and this loop's closures, which apply one update from
    ``accum`` micro-batches, cannot: read a schedule at the micro-batches so far, update ``use_ema``'s averages, skip
    a micro-batch whose loss-scaled gradients are not finite (the others still count towards the update)."""
    inner = unwrap_loss_scale(optimizer)
    kept = [what for what, used in (("a learning-rate schedule", users_schedule(optimizer) is not None),
                                    ("use_ema", bool(inner.use_ema)),
                                    ("loss scaling", isinstance(optimizer, keras.optimizers.LossScaleOptimizer)))
            if used]
    if accum > 1 and kept:
        raise ConfigError(
            f"strategy parameter_server: gradient_accumulation_steps={accum} with {' and '.join(kept)} "
            f"({type(optimizer).__name__}): Keras' own accumulation reads the schedule, updates the moving averages "
            "and skips an overflowing loss-scaled gradient at every micro-batch, and the coordinator loop applies "
            f"each update from {accum} micro-batches in one closure. Use gradient_accumulation_steps=1 with a "
            f"{accum}x batch, or strategy 'multi_worker'")


def _own_optimizer(model: Any) -> None:
    """Accumulation happens in this loop's closures: the optimizer gets its own class back (tfaccel.train.optim)."""
    opt = model.optimizer
    inner = unwrap_loss_scale(opt)
    if getattr(inner, "tfaccel_accumulation_steps", 1) > 1:
        inner.tfaccel_accumulation_steps = 1
        restore_optimizer_class(model)


def _evaluate(model: Any, data: FitData, request: "FitRequest", test_step: Any, cb_list: Any) -> Dict[str, Any]:
    """Keras' evaluate as fit calls it, on the coordinator (one process: Keras' metric objects count right)."""
    vx, vy, vsw = data.validation
    limit = request.validation.steps
    if vy is None and vsw is None and isinstance(vx, tf.data.Dataset):
        batches = vx.take(limit) if limit else vx
    else:
        packed = step_data(vx, vy, vsw)
        size = request.validation.batch_size or data.batch_size or 32
        n = len(tf.nest.flatten(packed)[0])
        starts = range(0, n, size)[:limit] if limit else range(0, n, size)
        batches = (tf.nest.map_structure(lambda a: a[s:s + size], packed) for s in starts)

    def run() -> Any:
        logs = None
        for batch in batches:
            logs = test_step(batch)
        return logs

    return evaluation_pass(model, cb_list, run)


def _check_backup(state: Any, *, backup_dir: str, backup_freq: Optional[int], steps: int, accum: int) -> None:
    if backup_dir and backup_freq and backup_freq % accum:
        raise ConfigError(f"parameter_server: backup_freq={backup_freq} must be a multiple of "
                          f"gradient_accumulation_steps={accum}: the coordinator can only back up between optimizer "
                          f"updates (try backup_freq={max(accum, backup_freq // accum * accum)})")
    if not state:
        return
    if state.get("format") != PS_BACKUP_FORMAT:
        restore_checkpoint_backup(state, None, backup_dir=backup_dir)  # raises, naming the mismatch
    if state.step >= steps or state.step % accum:
        raise ConfigError(f"backup_dir {backup_dir}: the backup is at step {state.step} of epoch {state.epoch}, but an "
                          f"epoch now has {steps} steps in updates of {accum}; the data, batch size or "
                          "gradient_accumulation_steps changed since it was written")


def _resume(state: Any, checkpoint: Any, *, backup_dir: str, step: WorkerStep) -> Dict[str, Any]:
    restore_checkpoint_backup(state, checkpoint, backup_dir=backup_dir)
    resumed = {"epoch": state.epoch, "step": state.step, "global_step": int(state["global_step"]),
               "optimizer_iterations": int(step.optimizer.iterations.numpy()), "steps_counted": int(step.steps.numpy()),
               "backup": state["weights_path"]}
    get_logger().info("resumed from the backup at epoch %d, step %d (%s): optimizer.iterations %d, %d steps counted",
                      state.epoch, state.step, state["weights_path"], resumed["optimizer_iterations"],
                      resumed["steps_counted"])
    return resumed


def _train_epoch(sched: Schedule, epoch: int, first: int, *, backup: Optional[Callable[[int, int], None]],
                 backup_freq: Optional[int], preemption: Any = None) -> List[np.ndarray]:
    """Runs steps ``first..`` of ``epoch``; returns the metric totals (joins before each backup, so it is whole).
    After each backup, ``preemption`` (a ``tfaccel.resilience.preemption.Preemption``) stops there if SIGTERM came."""
    order = sched.order(epoch) if sched.data.kind == "arrays" else None
    remotes: List[Any] = []
    position, steps = first, sched.steps_per_epoch
    while position < steps:
        end = min(steps, (position // backup_freq + 1) * backup_freq) if backup and backup_freq else steps
        remotes += sched.schedule(order, position, end)
        sched.coordinator.join()
        position = end
        if backup and position < steps:
            backup(epoch, position)
            if preemption is not None:
                preemption.at_boundary(epoch, position)
    fetched = [[np.asarray(t, np.float64) for t in r.fetch()] for r in remotes]
    return [np.sum(parts, axis=0) for parts in zip(*fetched)]


def _prepare(model: Any, data: FitData, *, backend: Any, callbacks: List[Any], request: "FitRequest") -> tuple:
    """Refusals and backup checks, then the build inside the scope: (backup state or None, step, schedule)."""
    accum, backup_dir = request.loop.gradient_accumulation_steps, request.backups.backup_dir
    _refuse(model, data, callbacks, accum, request.validation.freq)
    state = read_backup(backup_dir)  # what fit's _resume found: restored after the model is built
    _check_backup(state, backup_dir=backup_dir, backup_freq=request.backups.backup_freq, steps=data.steps_per_epoch,
                  accum=accum)
    _own_optimizer(model)
    build_on_ps(model, data, backend=backend)
    check_metrics(model)
    if backend.coordinator is None:
        raise ConfigError("parameter_server backend has no ClusterCoordinator; is this process the chief?")
    check_output_dtype(model)  # warns about float16/bfloat16 outputs, as on the other training paths
    step = WorkerStep(model, backend=backend, accum=accum)
    return state, step, Schedule(step, data, backend=backend)


def _write_metric_totals(model: Any, step: WorkerStep, totals: List[np.ndarray]) -> Dict[str, Any]:
    """The epoch's summed metric totals written into the model's metrics; Keras' epoch logs from them."""
    for variable, total in zip(step.metric_variables, totals):
        variable.assign(tf.cast(total, variable.dtype))
    return model.get_metrics_result()


def _counted(step: WorkerStep, sched: Schedule, at_start: Dict[str, Any], *, seconds: List[float],
             seen: List[int]) -> Dict[str, Any]:
    """``ps_accounting`` (what the ps counted against what was scheduled) and examples/s from the ps' counts."""
    timed = slice(1, None) if len(seconds) > 1 else slice(None)  # as fit: the first epoch left out when several
    applied = int(step.optimizer.iterations.numpy()) - at_start["iterations"]
    return {"ps_accounting": Accounting.report(at_start, step.accounting.read(), closures=sched.closures_scheduled,
                                               updates=sched.updates_scheduled, applied=applied),
            "examples_per_sec": float(np.sum(np.diff(seen)[timed]) / max(sum(seconds[timed]), 1e-9))}


def run_coordinator(model: Any, *, data: FitData, backend: Any, plan: Any, epochs: int, initial_epoch: int,
                    start_step: int, callbacks: List[Any], verbose: int, request: "FitRequest",
                    preemption: Any = None) -> LoopResult:
    """Trains the user's compiled model under ParameterServerStrategy as Keras ``fit`` would; see the module doc.

    Args:
        model: built and compiled inside ``tfaccel.scope()`` (its variables on the ps tasks).
        data: arrays or a ``dataset_fn(input_context)`` (``tfaccel.train.data.prepare_data``).
        backend: the parameter_server backend (strategy and ``ClusterCoordinator``). plan: for the log.
        epochs, initial_epoch, verbose: as in Keras ``fit``. start_step: steps of ``initial_epoch`` already run
            (a backup; the backup itself is read again from ``request.backups.backup_dir``).
        callbacks: epoch-level callbacks, called on the coordinator.
        request: the ``fit`` request: its validation, backups and gradient accumulation (``checkpoint_dir`` is
            written by tfaccel's callback).
        preemption: the job's ``tfaccel.resilience.preemption.Preemption``: on SIGTERM the coordinator stops at its next
            backup (every ``backup_freq`` steps, each epoch end), writes it there and raises ``Preempted``.

    Returns:
        LoopResult with Keras' history; ``details``: optimizer iterations, steps counted, backups, the resume,
        ``ps_accounting`` (updates applied and examples seen per worker, closures re-run after a lost worker) and
        ``examples_per_sec`` (from the examples counted on the ps). The model comes back usable by Keras
        ``evaluate``/``predict``/``save`` on the coordinator (``tfaccel.compat.keras_ps_model``).

    Raises:
        ConfigError: what this loop cannot train exactly like ``fit`` (custom train_step, metrics other than mean
            metrics, per-batch callbacks, tf.data datasets), backups that do not fit, no coordinator.
    """
    state, step, sched = _prepare(model, data, backend=backend, callbacks=callbacks, request=request)
    ckpt = tf.train.Checkpoint(model=model, optimizer=model.optimizer, steps=step.steps)  # with the step counter
    resumed = _resume(state, ckpt, backup_dir=request.backups.backup_dir, step=step) if state else None
    epochs_run = _Epochs(model, step, sched, ckpt, request=request, first=(initial_epoch, start_step), epochs=epochs,
                         say=_announce(backend, data, request, verbose), preemption=preemption)
    result = run_epochs(model, callbacks=callbacks, verbose=verbose, epochs=epochs, initial_epoch=initial_epoch,
                        steps_per_epoch=data.steps_per_epoch, train_epoch=epochs_run.train_epoch,
                        validate=None if data.validation is None else epochs_run.validate,
                        validation_freq=request.validation.freq, progress_bar=False, hooks=epochs_run.hooks())
    return epochs_run.finish(result, resumed=resumed)


class _Epochs:
    """The coordinator's part of each epoch, for the shared epoch driver (``run_epochs``): the closures, the metric
    totals, backups and the log line; then the ps' counts."""

    def __init__(self, model: Any, step: WorkerStep, sched: Schedule, ckpt: Any, *, request: "FitRequest",
                 first: Tuple[int, int], epochs: int, say: Callable[..., None], preemption: Any = None) -> None:
        self.preemption = preemption
        if preemption is not None and request.backups.backup_dir:
            preemption.save = self.backup

        self.model, self.step, self.sched, self.ckpt, self.request = model, step, sched, ckpt, request
        self.data, self.first, self.epochs, self.say = sched.data, first, epochs, say
        self.test_step = tf.function(model.test_step, reduce_retracing=True)
        self.counted_at_start, self.at_start = int(step.steps.numpy()), step.accounting.read()
        self.at_start["iterations"] = int(step.optimizer.iterations.numpy())
        self.seen = [sum(self.at_start["examples"])]  # examples counted on the ps, after each epoch
        self.backups_written = 0

    def _first_step(self, epoch: int) -> int:
        return self.first[1] if epoch == self.first[0] else 0

    def backup(self, epoch: int, position: int) -> None:
        write_checkpoint_backup(self.request.backups.backup_dir, self.ckpt, epoch=epoch, step=position,
                                steps_per_epoch=self.data.steps_per_epoch)
        self.backups_written += 1

    def train_epoch(self, epoch: int, cb_list: Any) -> Tuple[Dict[str, Any], int]:
        first, backups = self._first_step(epoch), self.request.backups
        totals = _train_epoch(self.sched, epoch, first, backup=self.backup if backups.backup_dir else None,
                              backup_freq=backups.backup_freq, preemption=self.preemption)
        self.seen.append(sum(self.step.accounting.read()["examples"]))
        return _write_metric_totals(self.model, self.step, totals), self.data.steps_per_epoch - first

    def validate(self, cb_list: Any) -> Dict[str, Any]:
        return _evaluate(self.model, self.data, self.request, self.test_step, cb_list)

    def hooks(self) -> EpochHooks:
        def log_epoch(epoch: int, logs: Dict[str, Any], seconds: float) -> None:
            self.say("epoch %d/%d - %d steps - %.1fs - %s", epoch + 1, self.epochs,
                     self.data.steps_per_epoch - self._first_step(epoch), seconds,
                     " - ".join(f"{k}: {v:.4f}" for k, v in logs.items()))
            if self.preemption is not None:  # after the epoch's backup and callbacks
                self.preemption.at_boundary(epoch + 1, 0, epoch_end=True)

        backup_at_end = (lambda epoch, _: self.backup(epoch + 1, 0)) if self.request.backups.backup_dir else None
        # The model is Keras' again for on_train_end callbacks: evaluate / predict / save on the coordinator.
        return EpochHooks(before_epoch_end=backup_at_end, after_epoch_end=log_epoch,
                          before_train_end=lambda: release_from_strategy(self.model))

    def finish(self, result: LoopResult, *, resumed: Optional[Dict[str, Any]]) -> LoopResult:
        """The loop's result: the steps counted on the ps, the accounting, examples/s from the ps' counts."""
        step, counted = self.step, int(self.step.steps.numpy())
        details = {"backups_written": self.backups_written, "resumed": resumed,
                   **_counted(step, self.sched, self.at_start, seconds=result.epoch_seconds, seen=self.seen),
                   "optimizer_iterations": int(step.optimizer.iterations.numpy()), "steps_counted": counted,
                   "data": "per-worker arrays on the workers, order from (seed, epoch)" if self.data.kind == "arrays"
                   else "per-worker datasets built on the workers by the dataset_fn"}
        return LoopResult(history=result.history, epoch_seconds=result.epoch_seconds,
                          steps=counted - self.counted_at_start, details=details)


def _announce(backend: Any, data: FitData, request: "FitRequest", verbose: int) -> Callable[..., None]:
    """Logs how the job is scheduled; returns the logger's method for the epoch lines (debug when quiet)."""
    log = get_logger()
    say = log.info if verbose else log.debug
    backup_dir, backup_freq = request.backups.backup_dir, request.backups.backup_freq
    say("parameter_server: %d workers, %d steps/epoch in closures of %d steps%s", backend.num_workers,
        data.steps_per_epoch, STEPS_PER_CLOSURE * request.loop.gradient_accumulation_steps,
        f"; backups every {backup_freq} steps and each epoch end" if backup_dir and backup_freq
        else ("; backups each epoch end" if backup_dir else ""))
    return say


class CoordinatorLoop(Loop):
    """parameter_server: tfaccel's ClusterCoordinator loop, the only one that trains under it."""

    name = "coordinator"

    def serves(self, ctx: "FitContext") -> bool:
        return not ctx.backend.uses_keras_fit

    def blockers(self, ctx: "FitContext") -> List[str]:
        backend, request = ctx.backend, ctx.request
        if self.serves(ctx) and request.loop.loop != "auto":
            raise ConfigError(f"loop={request.loop.loop!r}: {backend.describe()} trains with tfaccel's "
                              "ClusterCoordinator loop only (Keras 3 fit does not run ParameterServerStrategy, "
                              "keras-team/keras#18624)")
        if self.serves(ctx) and request.loop.steps_per_execution != "auto":
            raise ConfigError(f"steps_per_execution={request.loop.steps_per_execution!r}: {backend.describe()} runs "
                              "its steps in closures scheduled on the workers by tfaccel's ClusterCoordinator loop, "
                              "not in Keras' train function; leave steps_per_execution unset")
        return [] if self.serves(ctx) else [f"{backend.describe()} trains with Keras' train function"]

    def describe(self, ctx: "FitContext", rejected: List[Tuple[Loop, List[str]]]) -> str:
        return "parameter_server: tfaccel's ClusterCoordinator loop (keras-team/keras#18624)"

    def run(self, ctx: "FitContext") -> LoopResult:
        return run_coordinator(ctx.model, data=ctx.data, backend=ctx.backend, plan=ctx.plan, epochs=ctx.request.epochs,
                               initial_epoch=ctx.start_epoch, start_step=ctx.start_step, callbacks=ctx.callbacks,
                               verbose=ctx.verbose, request=ctx.request, preemption=ctx.preemption)
