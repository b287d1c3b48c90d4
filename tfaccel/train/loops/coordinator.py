"""The parameter-server loop: the user's compiled Keras 3 model trained by a ClusterCoordinator, as ``fit`` would.

Keras 3 ``fit`` does not run ParameterServerStrategy (keras-team/keras#18624), so this loop schedules the steps
itself. Each step is Keras' ``train_step`` taken apart only where PS needs it: the model's forward pass, its own
``compute_loss`` (compiled loss, ``model.losses``, sample weights), its loss tracker and ``compute_metrics``, the
user's optimizer (schedule, clipping, loss scaling). The example order is a function of ``(seed, epoch)`` and
is chosen by the coordinator: every closure gets the indices of its batches and gathers them from the arrays
held on its worker (a per-worker dataset built on the worker), so each epoch sees every example once, the
partial last batch included, whichever worker runs which batch. With one worker this is ``fit``'s own order.

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

import inspect
import math
import os
import shutil
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from tfaccel.errors import ConfigError
from tfaccel.log import get_logger
from tfaccel.train.data import FitData
from tfaccel.train.loops.base import LoopResult

__all__ = ["run_coordinator", "exact_assign_add", "write_checkpoint_backup", "restore_checkpoint_backup",
           "PS_BACKUP_FORMAT", "STEPS_PER_CLOSURE"]

# Optimizer updates per scheduled closure: fewer RPC round-trips, still fine-grained enough to spread over workers.
STEPS_PER_CLOSURE = 8
# The "format" a parameter-server backup names in tfaccel_backup.json (StepBackup's .weights.h5 has none).
PS_BACKUP_FORMAT = "tf.train.Checkpoint"
_CKPT_PREFIX = "ckpt"
_WHY_NO_METRIC_OBJECTS = "Keras metric objects miscount in functions scheduled on parameter-server workers"


def write_checkpoint_backup(backup_dir: str, checkpoint: Any, *, epoch: int, step: int,
                            steps_per_epoch: int) -> str:
    """Writes ``checkpoint`` as the backup to resume at step ``step`` of epoch ``epoch``; returns its directory.

    The checkpoint is written into a temporary directory, renamed to ``backup-<global step>.ckpt``, and only then
    named by ``tfaccel_backup.json`` (replaced atomically): a save that fails or is killed at any point leaves the
    previous backup whole and still the one a restart resumes from.
    """
    from tfaccel.train.backups import commit_backup, read_backup

    os.makedirs(backup_dir, exist_ok=True)
    global_step = epoch * steps_per_epoch + step
    name = f"backup-{global_step}.ckpt"
    final = os.path.join(backup_dir, name)
    previous = read_backup(backup_dir)
    if previous is not None and previous["weights"] == name:
        return final  # this very point is the current backup already (positions only grow within a run)
    tmp = tempfile.mkdtemp(prefix=".tmp-backup-", suffix=".ckpt", dir=backup_dir)
    renamed = False
    try:
        checkpoint.write(os.path.join(tmp, _CKPT_PREFIX))
        if os.path.exists(final):  # left by a job killed after the rename, before the pointer named it
            shutil.rmtree(final)
        os.replace(tmp, final)
        renamed = True
        commit_backup(backup_dir, {"epoch": epoch, "step": step, "global_step": global_step, "weights": name,
                                   "format": PS_BACKUP_FORMAT, "steps_per_epoch": steps_per_epoch})
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if renamed:  # the pointer was not replaced: nothing names this directory
            shutil.rmtree(final, ignore_errors=True)
        raise
    return final


def restore_checkpoint_backup(state: Any, checkpoint: Any, *, backup_dir: str) -> None:
    """Loads the backup ``state`` (from ``read_backup``) into ``checkpoint``'s objects; every value must match."""
    if state.get("format") != PS_BACKUP_FORMAT:
        raise ConfigError(
            f"backup_dir {backup_dir}: holds {state['weights']}, a backup of the Keras training path; a "
            f"parameter_server job resumes only from its own {PS_BACKUP_FORMAT} backups. Resume it with the strategy "
            "that wrote it, or give this job another backup_dir")
    status = checkpoint.read(os.path.join(state["weights_path"], _CKPT_PREFIX))
    try:
        status.assert_consumed()
    except (AssertionError, ValueError) as exc:
        status.expect_partial()  # the error says it; no second warning when the objects are deleted
        why = " ".join(str(exc).split())
        raise ConfigError(f"backup_dir {backup_dir}: {state['weights']} does not match this model and optimizer "
                          f"({why[:300]}); the model changed since it was written. Remove the directory to start "
                          "from scratch") from exc


