"""What the training loops share: the ``Loop`` interface, their result, steps per execution, and Keras' own
conventions for step data, logs, the epoch driver and validation."""

import abc
import dataclasses
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import keras
import numpy as np
import tensorflow as tf

from tfaccel.compat.keras_internals import backup_and_restore_epoch
from tfaccel.errors import ConfigError
from tfaccel.log import get_logger
from tfaccel.train.fit_context import FitContext

__all__ = ["Loop", "LoopResult", "EpochHooks", "step_data", "python_logs", "should_validate", "metrics_or_logs",
           "run_epochs", "evaluation_pass", "steps_per_execution", "whole_calls", "pass_blockers",
           "unknown_batch_size", "gather_batch", "STEPS_PER_EXECUTION_AUTO_MAX"]

# Upper bound of steps_per_execution="auto" (measured: 64 steps per execution + XLA gave 6.3x a naive fit here).
STEPS_PER_EXECUTION_AUTO_MAX = 64


@dataclasses.dataclass
class LoopResult:
    """The outcome of one loop run.

    Attributes:
        history: Keras' history dict (``model.history.history`` under ``model.fit``): one value per epoch run.
        epoch_seconds: wall time of each epoch run, in order.
        steps: training steps (batches) actually run by this call, partial batches included.
        details: what the loop adds to ``FitResult.details`` (e.g. the coordinator's counters and backups).
    """

    history: Dict[str, List[float]]
    epoch_seconds: List[float]
    steps: int
    details: Dict[str, Any] = dataclasses.field(default_factory=dict)


