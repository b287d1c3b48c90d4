"""ParameterServerStrategy training for Keras 3 models: a ClusterCoordinator loop.

Keras 3 ``model.fit`` does not accept ParameterServerStrategy datasets (seen on Keras 3.15.1 /
TF 2.21.0), so compile_and_fit drives PS training itself: per-worker datasets, several steps per
scheduled closure (amortising the RPCs), epochs and ``steps_per_epoch``, evaluation, a Keras-like
history, progress on the chief, checkpoints from the coordinator.

Pitfalls this module handles (all measured on this stack with real ps/worker processes):

* The optimizer must be built inside the strategy scope, or its slot variables land on the chief.
* Keras 3 ``Variable.assign_add`` is ``assign(read + value)`` (keras/src/backend/common/variables.py);
  workers updating ``optimizer.iterations`` concurrently overwrite each other (143 of 200 steps counted).
  The iteration counter is switched to TensorFlow's atomic ``tf.Variable.assign_add``, and tfaccel
  counts steps in its own raw ``tf.Variable`` as well.
* Keras metric objects miscount inside scheduled functions (3072 of 4096 examples): each closure
  returns per-batch sums, added up on the coordinator.

Backups (``backup_dir``): the variables live on the ps tasks, and only the coordinator knows how far training
got, so the coordinator writes them: a ``tf.train.Checkpoint`` of model, optimizer and step counter after
``coordinator.join()`` (no closure in flight, so the state is one consistent point of the schedule), at every
epoch end and every ``backup_freq`` steps. A restarted coordinator (against the same servers or a new
cluster) restores it and runs only the rest of the schedule, as TensorFlow's parameter-server guide asks of a
custom loop. The data order after a resume is not the one an uninterrupted run would have seen: updates are
asynchronous, so PS training is not bit-reproducible anyway.
"""

import os
import shutil
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from tfaccel.errors import ConfigError
from tfaccel.log import get_logger

__all__ = ["fit_parameter_server", "exact_assign_add", "write_checkpoint_backup", "restore_checkpoint_backup",
           "PS_BACKUP_FORMAT"]

# Steps per scheduled closure: fewer RPC round-trips, still fine-grained enough to spread over workers.
STEPS_PER_CLOSURE = 8
# The "format" a parameter-server backup names in tfaccel_backup.json (StepBackup's .weights.h5 has none).
PS_BACKUP_FORMAT = "tf.train.Checkpoint"
_CKPT_PREFIX = "ckpt"


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


def _loss_fn(loss: Any) -> Callable:
    import keras

    if isinstance(loss, keras.losses.Loss):
        return loss.call  # per-example values, no reduction
    fn = keras.losses.get(loss)
    if isinstance(fn, keras.losses.Loss):
        return fn.call
    return fn


def _metric_fns(metrics: Sequence[Any], loss: Any) -> Dict[str, Callable]:
    import keras

    loss_name = loss if isinstance(loss, str) else type(loss).__name__.lower()
    out: Dict[str, Callable] = {}
    for metric in metrics:
        if isinstance(metric, keras.metrics.Metric):
            raise ConfigError(
                f"metrics: {type(metric).__name__} objects miscount inside ParameterServer scheduled functions; pass "
                "metric names or functions (e.g. 'accuracy', 'mae'), which tfaccel sums on the coordinator")
        if metric in ("accuracy", "acc"):
            if "sparse" in loss_name:
                out["accuracy"] = keras.metrics.sparse_categorical_accuracy
            elif "binary" in loss_name:
                out["accuracy"] = keras.metrics.binary_accuracy
            else:
                out["accuracy"] = keras.metrics.categorical_accuracy
            continue
        fn = keras.metrics.get(metric) if isinstance(metric, str) else metric
        if not callable(fn) or isinstance(fn, keras.metrics.Metric):
            raise ConfigError(f"metrics: {metric!r} is not a per-example metric function usable in PS training")
        out[metric if isinstance(metric, str) else getattr(fn, "__name__", "metric")] = fn
    return out