def exact_assign_add(variable: Any) -> None:
    """Makes a Keras 3 variable's ``assign_add`` the atomic TensorFlow one (see module docstring)."""
    import keras

    raw = getattr(variable, "value", variable)
    if not isinstance(variable, keras.Variable):
        return

    def assign_add(value: Any) -> Any:
        return raw.assign_add(value)

    object.__setattr__(variable, "assign_add", assign_add)


def _refuse(model: Any, data: FitData, callbacks: Sequence[Any], accum: int, validation_freq: Any) -> None:
    """ConfigError for what this loop cannot train exactly as Keras fit would, before anything runs."""
    import keras

    from tfaccel.train.loops.compiled import compiled_blockers

    if data.validation is not None:
        _should_eval(0, validation_freq)  # raises on a value Keras refuses too

    if type(model).train_step is not keras.Model.train_step:
        raise ConfigError(
            f"model {type(model).__name__} overrides train_step, which strategy parameter_server cannot run: Keras 3 "
            "fit does not run ParameterServerStrategy (keras-team/keras#18624) and tfaccel's coordinator loop "
            f"computes the step itself ({_WHY_NO_METRIC_OBJECTS}). Override compute_loss / compute_metrics instead "
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


def _leaf_metrics(metrics: Sequence[Any]) -> List[Any]:
    import keras

    out = []
    for metric in metrics:
        inner = getattr(metric, "metrics", None)  # Keras' CompileMetrics: a container of the compiled metrics
        if isinstance(inner, list) and all(isinstance(m, keras.metrics.Metric) for m in inner):
            out += _leaf_metrics(inner)
        else:
            out.append(metric)
    return out


def _check_metrics(model: Any) -> None:
    import keras

    for metric in _leaf_metrics(model.metrics):
        if not isinstance(metric, (keras.metrics.Mean, keras.metrics.Sum)):
            raise ConfigError(
                f"metrics: {type(metric).__name__} (name {metric.name!r}) cannot be computed under strategy "
                f"parameter_server: {_WHY_NO_METRIC_OBJECTS}, so tfaccel adds up per-batch totals on the coordinator, "
                f"which gives the result only of mean metrics (accuracy variants, mae, mse, ... any keras.metrics."
                f"MeanMetricWrapper). Compile without it and compute it after training with model.evaluate, or train "
                "with another strategy")


def _as_tensors(x: Any, y: Any, sample_weight: Any) -> Any:
    """The data as Keras' array adapter hands it to a step: floats in floatx, packed (x, y[, sw]) or x."""
    import keras
    import tensorflow as tf

    def convert(a: Any) -> Any:
        a = np.asarray(a)
        if np.issubdtype(a.dtype, np.floating) and a.dtype != np.dtype(keras.config.floatx()):
            a = a.astype(keras.config.floatx())
        return a

    if isinstance(x, list):
        x = tuple(x)
    if sample_weight is not None and isinstance(y, (list, tuple, dict)):
        sample_weight = tf.nest.map_structure(lambda _: sample_weight, y)  # one array for every output
    return tf.nest.map_structure(convert, keras.utils.pack_x_y_sample_weight(x, y, sample_weight))


class _Step:
    """Keras' train_step for one worker, with the metric updates returned as totals instead of applied."""

    def __init__(self, model: Any, *, backend: Any, accum: int) -> None:
        import tensorflow as tf

        self.model, self.strategy, self.accum = model, backend.strategy, accum
        self.optimizer = model.optimizer
        self.call_training = "training" in inspect.signature(model.call).parameters
        self.loss_training = "training" in inspect.signature(model.compute_loss).parameters
        seen: Dict[int, Any] = {}
        for metric in model.metrics:
            seen.update((id(v), v) for v in metric.variables)
        self.metric_variables = list(seen.values())
        self.state_variables = [v for v in model.variables if id(v) not in seen]
        # Keras 3.15 keeps the "loss" Mean in model._loss_tracker (keras/src/trainers/trainer.py); its train_step
        # updates it with the batch size as weight. There is no public handle on it.
        self.loss_tracker = getattr(model, "_loss_tracker", None)
        with backend.scope():
            self.steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="tfaccel_steps")

    def forward(self, batch: Any) -> tuple:
        """(scaled loss, metric totals) of one batch; layer state updates (BatchNorm, seeds) applied."""
        import keras
        import tensorflow as tf

        model = self.model
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
        # Metric variables start at zero; the weights are read once here, inside the caller's tape (Keras reads
        # the regularised weights from the scope's mapping).
        mapping = [(v, tf.zeros(v.shape, v.dtype)) for v in self.metric_variables]
        mapping += [(v, v) for v in model.trainable_variables]
        with keras.StatelessScope(state_mapping=mapping, collect_losses=True) as scope:
            y_pred = model(x, training=True) if self.call_training else model(x)
            kwargs = {"training": True} if self.loss_training else {}
            loss = model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, **kwargs)
            if self.loss_tracker is not None:
                replicas = tf.distribute.get_strategy().num_replicas_in_sync  # Keras' unscale_loss_for_distribution
                first = next(t for t in tf.nest.flatten(x) if t is not None)
                self.loss_tracker.update_state(loss * replicas if replicas > 1 else loss,
                                               sample_weight=tf.shape(first)[0])
            model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
        for variable in self.state_variables:  # what the forward pass changed outside the metrics
            value = scope.get_current_value(variable)
            if value is not None:
                variable.assign(value)
        totals = [scope.get_current_value(v) for v in self.metric_variables]
        return self.optimizer.scale_loss(loss), [t if t is not None else tf.zeros(v.shape, v.dtype)
                                                 for t, v in zip(totals, self.metric_variables)]

    def update(self, batches: Sequence[Any]) -> List[Any]:
        """One optimizer update from ``accum`` micro-batches; returns the metric totals of those batches."""
        import tensorflow as tf

        weights = self.model.trainable_variables
        grads_sum, totals = None, None
        for batch in batches:
            with tf.GradientTape() as tape:
                scaled, batch_totals = self.forward(batch)
            grads = tape.gradient(scaled, weights)
            grads_sum = grads if grads_sum is None else [a + b for a, b in zip(grads_sum, grads)]
            totals = batch_totals if totals is None else [a + b for a, b in zip(totals, batch_totals)]
        if len(batches) > 1:
            grads_sum = [g / len(batches) for g in grads_sum]
        self.optimizer.apply(grads_sum, weights)
        return totals

    def run_updates(self, groups: Sequence[Callable[[], Sequence[Any]]]) -> List[Any]:
        """Inside a scheduled function: the updates, each from its batches; the summed metric totals."""
        totals = None
        for batches in groups:
            out = self.strategy.run(self.update, args=(batches(),))
            out = [self.strategy.reduce("SUM", v, axis=None) for v in out]
            totals = out if totals is None else [a + b for a, b in zip(totals, out)]
        self.steps.assign_add(len(groups) * self.accum)
        return totals


