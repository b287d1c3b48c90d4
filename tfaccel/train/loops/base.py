"""What the training loops share: their result, and Keras' own conventions for step data, logs and validation."""

import dataclasses
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from tfaccel.errors import ConfigError

__all__ = ["LoopResult", "step_data", "python_logs", "should_validate", "metrics_or_logs", "run_epochs"]


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


def step_data(x: Any, y: Any, sample_weight: Any, *, constants: bool = False) -> Any:
    """The data as Keras' array adapter hands it to a step: floats in floatx, packed ``(x, y[, sw])`` or ``x``.

    Args:
        constants: make every array a ``tf.constant`` (kept on the device); NumPy arrays otherwise.
    """
    import keras
    import tensorflow as tf

    def convert(a: Any) -> Any:
        a = np.asarray(a)
        if np.issubdtype(a.dtype, np.floating) and a.dtype != np.dtype(keras.config.floatx()):
            a = a.astype(keras.config.floatx())
        return tf.constant(a) if constants else a

    if isinstance(x, list):
        x = tuple(x)  # as Keras does: a dataset would stack a list
    if sample_weight is not None and isinstance(y, (list, tuple, dict)):
        sample_weight = tf.nest.map_structure(lambda _: sample_weight, y)  # one array for every output
    return tf.nest.map_structure(convert, keras.utils.pack_x_y_sample_weight(x, y, sample_weight))


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
    """Keras' ``_get_metrics_result_or_logs``: the model's metrics when the step returned the same keys."""
    metric_logs = model.get_metrics_result()
    if isinstance(logs, dict) and set(logs) == set(metric_logs):
        return metric_logs
    return logs


def run_epochs(model: Any, *, callbacks: List[Any], verbose: Any, epochs: int, initial_epoch: int,
               steps_per_epoch: int, train_epoch: Callable[[int, Any], Tuple[Any, int]],
               validate: Optional[Callable[[Any], Dict[str, Any]]], validation_freq: Any) -> LoopResult:
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

    Returns:
        Keras' history, the training seconds of each epoch (validation and callbacks excluded), the steps run.
    """
    import keras

    cb_list = keras.callbacks.CallbackList(callbacks, add_history=True, add_progbar=verbose != 0, model=model,
                                           verbose=verbose, epochs=epochs, steps=steps_per_epoch)
    model.stop_training = False
    cb_list.on_train_begin()
    seconds: List[float] = []
    steps, epoch_logs = 0, None
    for epoch in range(getattr(model, "_initial_epoch", None) or initial_epoch, epochs):  # BackupAndRestore
        model.reset_metrics()
        cb_list.on_epoch_begin(epoch)
        start = time.perf_counter()
        logs, ran = train_epoch(epoch, cb_list)
        seconds.append(time.perf_counter() - start)
        steps += ran
        epoch_logs = dict(metrics_or_logs(model, logs))
        if validate is not None and should_validate(epoch, validation_freq):
            epoch_logs.update(validate(cb_list))
        cb_list.on_epoch_end(epoch, epoch_logs)
        if model.stop_training:
            break
    if isinstance(model.optimizer, keras.optimizers.Optimizer) and epochs > 0:
        model.optimizer.finalize_variable_values(model.trainable_weights)
    cb_list.on_train_end(logs=epoch_logs)
    return LoopResult(history=dict(model.history.history), epoch_seconds=seconds, steps=steps)