def fit_parameter_server(build_model: Callable[[], Any], train_data: Any, *, backend: Any, plan: Any, batch: Any,
                         validation_data: Any, epochs: int, steps_per_epoch: Optional[int], optimizer: Any,
                         learning_rate: Optional[float], scale_learning_rate: Optional[str], warmup_epochs: float,
                         loss: Any, metrics: Optional[Sequence[Any]], gradient_accumulation_steps: int,
                         clipnorm: Optional[float], global_clipnorm: Optional[float],
                         checkpoint_dir: Optional[str], seed: Optional[int], shuffle: bool,
                         verbose: Any, backup_dir: Optional[str] = None, backup_freq: Optional[int] = None,
                         backup_state: Any = None) -> Any:
    """Trains under ParameterServerStrategy with a ClusterCoordinator loop; see compile_and_fit.

    ``backup_state`` is what ``tfaccel.train.backups.read_backup(backup_dir)`` found (None: start from scratch).
    """
    import keras
    import numpy as np
    import tensorflow as tf

    from tfaccel.train.backups import remove_backup
    from tfaccel.train.data import is_batched
    from tfaccel.precision import check_output_dtype, wrap_loss_scale
    from tfaccel.train.api import FitResult, build_model_and_optimizer

    log = get_logger()
    strategy, coordinator = backend.strategy, backend.coordinator
    global_batch = batch.global_batch
    accum = gradient_accumulation_steps
    if backup_dir and backup_freq and backup_freq % accum:
        raise ConfigError(f"parameter_server: backup_freq={backup_freq} must be a multiple of "
                          f"gradient_accumulation_steps={accum}: the coordinator can only back up between optimizer "
                          f"updates (try backup_freq={max(accum, backup_freq // accum * accum)})")
    if backup_state and backup_state.get("format") != PS_BACKUP_FORMAT:
        restore_checkpoint_backup(backup_state, None, backup_dir=backup_dir)  # raises, naming the mismatch
    start_epoch, start_step = (backup_state.epoch, backup_state.step) if backup_state else (0, 0)

    # ---- data: one pipeline per worker, created on the worker --------------------------------------------------
    if callable(train_data) and not isinstance(train_data, tf.data.Dataset):
        if steps_per_epoch is None:
            raise ConfigError("train_data is a dataset_fn; pass steps_per_epoch")
        user_fn = train_data

        def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
            ds = user_fn(ctx)
            if not is_batched(ds) and global_batch:
                ds = ds.batch(global_batch)
            return ds.repeat().prefetch(tf.data.AUTOTUNE)

        steps = steps_per_epoch
        num_examples = None
    else:
        if isinstance(train_data, tf.data.Dataset):
            if is_batched(train_data):
                raise ConfigError("parameter_server: pass unbatched data (arrays or an unbatched dataset) so each "
                                  "worker batches it; a pre-batched dataset cannot be rebuilt on the workers")
            xs = list(train_data.as_numpy_iterator())
            x = np.stack([e[0] for e in xs])
            y = np.stack([e[1] for e in xs])
        else:
            x, y = train_data
        x, y = np.asarray(x), np.asarray(y)
        if len(x) != len(y):
            raise ConfigError(f"train_data: x has {len(x)} examples but y has {len(y)}; they must match")
        num_examples = len(x)
        steps = steps_per_epoch or max(1, num_examples // global_batch)
        seed_base = 0 if seed is None else int(seed)
        # A resumed job must not replay the order the first run started with: the resume point joins the seed.
        seed_base = seed_base * 1_000_003 + 7919 * (start_epoch * steps + start_step)

        def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
            ds = tf.data.Dataset.from_tensor_slices((x, y)).cache()
            if shuffle:
                ds = ds.shuffle(len(x), seed=seed_base + ctx.input_pipeline_id, reshuffle_each_iteration=True)
            return ds.repeat().batch(global_batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)

    updates_per_epoch = max(1, steps // accum)
    epoch_steps = updates_per_epoch * accum  # what an epoch runs (a remainder short of one update is dropped)
    if backup_state and (start_step >= epoch_steps or start_step % accum):
        raise ConfigError(f"backup_dir {backup_dir}: the backup is at step {start_step} of epoch {start_epoch}, but an "
                          f"epoch now has {epoch_steps} steps in updates of {accum}; the data, batch size or "
                          "gradient_accumulation_steps changed since it was written")

    if coordinator is None:
        raise ConfigError("parameter_server backend has no ClusterCoordinator; is this process the chief?")
    per_worker = coordinator.create_per_worker_dataset(
        lambda: strategy.distribute_datasets_from_function(dataset_fn))
    iterator = iter(per_worker)

    # ---- model, optimizer and counters, all built inside the scope (so they live on the ps tasks) ----------------
    with strategy.scope():
        # Accumulation happens in this loop's step (several micro-batches per update), not in the optimizer.
        model, loss_, metrics_, opt, opt_info = build_model_and_optimizer(
            build_model, backend=backend, loss=loss, metrics=metrics, optimizer=optimizer,
            learning_rate=learning_rate, scale_learning_rate=scale_learning_rate,
            warmup_steps=int(round(warmup_epochs * updates_per_epoch)), clipnorm=clipnorm,
            global_clipnorm=global_clipnorm, gradient_accumulation_steps=1)
        opt = wrap_loss_scale(opt, plan.precision)  # a LossScaleOptimizer under mixed_float16
        opt.build(model.trainable_variables)  # inside the scope: slot variables on the ps tasks
        exact_assign_add(opt.iterations)
        step_counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="tfaccel_steps")
    check_output_dtype(model)  # warns about float16/bfloat16 outputs, as on the other training paths
    loss_fn = _loss_fn(loss_)
    metric_fns = _metric_fns(metrics_, loss_)
    names = ["loss"] + list(metric_fns)
    scaled = isinstance(opt, keras.optimizers.LossScaleOptimizer)

    def one_update(batches: Any) -> List[Any]:
        """One optimizer update from ``accum`` micro-batches; returns per-batch sums (and the example count)."""
        sums = [tf.constant(0.0)] * (len(names) + 1)
        grads_total = None
        for xb, yb in batches:
            with tf.GradientTape() as tape:
                pred = model(xb, training=True)
                per_ex = tf.cast(loss_fn(yb, pred), tf.float32)
                value = tf.reduce_mean(per_ex)
                if model.losses:
                    value += tf.add_n([tf.cast(l, tf.float32) for l in model.losses])
                target = opt.scale_loss(value) if scaled else value
            grads = tape.gradient(target, model.trainable_variables)
            grads_total = grads if grads_total is None else [a + b for a, b in zip(grads_total, grads)]
            count = tf.cast(tf.shape(per_ex)[0], tf.float32)
            parts = [tf.reduce_sum(per_ex)] + [tf.reduce_sum(tf.cast(fn(yb, pred), tf.float32))
                                               for fn in metric_fns.values()]
            sums = [s + p for s, p in zip(sums, parts + [count])]
        if accum > 1:
            grads_total = [g / accum for g in grads_total]
        opt.apply(grads_total, model.trainable_variables)
        return sums

    def make_closure(n_updates: int) -> Callable:
        @tf.function
        def closure(it: Any) -> Any:
            totals = None
            for _ in range(n_updates):
                batches = [next(it) for _ in range(accum)]  # next() outside the replica function
                out = strategy.run(one_update, args=(batches,))
                out = [strategy.reduce("SUM", v, axis=None) for v in out]
                totals = out if totals is None else [a + b for a, b in zip(totals, out)]
            step_counter.assign_add(n_updates * accum)
            return totals

        return closure

    per_closure = min(STEPS_PER_CLOSURE, updates_per_epoch)
    closure_fns: Dict[int, Callable] = {}

    def schedule(n_updates: int) -> List[Any]:
        """Schedules ``n_updates`` optimizer updates in closures of at most ``per_closure``."""
        remotes = []
        while n_updates > 0:
            n = min(per_closure, n_updates)
            if n not in closure_fns:
                closure_fns[n] = make_closure(n)
            remotes.append(coordinator.schedule(closure_fns[n], args=(iterator,)))
            n_updates -= n
        return remotes

    manager = None
    if checkpoint_dir:
        ckpt = tf.train.Checkpoint(model=model, optimizer=opt)
        manager = tf.train.CheckpointManager(ckpt, checkpoint_dir, max_to_keep=3, checkpoint_name="ckpt")
    # The backup holds the step counter too, so that a resumed job counts the whole schedule.
    backup_ckpt = tf.train.Checkpoint(model=model, optimizer=opt, steps=step_counter) if backup_dir else None
    resumed = None
    if backup_state:
        restore_checkpoint_backup(backup_state, backup_ckpt, backup_dir=backup_dir)
        resumed = {"epoch": start_epoch, "step": start_step, "global_step": int(backup_state["global_step"]),
                   "optimizer_iterations": int(opt.iterations.numpy()), "steps_counted": int(step_counter.numpy()),
                   "backup": backup_state["weights_path"]}
        log.info("resumed from the backup at epoch %d, step %d (%s): optimizer.iterations %d, %d steps counted",
                 start_epoch, start_step, backup_state["weights_path"], resumed["optimizer_iterations"],
                 resumed["steps_counted"])
    counted_at_start = int(step_counter.numpy())
    log.info("plan: %s", plan.summary())
    log.info("parameter_server: %d workers, %d steps/epoch in closures of %d, batch %d per step%s",
             backend.num_workers, epoch_steps, per_closure * accum, global_batch,
             f"; backups every {backup_freq} steps and each epoch end" if backup_dir and backup_freq else
             ("; backups each epoch end" if backup_dir else ""))

    backups_written = 0

    def back_up(epoch: int, step: int) -> None:
        nonlocal backups_written
        write_checkpoint_backup(backup_dir, backup_ckpt, epoch=epoch, step=step, steps_per_epoch=epoch_steps)
        backups_written += 1

    history: Dict[str, List[float]] = {}
    epoch_seconds: List[float] = []
    epoch_ran: List[int] = []
    t_all = time.perf_counter()
    for epoch in range(start_epoch, epochs):
        t0 = time.perf_counter()
        first = start_step if epoch == start_epoch else 0
        remotes = []
        position = first
        while position < epoch_steps:
            # With backups every backup_freq steps, the epoch runs in segments ending at those steps; join() after
            # each so that the backup is one consistent point (no closure in flight, every update counted).
            end = epoch_steps
            if backup_dir and backup_freq:
                end = min(end, (position // backup_freq + 1) * backup_freq)
            remotes += schedule((end - position) // accum)
            coordinator.join()
            position = end
            if backup_dir and position < epoch_steps:
                back_up(epoch, position)
        totals = np.sum([np.asarray([float(v) for v in r.fetch()]) for r in remotes], axis=0)
        epoch_seconds.append(time.perf_counter() - t0)
        epoch_ran.append(epoch_steps - first)
        count = totals[-1]
        for name, total in zip(names, totals[:-1]):
            history.setdefault(name, []).append(float(total / max(count, 1.0)))
        if validation_data is not None:
            for name, value in _evaluate(model, validation_data, loss_fn, metric_fns, global_batch).items():
                history.setdefault(f"val_{name}", []).append(value)
        if manager is not None:
            manager.save(checkpoint_number=epoch + 1)
        if backup_dir:
            back_up(epoch + 1, 0)
        if verbose != 0:
            metrics_line = " - ".join(f"{k}: {v[-1]:.4f}" for k, v in history.items())
            log.info("epoch %d/%d - %d steps - %.1fs - %s", epoch + 1, epochs, epoch_ran[-1],
                     epoch_seconds[-1], metrics_line)
    seconds = time.perf_counter() - t_all
    if backup_dir:
        remove_backup(backup_dir)  # training completed: nothing to resume any more
    counted = int(step_counter.numpy())
    timed, timed_steps = (epoch_seconds[1:], epoch_ran[1:]) if len(epoch_seconds) > 1 else (epoch_seconds, epoch_ran)
    ex_per_sec = sum(timed_steps) * global_batch / sum(timed) if sum(timed) > 0 else 0.0
    result = FitResult(
        model=model, history=history, plan=plan, examples_per_sec=float(ex_per_sec), seconds=seconds,
        global_batch_size=global_batch, steps_per_epoch=epoch_steps, steps=counted - counted_at_start,
        resumed_from=(start_epoch, start_step) if backup_state else None,
        details={**opt_info, "optimizer_iterations": int(opt.iterations.numpy()), "steps_counted": counted,
                 "checkpoints": [manager.latest_checkpoint] if manager else [],
                 "backups_written": backups_written, "resumed": resumed,
                 "data": "per-worker datasets on the workers"})
    log.info("%s", result.summary())
    return result


def _evaluate(model: Any, data: Any, loss_fn: Callable, metric_fns: Dict[str, Callable], batch: int) -> Dict[str, float]:
    """Evaluates on the coordinator (variables are read from the ps tasks): exact sums, no metric objects."""
    import numpy as np
    import tensorflow as tf

    if isinstance(data, tf.data.Dataset):
        ds = data if _batched(data) else data.batch(batch)
    else:
        ds = tf.data.Dataset.from_tensor_slices(tuple(data)).batch(batch)
    sums: Dict[str, float] = {"loss": 0.0, **{k: 0.0 for k in metric_fns}}
    count = 0
    for xb, yb in ds:
        pred = model(xb, training=False)
        sums["loss"] += float(tf.reduce_sum(tf.cast(loss_fn(yb, pred), tf.float32)))
        for name, fn in metric_fns.items():
            sums[name] += float(tf.reduce_sum(tf.cast(fn(yb, pred), tf.float32)))
        count += int(np.shape(pred)[0])
    return {k: v / max(count, 1) for k, v in sums.items()}


def _batched(ds: Any) -> bool:
    from tfaccel.train.data import is_batched

    return is_batched(ds)