class _Schedule:
    """The per-worker input (built on the workers) and the closures the coordinator schedules over it."""

    def __init__(self, step: _Step, data: FitData, *, backend: Any) -> None:
        import tensorflow as tf

        self.step, self.data, self.coordinator = step, data, backend.coordinator
        self.steps_per_epoch = data.steps_per_epoch
        strategy = backend.strategy
        if data.kind == "arrays":
            packed = _as_tensors(data.x, data.y, data.sample_weight)  # numpy: constants of the worker's dataset

            def dataset_fn(_: Any) -> Any:
                return tf.data.Dataset.from_tensors(packed).repeat()

            @tf.function
            def arrays_closure(iterator: Any, groups: Any) -> Any:
                held = next(iterator)  # every array, on this worker
                return step.run_updates([lambda g=g: [tf.nest.map_structure(lambda t: tf.gather(t, i), held)
                                                      for i in g] for g in groups])

            self._closure = arrays_closure
            per_worker = lambda: strategy.distribute_datasets_from_function(dataset_fn)  # noqa: E731
        else:
            user_fn = data.x
            per_worker = (lambda: strategy.distribute_datasets_from_function(lambda ctx: user_fn(ctx).repeat())) \
                if callable(user_fn) else user_fn
            self._closures: Dict[int, Any] = {}
        self.iterator = iter(self.coordinator.create_per_worker_dataset(per_worker))

    def _stream_closure(self, updates: int) -> Any:
        import tensorflow as tf

        if updates not in self._closures:
            step = self.step

            @tf.function
            def closure(iterator: Any) -> Any:
                return step.run_updates([lambda: [next(iterator) for _ in range(step.accum)]] * updates)

            self._closures[updates] = closure
        return self._closures[updates]

    def order(self, epoch: int) -> np.ndarray:
        """Example indices of an epoch, a function of (seed, epoch) only, as ``tfaccel.train.data.example_stream``."""
        data = self.data
        shuffled = data.shuffle and data.shuffle != "batch"
        n = data.num_examples
        return (np.random.default_rng([data.seed, epoch]).permutation(n) if shuffled else np.arange(n)).astype(np.int32)

    def schedule(self, order: Optional[np.ndarray], start: int, end: int) -> List[Any]:
        """Schedules steps ``[start, end)`` of an epoch (whole updates) in closures of ``STEPS_PER_CLOSURE`` updates."""
        import tensorflow as tf

        accum, batch = self.step.accum, self.data.batch_size
        remotes = []
        for first in range(start, end, accum * STEPS_PER_CLOSURE):
            last = min(end, first + accum * STEPS_PER_CLOSURE)
            if order is None:
                fn, args = self._stream_closure((last - first) // accum), (self.iterator,)
            else:
                groups = tuple(tuple(tf.constant(order[s * batch:(s + 1) * batch]) for s in range(u, u + accum))
                               for u in range(first, last, accum))
                fn, args = self._closure, (self.iterator, groups)
            remotes.append(self.coordinator.schedule(fn, args=args))
        return remotes


def _build(model: Any, data: FitData, *, backend: Any) -> None:
    """Creates, inside the scope (so on the ps tasks), what Keras' fit builds before its first step."""
    import keras
    import tensorflow as tf

    if data.kind == "arrays":
        sample = tf.nest.map_structure(lambda a: a[:data.batch_size],
                                       _as_tensors(data.x, data.y, data.sample_weight))
    else:  # one batch of the user's pipeline, read here on the coordinator
        fn = data.x
        ds = fn(tf.distribute.InputContext()) if callable(fn) else None
        if ds is None:
            raise ConfigError("strategy parameter_server: pass a dataset_fn(input_context), not a distributed dataset "
                              f"(received {type(fn).__name__}); each worker calls it to build its own pipeline")
        sample = next(iter(ds.take(1)))
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(sample)
    with backend.scope():
        y_pred = model(x, training=False)
        model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight)  # builds the compiled loss
        model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)  # builds the compiled metrics
        model.reset_metrics()
        opt = model.optimizer
        if not opt.built:
            opt.build(model.trainable_variables)  # inside the scope: slot variables on the ps tasks
    exact_assign_add(opt.iterations)
    if isinstance(opt, keras.optimizers.LossScaleOptimizer):
        exact_assign_add(opt.step_counter)