def pass_blockers(data: Any, validation_steps: Optional[int]) -> List[str]:
    """Why a loop that trains one pass over in-memory arrays per epoch, every batch, and then evaluates every
    validation batch, would not train what Keras ``fit`` trains: ``steps_per_epoch`` other than one pass (Keras runs
    that many steps of its data iterator), or ``validation_steps`` (Keras evaluates that many batches). ``data``: the
    prepared arrays (``FitData`` of kind ``"arrays"``)."""
    blockers = []
    if data.steps_per_epoch != -(-data.num_examples // data.batch_size):
        blockers.append(f"steps_per_epoch={data.steps_per_epoch} is not one pass over the arrays")
    if validation_steps is not None:
        blockers.append("validation_steps is given")
    return blockers


class Loop(abc.ABC):
    """One way to train a job exactly as Keras ``fit`` would. ``tfaccel.train.loops.LOOPS`` lists them in order;
    the first whose ``blockers`` are empty runs the job.

    Attributes:
        name: the loop's name in ``FitResult.details["loops_rejected"]``.
        own: tfaccel's own loop, what ``loop="compiled"`` asks for and ``loop="keras"`` rules out.
    """

    name: str = ""
    own: bool = False

    def serves(self, ctx: "FitContext") -> bool:
        """Whether the loop runs under this job's backend at all (the job itself aside). Defaults to True."""
        return True

    @abc.abstractmethod
    def blockers(self, ctx: "FitContext") -> List[str]:
        """Why this loop cannot train the job exactly like Keras ``fit``: one short phrase each, [] when it can.

        Raises:
            ConfigError: the request asks for this loop (``loop="compiled"``) and it cannot honour it.
        """

    @abc.abstractmethod
    def describe(self, ctx: "FitContext", rejected: List[Tuple["Loop", List[str]]]) -> str:
        """The plan's one line saying that this loop runs and why (``rejected``: the loops before it, with reasons)."""

    def steps_per_execution(self, ctx: "FitContext") -> Optional[Tuple[int, str]]:
        """(steps per compiled call, why) where the model's ``steps_per_execution`` applies; None elsewhere."""
        return None

    def orders_examples(self, ctx: "FitContext") -> bool:
        """Whether tfaccel orders the examples (so every process must agree on a seed). Defaults to True."""
        return True

    @abc.abstractmethod
    def run(self, ctx: "FitContext") -> "LoopResult":
        """Trains the job (``ctx``: the prepared model, data, callbacks and where to start)."""


def steps_per_execution(ctx: "FitContext", *, keras_fit: bool) -> Tuple[int, str]:
    """(steps per execution, why) for this job, from ``fit``'s ``steps_per_execution`` and the model's.

    Args:
        ctx: the job.
        keras_fit: for Keras' own train function (else for tfaccel's multi-step loop).
    """
    requested, model = ctx.request.loop.steps_per_execution, ctx.model
    fallback = ctx.backend.keras_multi_step_fallback() if keras_fit else None
    if fallback is not None:
        if requested not in ("auto", 1):
            get_logger().warning("steps_per_execution=%s %s", requested, fallback[1])
        return 1, fallback[0]
    counts = {"steps_per_epoch": ctx.request.steps_per_epoch,
              "validation_steps": ctx.request.validation.steps if ctx.data.validation is not None else None}
    counts = {name: count for name, count in counts.items() if count} if keras_fit else {}
    if requested != "auto" or model.steps_per_execution != 1:
        spe, why = (int(requested), "given") if requested != "auto" else (model.steps_per_execution, "as compiled")
        past = {name: count for name, count in counts.items() if count % spe}
        if past:
            get_logger().warning(
                "steps_per_execution=%d (%s) does not divide %s: Keras fit ends a call of %d steps only where the "
                "data ends, so it runs further than that (as plain model.fit does with the same arguments); give a "
                "steps_per_execution that divides it", spe, why,
                " and ".join(f"{name}={count}" for name, count in past.items()), spe)
        return spe, why
    per_batch = ctx.per_batch or bool(ctx.request.backups.backup_freq)
    steps = ctx.batches_per_epoch
    if per_batch or not steps:
        # A dataset of unknown length: Keras would end its last call where the data ends, but reports the batch
        # numbers of a full call, so the steps run could not be counted.
        return 1, "1: per-batch callbacks must see every batch" if per_batch else "1: epoch length unknown"
    bound = min(steps, STEPS_PER_EXECUTION_AUTO_MAX)
    spe = whole_calls(bound, *counts.values())
    if spe == bound:
        return bound, f"auto: min(steps/epoch={steps}, {STEPS_PER_EXECUTION_AUTO_MAX})"
    given = " and ".join(f"{name}={count}" for name, count in counts.items())
    return spe, (f"auto: {spe}, the most steps per call up to {bound} that divide {given}: Keras' train and test "
                 "functions end a call only where the data ends, so a call must end where the epoch (or the "
                 "evaluation) does, or it would run further than Keras fit runs")


def whole_calls(bound: int, *counts: int) -> int:
    """The most steps per execution, up to ``bound``, that divide every one of ``counts`` (1 at worst).

    Keras 3.15's train and test functions run ``steps_per_execution`` steps per call unless the data ends first,
    whatever ``steps_per_epoch`` or ``validation_steps`` says: on a repeated dataset, ``steps_per_epoch=70`` with 64
    steps per call trains 128 steps an epoch, and ``validation_steps=2`` with 8 evaluates every validation batch.
    """
    return next(spe for spe in range(max(bound, 1), 0, -1) if all(count % spe == 0 for count in counts))


def step_data(x: Any, y: Any, sample_weight: Any, *, constants: bool = False) -> Any:
    """The data as Keras' array adapter hands it to a step: floats in floatx, packed ``(x, y[, sw])`` or ``x``.

    Args:
        constants: make every array a ``tf.constant`` (kept on the device); NumPy arrays otherwise.
    """
    def convert(a: Any) -> Any:
        if tf.is_tensor(a) and a.dtype == tf.string:  # as numpy it would be an object array, which Keras refuses
            return a
        a = np.asarray(a)
        if np.issubdtype(a.dtype, np.floating) and a.dtype != np.dtype(keras.config.floatx()):
            a = a.astype(keras.config.floatx())
        return tf.constant(a) if constants else a

    if isinstance(x, list):
        x = tuple(x)  # as Keras does: a dataset would stack a list
    if sample_weight is not None and isinstance(y, (list, tuple, dict)):
        sample_weight = tf.nest.map_structure(lambda _: sample_weight, y)  # one array for every output
    return tf.nest.map_structure(convert, keras.utils.pack_x_y_sample_weight(x, y, sample_weight))


def unknown_batch_size(batch: Any) -> Any:
    """``batch`` (a step's nested tensors) with the batch dimension unknown to the trace, as Keras fit's batches of
    arrays have it (its data adapters batch a ``tf.data`` pipeline without ``drop_remainder``: shape ``(None, ...)``),
    so that code reading ``x.shape[0]`` sees what it sees under ``fit``. Keras 3.15's per-output loss trackers do:
    they weight each batch's loss by ``y_pred.shape[0]``, and by nothing where that is None, so a known batch size
    reported other per-output losses than ``fit`` for a job with a partial last batch. The values are unchanged."""
    def hide(t: Any) -> Any:
        shape = tf.TensorShape(t.shape)
        if shape.rank is None or shape.rank == 0 or shape[0] is None:
            return t
        return tf.compat.v1.placeholder_with_default(t, [None] + shape[1:].as_list())

    return tf.nest.map_structure(hide, batch)


def gather_batch(arrays: Any, indices: Any) -> Any:
    """The examples ``indices`` of every tensor in ``arrays`` (nested), as one step's batch, its batch dimension
    unknown to the trace (:func:`unknown_batch_size`)."""
    return unknown_batch_size(tf.nest.map_structure(lambda t: tf.gather(t, indices), arrays))


def python_logs(logs: Any) -> Dict[str, Any]:
    """Keras' ``pythonify_logs``: nested dicts flattened, sorted keys, floats where possible."""
    result: Dict[str, Any] = {}
    for key, value in sorted((logs or {}).items()):
        try:
            result.update(python_logs(value) if isinstance(value, dict) else {key: float(np.asarray(value))})
        except (TypeError, ValueError):
            result[key] = value
    return result


def should_validate(epoch: int, validation_freq: Any) -> bool:
    """Keras' ``_should_eval``: validate after 0-based ``epoch``?

    Raises:
        ConfigError: ``validation_freq`` is neither an int nor a list of 1-based epochs.
    """
    if isinstance(validation_freq, int) and not isinstance(validation_freq, bool):
        return (epoch + 1) % validation_freq == 0
    if isinstance(validation_freq, (list, tuple)):
        return epoch + 1 in validation_freq
    raise ConfigError(f"validation_freq must be an int (every N epochs) or a list of 1-based epochs; received "
                      f"validation_freq={validation_freq!r} of type {type(validation_freq).__name__}. "
                      "Pass e.g. validation_freq=1 or validation_freq=[1, 5]")


def metrics_or_logs(model: Any, logs: Any) -> Any:
    """Keras' ``_get_metrics_result_or_logs``: the model's metrics when the step returned the same keys (or when
    no step ran)."""
    metric_logs = model.get_metrics_result()
    if logs is None or isinstance(logs, dict) and set(logs) == set(metric_logs):
        return metric_logs
    return logs


def evaluation_pass(model: Any, cb_list: Any, run: Callable[[], Any]) -> Dict[str, Any]:
    """Keras' ``evaluate`` as ``fit`` calls it, around a loop's own way of running the validation batches: the
    callbacks' test hooks, every metric reset first, the model's metrics (or the last step's logs), ``val_`` keys.

    Args:
        model: the user's model. cb_list: the epoch driver's ``CallbackList``.
        run: runs every validation batch with the model's ``test_step``; returns the last step's logs (None: none).
    """
    cb_list.on_test_begin()
    model.reset_metrics()
    logs = python_logs(metrics_or_logs(model, run()))
    cb_list.on_test_end(logs)
    return {f"val_{name}": value for name, value in logs.items()}


@dataclasses.dataclass
class EpochHooks:
    """What a loop adds to Keras' epoch (each optional).

    Attributes:
        before_epoch_end: ``(epoch, logs)`` after validation, before the callbacks' ``on_epoch_end`` (backups).
        after_epoch_end: ``(epoch, logs, seconds)`` after the callbacks' ``on_epoch_end`` (a log line).
        before_train_end: called after the optimizer's final values, before ``on_train_end``.
    """

    before_epoch_end: Optional[Callable[[int, Dict[str, Any]], None]] = None
    after_epoch_end: Optional[Callable[[int, Dict[str, Any], float], None]] = None
    before_train_end: Optional[Callable[[], None]] = None


def run_epochs(model: Any, *, callbacks: List[Any], verbose: Any, epochs: int, initial_epoch: int,
               steps_per_epoch: int, train_epoch: Callable[[int, Any], Tuple[Any, int]],
               validate: Optional[Callable[[Any], Dict[str, Any]]], validation_freq: Any,
               progress_bar: bool = True, hooks: Optional[EpochHooks] = None) -> LoopResult:
    """Keras ``fit``'s epoch driver for tfaccel's own loops: callbacks and History, epoch timing, validation,
    ``stop_training`` and the optimizer's final values, as ``fit`` runs them.

    Args:
        model: the user's compiled model.
        callbacks, verbose, epochs: as in Keras ``fit``; callbacks get Keras' ``CallbackList`` (History, progress bar).
        initial_epoch: the first epoch (or ``BackupAndRestore``'s, as Keras reads it).
        steps_per_epoch: the batches of an epoch, for the progress bar and callbacks' ``params["steps"]``.
        train_epoch: ``(epoch, callback list) -> (logs, steps run)``: trains one epoch.
        validate: ``callback list -> validation logs`` (``val_`` keys), or None without validation data.
        validation_freq: Keras' ``validation_freq``.
        progress_bar: Keras' progress bar where ``verbose`` asks for one. Defaults to True.
        hooks: the loop's additions (:class:`EpochHooks`). Defaults to none.

    Returns:
        Keras' history, the training seconds of each epoch (validation and callbacks excluded), the steps run.
    """
    hooks = hooks or EpochHooks()
    cb_list = keras.callbacks.CallbackList(callbacks, add_history=True, add_progbar=progress_bar and verbose != 0,
                                           model=model, verbose=verbose, epochs=epochs, steps=steps_per_epoch)
    model.stop_training = False
    cb_list.on_train_begin()
    seconds: List[float] = []
    steps, epoch_logs = 0, None
    for epoch in range(backup_and_restore_epoch(model) or initial_epoch, epochs):
        model.reset_metrics()
        cb_list.on_epoch_begin(epoch)
        start = time.perf_counter()
        logs, ran = train_epoch(epoch, cb_list)
        seconds.append(time.perf_counter() - start)
        steps += ran
        epoch_logs = dict(metrics_or_logs(model, logs))
        if validate is not None and should_validate(epoch, validation_freq):
            epoch_logs.update(validate(cb_list))
        if hooks.before_epoch_end:
            hooks.before_epoch_end(epoch, epoch_logs)
        cb_list.on_epoch_end(epoch, epoch_logs)
        if hooks.after_epoch_end:
            hooks.after_epoch_end(epoch, epoch_logs, seconds[-1])
        if model.stop_training:
            break
    if isinstance(model.optimizer, keras.optimizers.Optimizer) and epochs > 0:
        model.optimizer.finalize_variable_values(model.trainable_weights)
    if hooks.before_train_end:
        hooks.before_train_end()
    cb_list.on_train_end(logs=epoch_logs)
    return LoopResult(history=dict(model.history.history), epoch_seconds=seconds, steps=steps)
