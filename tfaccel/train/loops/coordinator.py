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

Pitfalls handled here (measured on TF 2.21 / Keras 3.15 with real ps/worker processes, see VERIFIED.md):

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
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from tfaccel.compat.keras_ps_model import release_from_strategy
from tfaccel.errors import ConfigError
from tfaccel.log import get_logger
from tfaccel.train.backups import PS_BACKUP_FORMAT, restore_checkpoint_backup, write_checkpoint_backup
from tfaccel.train.data import FitData
from tfaccel.train.loops.base import LoopResult, python_logs, should_validate, step_data
from tfaccel.train.loops.ps_step import (STEPS_PER_CLOSURE, WHY_NO_METRIC_OBJECTS, Accounting, Schedule, WorkerStep,
                                         build_on_ps, check_metrics)

__all__ = ["run_coordinator"]



def _refuse(model: Any, data: FitData, callbacks: Sequence[Any], accum: int, validation_freq: Any) -> None:
    """ConfigError for what this loop cannot train exactly as Keras fit would, before anything runs."""
    import keras

    from tfaccel.train.loops.compiled import compiled_blockers

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
            f"strategy parameter_server: x is {data.note.split(' used')[0]}; every worker builds its own input "
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
    per_batch = [b for b in compiled_blockers(model, callbacks=[cb for cb in callbacks
                                                                if not type(cb).__module__.startswith("tfaccel.")])
                 if b.startswith("callback ")]
    if per_batch:
        raise ConfigError("strategy parameter_server: " + "; ".join(per_batch) + ". The coordinator loop runs "
                          "batches in closures on the workers and calls callbacks once per epoch; use epoch-level "
                          "callbacks (EarlyStopping, ModelCheckpoint(save_freq='epoch'), CSVLogger, ...)")


def _own_optimizer(model: Any) -> None:
    """Accumulation happens in this loop's closures: the optimizer gets its own class back (tfaccel.train.optim)."""
    import keras

    from tfaccel.train.optim import restore_optimizer_class

    opt = model.optimizer
    inner = opt.inner_optimizer if isinstance(opt, keras.optimizers.LossScaleOptimizer) else opt
    if getattr(inner, "tfaccel_accumulation_steps", 1) > 1:
        inner.tfaccel_accumulation_steps = 1
        restore_optimizer_class(model)


def _evaluate(model: Any, data: FitData, options: Dict[str, Any], test_step: Any, cb_list: Any) -> Dict[str, Any]:
    """Keras' evaluate as fit calls it, on the coordinator (one process: Keras' metric objects count right)."""
    import tensorflow as tf

    vx, vy, vsw = data.validation
    limit = options["validation_steps"]
    if vy is None and vsw is None and isinstance(vx, tf.data.Dataset):
        batches = vx.take(limit) if limit else vx
    else:
        packed = step_data(vx, vy, vsw)
        size = options["validation_batch_size"] or data.batch_size or 32
        n = len(tf.nest.flatten(packed)[0])
        starts = range(0, n, size)[:limit] if limit else range(0, n, size)
        batches = (tf.nest.map_structure(lambda a: a[s:s + size], packed) for s in starts)
    cb_list.on_test_begin()
    model.reset_metrics()
    logs = None
    for batch in batches:
        logs = test_step(batch)
    metric_logs = model.get_metrics_result()
    logs = python_logs(metric_logs if logs is None or set(logs) == set(metric_logs) else logs)
    cb_list.on_test_end(logs)
    return {f"val_{name}": value for name, value in logs.items()}


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
                 backup_freq: Optional[int]) -> List[np.ndarray]:
    """Runs steps ``first..`` of ``epoch``; returns the metric totals (joins before each backup, so it is whole)."""
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
    fetched = [[np.asarray(t, np.float64) for t in r.fetch()] for r in remotes]
    return [np.sum(parts, axis=0) for parts in zip(*fetched)]