def _own_optimizer(model: Any) -> None:
    """Accumulation happens in this loop's closures: the optimizer gets its own class back (tfaccel.train.optim)."""
    import keras

    from tfaccel.train.optim import restore_optimizer_class

    opt = model.optimizer
    inner = opt.inner_optimizer if isinstance(opt, keras.optimizers.LossScaleOptimizer) else opt
    if getattr(inner, "tfaccel_accumulation_steps", 1) > 1:
        inner.tfaccel_accumulation_steps = 1
        restore_optimizer_class(model)


def _pythonify(logs: Any) -> Dict[str, Any]:
    """Keras' ``pythonify_logs``: nested dicts flattened, floats where possible."""
    result: Dict[str, Any] = {}
    for key, value in sorted((logs or {}).items()):
        if isinstance(value, dict):
            result.update(_pythonify(value))
            continue
        try:
            result[key] = float(np.asarray(value))
        except (TypeError, ValueError):
            result[key] = value
    return result


def _should_eval(epoch: int, validation_freq: Any) -> bool:
    if isinstance(validation_freq, int) and not isinstance(validation_freq, bool):
        return (epoch + 1) % validation_freq == 0
    if isinstance(validation_freq, (list, tuple)):
        return epoch + 1 in validation_freq
    raise ConfigError(f"validation_freq must be an int (every N epochs) or a list of 1-based epochs; received "
                      f"{validation_freq!r}. Pass e.g. validation_freq=1 or validation_freq=[1, 5]")