def _prepare(model: Any, data: FitData, *, backend: Any, callbacks: List[Any], options: Dict[str, Any]) -> tuple:
    """Refusals and backup checks, then the build inside the scope: (backup state or None, step, schedule)."""
    from tfaccel.precision import check_output_dtype
    from tfaccel.train.backups import read_backup

    accum, backup_dir = options["gradient_accumulation_steps"], options["backup_dir"]
    _refuse(model, data, callbacks, accum, options["validation_freq"])
    state = read_backup(backup_dir)  # what fit's _resume found: restored after the model is built
    _check_backup(state, backup_dir=backup_dir, backup_freq=options["backup_freq"], steps=data.steps_per_epoch,
                  accum=accum)
    _own_optimizer(model)
    build_on_ps(model, data, backend=backend)
    check_metrics(model)
    if backend.coordinator is None:
        raise ConfigError("parameter_server backend has no ClusterCoordinator; is this process the chief?")
    check_output_dtype(model)  # warns about float16/bfloat16 outputs, as on the other training paths
    step = WorkerStep(model, backend=backend, accum=accum)
    return state, step, Schedule(step, data, backend=backend)


def _epoch_logs(model: Any, step: WorkerStep, totals: List[np.ndarray], *, epoch: int, data: FitData,
                options: Dict[str, Any], test_step: Any, cb_list: Any) -> Dict[str, Any]:
    """Keras' epoch logs: the summed totals written into the model's metrics, then the validation pass."""
    import tensorflow as tf

    for variable, total in zip(step.metric_variables, totals):
        variable.assign(tf.cast(total, variable.dtype))
    logs = python_logs(model.get_metrics_result())
    if data.validation is not None and should_validate(epoch, options["validation_freq"]):
        logs.update(_evaluate(model, data, options, test_step, cb_list))
    return logs


def _counted(step: WorkerStep, sched: Schedule, at_start: Dict[str, Any], *, seconds: List[float],
             seen: List[int]) -> Dict[str, Any]:
    """``ps_accounting`` (what the ps counted against what was scheduled) and examples/s from the ps' counts."""
    timed = slice(1, None) if len(seconds) > 1 else slice(None)  # as fit: the first epoch left out when several
    applied = int(step.optimizer.iterations.numpy()) - at_start["iterations"]
    return {"ps_accounting": Accounting.report(at_start, step.accounting.read(), closures=sched.closures_scheduled,
                                               updates=sched.updates_scheduled, applied=applied),
            "examples_per_sec": float(np.sum(np.diff(seen)[timed]) / max(sum(seconds[timed]), 1e-9))}