def _evaluate(model: Any, data: FitData, options: Dict[str, Any], test_step: Any, cb_list: Any) -> Dict[str, Any]:
    """Keras' evaluate as fit calls it, on the coordinator (one process: Keras' metric objects count right)."""
    import tensorflow as tf

    vx, vy, vsw = data.validation
    limit = options["validation_steps"]
    if vy is None and vsw is None and isinstance(vx, tf.data.Dataset):
        batches = vx.take(limit) if limit else vx
    else:
        packed = _as_tensors(vx, vy, vsw)
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
    logs = _pythonify(metric_logs if logs is None or set(logs) == set(metric_logs) else logs)
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


def _resume(state: Any, checkpoint: Any, *, backup_dir: str, step: _Step) -> Dict[str, Any]:
    restore_checkpoint_backup(state, checkpoint, backup_dir=backup_dir)
    resumed = {"epoch": state.epoch, "step": state.step, "global_step": int(state["global_step"]),
               "optimizer_iterations": int(step.optimizer.iterations.numpy()), "steps_counted": int(step.steps.numpy()),
               "backup": state["weights_path"]}
    get_logger().info("resumed from the backup at epoch %d, step %d (%s): optimizer.iterations %d, %d steps counted",
                      state.epoch, state.step, state["weights_path"], resumed["optimizer_iterations"],
                      resumed["steps_counted"])
    return resumed


def _train_epoch(sched: _Schedule, epoch: int, first: int, *, backup: Optional[Callable[[int, int], None]],
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
    _build(model, data, backend=backend)
    _check_metrics(model)
    if backend.coordinator is None:
        raise ConfigError("parameter_server backend has no ClusterCoordinator; is this process the chief?")
    check_output_dtype(model)  # warns about float16/bfloat16 outputs, as on the other training paths
    step = _Step(model, backend=backend, accum=accum)
    return state, step, _Schedule(step, data, backend=backend)


def _epoch_logs(model: Any, step: _Step, totals: List[np.ndarray], *, epoch: int, data: FitData,
                options: Dict[str, Any], test_step: Any, cb_list: Any) -> Dict[str, Any]:
    """Keras' epoch logs: the summed totals written into the model's metrics, then the validation pass."""
    import tensorflow as tf

    for variable, total in zip(step.metric_variables, totals):
        variable.assign(tf.cast(total, variable.dtype))
    logs = _pythonify(model.get_metrics_result())
    if data.validation is not None and _should_eval(epoch, options["validation_freq"]):
        logs.update(_evaluate(model, data, options, test_step, cb_list))
    return logs


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
        LoopResult with Keras' history; ``details``: optimizer iterations, steps counted, backups, the resume.

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
    counted_at_start = int(step.steps.numpy())
    seconds: List[float] = []
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
    cb_list.on_train_end(logs=logs)
    counted = int(step.steps.numpy())
    details.update(optimizer_iterations=int(model.optimizer.iterations.numpy()), steps_counted=counted,
                   data="per-worker arrays on the workers, order from (seed, epoch)" if data.kind == "arrays"
                   else "per-worker datasets built on the workers by the dataset_fn")
    return LoopResult(history=dict(model.history.history), epoch_seconds=seconds, steps=counted - counted_at_start,
                      details=details)