def run_coordinator(model: Any, *, data: FitData, backend: Any, plan: Any, epochs: int, initial_epoch: int,
                    start_step: int, callbacks: List[Any], verbose: int, options: Dict[str, Any]) -> LoopResult:
    """Trains the user's compiled model under ParameterServerStrategy as Keras ``fit`` would; see the module doc.

    Args:
        model: built and compiled inside ``tfaccel.scope()`` (its variables on the ps tasks).
        data: arrays or a ``dataset_fn(input_context)`` (``tfaccel.train.data.prepare_data``).
        backend: the parameter_server backend (strategy and ``ClusterCoordinator``). plan: for the log.
        epochs, initial_epoch, verbose: as in Keras ``fit``. start_step: steps of ``initial_epoch`` already run
            (a backup; the backup itself is read again from ``options["backup_dir"]``).
        callbacks: epoch-level callbacks, called on the coordinator.
        options: ``validation_steps``, ``validation_batch_size``, ``validation_freq``, ``backup_dir``,
            ``backup_freq``, ``gradient_accumulation_steps`` (``checkpoint_dir`` is written by tfaccel's callback).

    Returns:
        LoopResult with Keras' history; ``details``: optimizer iterations, steps counted, backups, the resume,
        ``ps_accounting`` (updates applied and examples seen per worker, closures re-run after a lost worker) and
        ``examples_per_sec`` (from the examples counted on the ps). The model comes back usable by Keras
        ``evaluate``/``predict``/``save`` on the coordinator (``tfaccel.compat.keras_ps_model``).

    Raises:
        ConfigError: what this loop cannot train exactly like ``fit`` (custom train_step, metrics other than mean
            metrics, per-batch callbacks, tf.data datasets), backups that do not fit, no coordinator.
    """
    import keras
    import tensorflow as tf

    accum, backup_dir, backup_freq = (options[k] for k in ("gradient_accumulation_steps", "backup_dir", "backup_freq"))
    state, step, sched = _prepare(model, data, backend=backend, callbacks=callbacks, options=options)
    ckpt = tf.train.Checkpoint(model=model, optimizer=model.optimizer, steps=step.steps)  # with the step counter
    details: Dict[str, Any] = {"backups_written": 0, "resumed": _resume(state, ckpt, backup_dir=backup_dir, step=step)
                               if state else None}

    def backup(epoch: int, position: int) -> None:
        write_checkpoint_backup(backup_dir, ckpt, epoch=epoch, step=position, steps_per_epoch=data.steps_per_epoch)
        details["backups_written"] += 1

    log = get_logger()
    say = log.info if verbose else log.debug
    say("parameter_server: %d workers, %d steps/epoch in closures of %d steps%s", backend.num_workers,
        data.steps_per_epoch, STEPS_PER_CLOSURE * accum, f"; backups every {backup_freq} steps and each epoch end"
        if backup_dir and backup_freq else ("; backups each epoch end" if backup_dir else ""))
    cb_list = keras.callbacks.CallbackList(callbacks, add_history=True, add_progbar=False, model=model,
                                           verbose=verbose, epochs=epochs, steps=data.steps_per_epoch)
    test_step = tf.function(model.test_step, reduce_retracing=True)
    counted_at_start, accounted_at_start = int(step.steps.numpy()), step.accounting.read()
    accounted_at_start["iterations"] = int(step.optimizer.iterations.numpy())
    seconds: List[float] = []
    seen = [sum(accounted_at_start["examples"])]  # examples counted on the ps, after each epoch
    model.stop_training = False
    cb_list.on_train_begin()
    logs = None
    for epoch in range(getattr(model, "_initial_epoch", None) or initial_epoch, epochs):  # BackupAndRestore
        first = start_step if epoch == initial_epoch else 0
        model.reset_metrics()
        cb_list.on_epoch_begin(epoch)
        t0 = time.perf_counter()
        totals = _train_epoch(sched, epoch, first, backup=backup if backup_dir else None, backup_freq=backup_freq)
        seconds.append(time.perf_counter() - t0)
        seen.append(sum(step.accounting.read()["examples"]))
        logs = _epoch_logs(model, step, totals, epoch=epoch, data=data, options=options, test_step=test_step,
                           cb_list=cb_list)
        if backup_dir:
            backup(epoch + 1, 0)
        cb_list.on_epoch_end(epoch, logs)
        say("epoch %d/%d - %d steps - %.1fs - %s", epoch + 1, epochs, data.steps_per_epoch - first, seconds[-1],
            " - ".join(f"{k}: {v:.4f}" for k, v in logs.items()))
        if model.stop_training:
            break
    if isinstance(model.optimizer, keras.optimizers.Optimizer):
        model.optimizer.finalize_variable_values(model.trainable_weights)
    release_from_strategy(model)  # Keras evaluate / predict / save on the coordinator (on_train_end callbacks too)
    cb_list.on_train_end(logs=logs)
    counted = int(step.steps.numpy())
    details.update(_counted(step, sched, accounted_at_start, seconds=seconds, seen=seen),
                   optimizer_iterations=int(model.optimizer.iterations.numpy()), steps_counted=counted,
                   data="per-worker arrays on the workers, order from (seed, epoch)" if data.kind == "arrays"
                   else "per-worker datasets built on the workers by the dataset_fn")
    return LoopResult(history=dict(model.history.history), epoch_seconds=seconds, steps=counted - counted_at_start,
                      details=details)
