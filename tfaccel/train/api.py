"""``compile_and_fit``: one call that builds, compiles and fits a Keras model on any backend."""

import dataclasses
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from tfaccel.errors import ConfigError, invalid_choice
from tfaccel.log import get_logger

__all__ = ["FitResult", "compile_and_fit", "STEPS_PER_EXECUTION_AUTO_MAX"]

# Upper bound of steps_per_execution="auto": enough to hide Python/dispatch overhead of small models
# (measured: 64 steps per execution + XLA gave 6.3x the throughput of a naive fit on an MNIST MLP here).
STEPS_PER_EXECUTION_AUTO_MAX = 64
VERBOSE_CHOICES = ("auto", 0, 1, 2)
LOOP_CHOICES = ("auto", "keras", "compiled")


@dataclasses.dataclass(frozen=True)
class FitResult:
    """What compile_and_fit did.

    Attributes:
        model: the trained Keras model.
        history: ``{"loss": [...], "val_loss": [...], ...}``, one value per epoch, like Keras.
        plan: the ``Plan`` (strategy, precision, XLA and why).
        examples_per_sec: training throughput, leaving out the first epoch when there are several.
        seconds: wall time of the training loop.
        global_batch_size: examples per optimizer micro-step over all replicas.
        steps_per_epoch: steps per epoch.
        steps: optimizer micro-steps run by this call (after a resume, only the remaining ones).
        resumed_from: ``(epoch, step)`` of the backup this run resumed from, or None.
        details: everything else worth knowing (learning rate rule, data pipeline, checkpoints).
    """

    model: Any
    history: Dict[str, List[float]]
    plan: Any
    examples_per_sec: float
    seconds: float
    global_batch_size: Optional[int]
    steps_per_epoch: int
    steps: int
    resumed_from: Optional[tuple] = None
    details: Dict[str, Any] = dataclasses.field(default_factory=dict)

    def summary(self) -> str:
        last = {k: v[-1] for k, v in self.history.items() if v}
        metrics = ", ".join(f"{k}={v:.4g}" for k, v in last.items())
        return (f"trained {self.steps} steps in {self.seconds:.1f}s, {self.examples_per_sec:,.0f} examples/s; "
                f"{metrics}; plan: {self.plan.summary()}")


def _validate(build_model: Any, *, epochs: Any, steps_per_epoch: Any, warmup_epochs: Any,
              gradient_accumulation_steps: Any, steps_per_execution: Any, verbose: Any, loss: Any,
              callbacks: Any, backup_freq: Any) -> None:
    import keras

    if not callable(build_model) or isinstance(build_model, keras.layers.Layer):
        raise ConfigError(f"build_model must be a callable returning a keras.Model (it is called inside the strategy "
                          f"scope); received {type(build_model).__name__}. Pass the function, not its result: "
                          "compile_and_fit(build_model, ...) rather than compile_and_fit(build_model(), ...)")
    for name, value, minimum in (("epochs", epochs, 1), ("gradient_accumulation_steps", gradient_accumulation_steps, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(f"{name} must be a whole number >= {minimum}; received {value!r}")
    for name, value in (("steps_per_epoch", steps_per_epoch), ("backup_freq", backup_freq)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"{name} must be None or a whole number >= 1; received {value!r}")
    if isinstance(warmup_epochs, bool) or not isinstance(warmup_epochs, (int, float)) or warmup_epochs < 0:
        raise ConfigError(f"warmup_epochs must be a number >= 0; received {warmup_epochs!r}")
    if steps_per_execution != "auto" and (isinstance(steps_per_execution, bool)
                                          or not isinstance(steps_per_execution, int) or steps_per_execution < 1):
        raise ConfigError(f"steps_per_execution must be 'auto' or a whole number >= 1; received {steps_per_execution!r}")
    if verbose not in VERBOSE_CHOICES or isinstance(verbose, bool):
        raise invalid_choice("verbose", verbose, [str(v) for v in VERBOSE_CHOICES])
    if isinstance(callbacks, (str, bytes)) or not isinstance(callbacks, (list, tuple)):
        raise ConfigError(f"callbacks must be a list of keras callbacks; received {type(callbacks).__name__}")


def _choose_steps_per_execution(requested: Union[str, int], *, steps_per_epoch: int, backup_freq: Optional[int],
                                backend: Any) -> tuple:
    if backend.name == "multi_worker":
        # Keras 3.15's multi-step loop (TensorFlowTrainer.multi_step_on_iterator) fails under
        # MultiWorkerMirroredStrategy: "You must feed a value for placeholder tensor .../while/cond/Placeholder"
        # from the distributed iterator's has_next (seen on Keras 3.15.1 / TF 2.21.0).
        reason = "multi_worker: Keras 3.15's multi-step loop fails under MultiWorkerMirroredStrategy"
        if requested not in ("auto", 1):
            get_logger().warning("steps_per_execution=%s cannot work here (%s); using 1", requested, reason)
        return 1, reason
    if requested != "auto":
        return int(requested), "given"
    if not backend.uses_keras_fit:
        return 1, "parameter_server: the coordinator schedules steps itself"
    spe = min(steps_per_epoch, STEPS_PER_EXECUTION_AUTO_MAX)
    if backup_freq:
        spe = max(1, min(spe, backup_freq))
        while backup_freq % spe:
            spe -= 1
        return spe, f"auto: min(steps/epoch, {STEPS_PER_EXECUTION_AUTO_MAX}) dividing backup_freq={backup_freq}"
    return spe, f"auto: min(steps/epoch={steps_per_epoch}, {STEPS_PER_EXECUTION_AUTO_MAX})"


def build_model_and_optimizer(build_model: Callable[[], Any], *, backend: Any, loss: Any, metrics: Any,
                              optimizer: Any, learning_rate: Optional[float], scale_learning_rate: Optional[str],
                              warmup_steps: int, clipnorm: Optional[float], global_clipnorm: Optional[float],
                              gradient_accumulation_steps: int) -> tuple:
    """Builds the model and tfaccel's optimizer; call inside the strategy scope (every training path does).

    Returns:
        (model, loss, metrics, optimizer, optimizer description).
    """
    import keras

    from tfaccel.train.optim import make_optimizer

    model = build_model()
    if not isinstance(model, keras.Model):
        raise ConfigError(f"build_model must return a keras.Model; it returned {type(model).__name__}")
    loss_, metrics_ = _resolve_loss(model, loss, metrics)
    opt, opt_info = make_optimizer(optimizer, learning_rate=learning_rate, replicas=backend.num_replicas_in_sync,
                                   scale_learning_rate=scale_learning_rate, warmup_steps=warmup_steps,
                                   clipnorm=clipnorm, global_clipnorm=global_clipnorm,
                                   gradient_accumulation_steps=gradient_accumulation_steps)
    return model, loss_, metrics_, opt, opt_info


def _resolve_loss(model: Any, loss: Any, metrics: Any) -> tuple:
    if loss is None:
        existing = getattr(model, "loss", None)
        if existing is None:
            raise ConfigError("loss is required (e.g. loss='sparse_categorical_crossentropy'), unless build_model "
                              "returns a model it already compiled with one")
        loss = existing
    return loss, list(metrics or [])


def compile_and_fit(
    build_model: Callable[[], Any],
    train_data: Any,
    *,
    validation_data: Any = None,
    epochs: int = 1,
    steps_per_epoch: Optional[int] = None,
    global_batch_size: Optional[int] = None,
    per_replica_batch_size: Optional[int] = None,
    strategy: str = "auto",
    precision: str = "auto",
    jit_compile: Union[str, bool] = "auto",
    optimizer: Any = "adam",
    learning_rate: Optional[float] = None,
    scale_learning_rate: Optional[str] = "linear",
    warmup_epochs: float = 0,
    loss: Any = None,
    metrics: Optional[Sequence[Any]] = None,
    gradient_accumulation_steps: int = 1,
    clipnorm: Optional[float] = None,
    global_clipnorm: Optional[float] = None,
    steps_per_execution: Union[str, int] = "auto",
    checkpoint_dir: Optional[str] = None,
    backup_dir: Optional[str] = None,
    backup_freq: Optional[int] = None,
    tensorboard_dir: Optional[str] = None,
    callbacks: Sequence[Any] = (),
    verbose: Union[str, int] = "auto",
    seed: Optional[int] = None,
    shuffle: bool = True,
    strategy_options: Optional[Dict[str, Any]] = None,
    loop: str = "auto",
) -> FitResult:
    """Builds, compiles and fits a Keras model on the best (or the named) backend.

    Args:
        build_model: ``() -> keras.Model``, called inside the strategy scope.
        train_data: ``(x, y)`` arrays, a ``tf.data.Dataset`` (batched: used as given; unbatched: batched by the
            global batch), or ``dataset_fn(input_context) -> Dataset`` for per-worker pipelines.
        validation_data: same forms as ``train_data`` (not a dataset_fn). Defaults to None.
        epochs: epochs to train. Defaults to 1.
        steps_per_epoch: steps per epoch; required for a dataset_fn. Defaults to the data's length.
        global_batch_size: examples per step over all replicas. Give this or ``per_replica_batch_size``;
            if both, they must agree. Defaults to 32 per replica.
        per_replica_batch_size: examples per step per replica.
        strategy: a name from ``tfaccel.strategies.STRATEGY_NAMES`` or ``"auto"``. Defaults to "auto".
        precision: ``"auto"``, ``"float32"``, ``"mixed_float16"`` or ``"mixed_bfloat16"``. Defaults to "auto".
        jit_compile: ``"auto"``, True or False; True falls back with a warning where XLA cannot work.
        optimizer: a name, a Keras optimizer (its config is reused) or a callable returning one. Defaults to "adam".
        learning_rate: single-replica learning rate. Defaults to the optimizer's default.
        scale_learning_rate: ``"linear"``, ``"sqrt"`` or ``"none"``: scaling by replicas. Defaults to "linear".
        warmup_epochs: epochs of linear warmup from the unscaled to the scaled rate. Defaults to 0.
        loss, metrics: as for ``model.compile``.
        gradient_accumulation_steps: micro-batches per optimizer update, under any strategy. Defaults to 1.
        clipnorm, global_clipnorm: clipping of the aggregated (all-reduced) gradients.
        steps_per_execution: steps per compiled call; "auto" picks up to 64. Defaults to "auto".
        checkpoint_dir: the chief writes a ``tf.train.Checkpoint`` here at each epoch end. Defaults to None.
        backup_dir: backups for fault tolerance; a job restarted with the same directory resumes from the last
            backup (epoch and step), and the backup is removed when training completes. Under parameter_server
            the coordinator writes them (a ``tf.train.Checkpoint``, after ``coordinator.join()``) and a restarted
            chief resumes; ``details["resumed"]`` says from where. Defaults to None.
        backup_freq: also back up every this many steps (besides each epoch end); under parameter_server a
            multiple of ``gradient_accumulation_steps``. Defaults to None.
        tensorboard_dir: TensorBoard logs, from the chief only. Defaults to None.
        callbacks: extra Keras callbacks.
        verbose: "auto" (progress bar on the chief when attached to a terminal, one line per epoch otherwise,
            silent on other workers), 0, 1 or 2.
        seed: seeds weights and the data order (a function of (seed, epoch)). Defaults to None.
        shuffle: shuffle array / unbatched dataset inputs each epoch. Defaults to True.
        strategy_options: options of the strategy entry (e.g. ``{"device_names": ["/gpu:0", "/gpu:1"]}``).
        loop: ``"auto"`` (tfaccel's compiled whole-epoch loop where it trains exactly like ``fit``: one replica,
            array data, no per-batch callbacks; Keras ``fit`` elsewhere), ``"keras"`` or ``"compiled"``.
            Defaults to "auto".

    Returns:
        A ``FitResult``.

    Raises:
        ConfigError: a bad argument or combination, before any training starts.

    Example:
        >>> import numpy as np, keras, tfaccel
        >>> x, y = np.random.rand(256, 8).astype("float32"), np.random.randint(0, 2, 256)
        >>> def build():
        ...     return keras.Sequential([keras.Input((8,)), keras.layers.Dense(2, activation="softmax")])
        >>> result = tfaccel.compile_and_fit(build, (x, y), loss="sparse_categorical_crossentropy",
        ...                                  epochs=2, global_batch_size=64)  # doctest: +SKIP
        >>> result.history["loss"]  # doctest: +SKIP
    """
    _validate(build_model, epochs=epochs, steps_per_epoch=steps_per_epoch, warmup_epochs=warmup_epochs,
              gradient_accumulation_steps=gradient_accumulation_steps, steps_per_execution=steps_per_execution,
              verbose=verbose, loss=loss, callbacks=callbacks, backup_freq=backup_freq)
    from tfaccel.train.optim import validate_optimizer_args

    validate_optimizer_args(optimizer, learning_rate=learning_rate, scale_learning_rate=scale_learning_rate,
                            clipnorm=clipnorm, global_clipnorm=global_clipnorm)
    if loop not in LOOP_CHOICES:
        raise invalid_choice("loop", loop, LOOP_CHOICES)
    if callable(validation_data) and not hasattr(validation_data, "element_spec"):
        raise ConfigError("validation_data cannot be a dataset_fn; pass (x, y) arrays or a tf.data.Dataset")
    import keras

    from tfaccel.train.backups import ChiefCheckpoint, StepBackup, Throughput, read_backup, remove_backup
    from tfaccel.train.data import is_batched, make_input, resolve_batch_sizes
    from tfaccel.plan import resolve_plan
    from tfaccel.precision import set_precision

    log = get_logger()
    if seed is not None:
        keras.utils.set_random_seed(int(seed))
    plan, backend = resolve_plan(strategy=strategy, precision=precision, jit_compile=jit_compile,
                                 strategy_options=strategy_options)
    set_precision(plan.precision)
    import tensorflow as tf

    pre_batched = isinstance(train_data, tf.data.Dataset) and is_batched(train_data)
    batch = resolve_batch_sizes(global_batch_size=global_batch_size, per_replica_batch_size=per_replica_batch_size,
                                replicas=backend.num_replicas_in_sync, pre_batched=pre_batched)
    drop_remainder = backend.name == "tpu"
    state = read_backup(backup_dir)
    if state and state.get("format") and backend.name != "parameter_server":
        raise ConfigError(f"backup_dir {backup_dir}: holds {state['weights']}, a {state['format']} backup written by "
                          f"a parameter_server job; strategy {backend.name} resumes only from its own Keras weight "
                          "backups. Resume it with strategy='parameter_server', or give this job another backup_dir")
    if backup_dir and backend.name == "horovod":  # only rank 0 writes backups: every rank resumes from its one
        from tfaccel.strategies.horovod import agree_on_backup

        state = agree_on_backup(state)
    start_epoch, start_step = (state.epoch, state.step) if state else (0, 0)
    if state and start_epoch >= epochs:
        log.info("backup in %s says training already finished (epoch %d of %d)", backup_dir, start_epoch, epochs)

    if not backend.uses_keras_fit:
        from tfaccel.train.loops.coordinator import fit_parameter_server

        unsupported = {name: value for name, value in (
            ("tensorboard_dir", tensorboard_dir), ("callbacks", list(callbacks) or None),
            ("loop", None if loop == "auto" else loop),
            ("steps_per_execution", None if steps_per_execution == "auto" else steps_per_execution)) if value}
        if unsupported:
            raise ConfigError(
                f"strategy {backend.name}: {', '.join(f'{k}={v!r}' for k, v in unsupported.items())} cannot apply to "
                "tfaccel's ClusterCoordinator loop (Keras callbacks and fit options do not run there). Supported: "
                "epochs, steps_per_epoch, validation_data, checkpoint_dir and backup_dir/backup_freq (written by the "
                "coordinator), metrics as names or functions, gradient_accumulation_steps, clipping, learning-rate "
                "scaling and warmup")

        return fit_parameter_server(
            build_model, train_data, backend=backend, plan=plan, batch=batch, validation_data=validation_data,
            epochs=epochs, steps_per_epoch=steps_per_epoch, optimizer=optimizer, learning_rate=learning_rate,
            scale_learning_rate=scale_learning_rate, warmup_epochs=warmup_epochs, loss=loss, metrics=metrics,
            gradient_accumulation_steps=gradient_accumulation_steps, clipnorm=clipnorm,
            global_clipnorm=global_clipnorm, checkpoint_dir=checkpoint_dir, seed=seed, shuffle=shuffle,
            verbose=verbose, backup_dir=backup_dir, backup_freq=backup_freq, backup_state=state)

    inp = make_input(train_data, backend=backend, batch=batch, epochs=epochs, seed=seed, shuffle=shuffle,
                     drop_remainder=drop_remainder, steps_per_epoch=steps_per_epoch, start_epoch=start_epoch,
                     start_step=start_step)
    steps = inp.steps_per_epoch
    if state and start_step >= steps:
        raise ConfigError(f"backup_dir {backup_dir}: the backup is at step {start_step} of epoch {start_epoch}, but an "
                          f"epoch now has only {steps} steps; the data or batch size changed since it was written")
    val = None
    if validation_data is not None:
        val = make_input(validation_data, backend=backend, batch=batch, epochs=1, seed=None, shuffle=False,
                         drop_remainder=drop_remainder, what="validation_data")
    spe, spe_reason = _choose_steps_per_execution(steps_per_execution, steps_per_epoch=steps, backup_freq=backup_freq,
                                                  backend=backend)
    updates_per_epoch = max(1, steps // gradient_accumulation_steps)
    with backend.scope():
        model, loss_, metrics_, opt, opt_info = build_model_and_optimizer(
            build_model, backend=backend, loss=loss, metrics=metrics, optimizer=optimizer,
            learning_rate=learning_rate, scale_learning_rate=scale_learning_rate,
            warmup_steps=int(round(warmup_epochs * updates_per_epoch)), clipnorm=clipnorm,
            global_clipnorm=global_clipnorm, gradient_accumulation_steps=gradient_accumulation_steps)
        opt = backend.wrap_optimizer(opt)
        plan = _refine_plan_for_model(plan, model, jit_compile)
        model.compile(optimizer=opt, loss=loss_, metrics=metrics_, jit_compile=plan.jit_compile,
                      steps_per_execution=spe)
        if state:
            if not model.built:
                raise ConfigError("resuming from backup_dir needs a built model: give build_model's model an "
                                  "Input layer (keras.Input(shape)) so its weights exist before training")
            # model.optimizer: under mixed_float16 the LossScaleOptimizer, whose own variables (loss scale, step
            # counter) the backup holds too; with only the inner optimizer built, Keras skips loading them
            # (UserWarning "... has 12 variables whereas the saved optimizer has 14") and the scale restarts.
            model.optimizer.build(model.trainable_variables)
            if state["weights_path"]:  # None: a Horovod rank without rank 0's file gets rank 0's broadcast
                model.load_weights(state["weights_path"])
    _warn_float16_outputs(model, plan)

    chief = backend.is_chief
    if verbose == "auto":
        verbose_ = (1 if sys.stdout.isatty() else 2) if chief else 0
    else:
        verbose_ = verbose if chief else 0
    timer = Throughput(examples_per_step=batch.global_batch or 0)
    # Backend callbacks first: Horovod's metric averaging must run before a user's EarlyStopping or
    # checkpoint callback reads the metrics, or ranks could stop at different epochs and hang.
    cbs: List[Any] = list(backend.extra_callbacks()) + list(callbacks) + [timer]
    backup_cb = None
    if backup_dir:
        backup_cb = StepBackup(backup_dir, save_freq=backup_freq, is_chief=chief, step_offset=start_step,
                               steps_per_epoch=steps)
        cbs.append(backup_cb)
    ckpt_cb = None
    if checkpoint_dir:
        ckpt_cb = ChiefCheckpoint(checkpoint_dir, is_chief=chief,
                                  every_worker_saves=backend.name == "multi_worker")
        cbs.append(ckpt_cb)
    if tensorboard_dir and chief:
        cbs.append(keras.callbacks.TensorBoard(tensorboard_dir))

    from tfaccel.compiled_loop import compiled_loop_blockers, fit_compiled

    blockers = compiled_loop_blockers(backend=backend, data_kind=inp.kind, callbacks=list(callbacks),
                                      backup_freq=backup_freq, steps_per_execution=steps_per_execution,
                                      steps_per_epoch_given=steps_per_epoch is not None)
    if validation_data is not None and val is not None and val.kind != "arrays":
        blockers.append("validation_data is not in-memory arrays")
    blockers += [f"metric {m!r} is a stateful Metric object" for m in metrics_ if not (isinstance(m, str) or (
        callable(m) and not isinstance(m, keras.metrics.Metric)))]
    if loop == "compiled" and blockers:
        raise ConfigError("loop='compiled' cannot run this job: " + "; ".join(blockers) + ". Use loop='auto'.")
    use_compiled = loop == "compiled" or (loop == "auto" and not blockers)
    loop_reason = ("compiled whole-epoch loop (one replica, array data)" if use_compiled else
                   "keras fit" + (f" ({'; '.join(blockers)})" if blockers and loop == "auto" else " (asked for)"))
    say = log.info if verbose != 0 else log.debug  # verbose=0: quiet, like Keras
    if chief:
        say("plan: %s", plan.summary())
        say("data: %s; batch %s (%s); steps/epoch %d; loop: %s; steps_per_execution %d (%s); lr %s", inp.note,
                 batch.global_batch, batch.reason, steps, loop_reason, spe, spe_reason, opt_info["learning_rate_note"])
    history: Dict[str, List[float]] = {}
    t0 = time.perf_counter()
    ran_steps = 0
    epoch_seconds: Optional[List[float]] = None
    if use_compiled and start_epoch < epochs:
        from tfaccel.train.data import _as_arrays
        from tfaccel.train.loops.coordinator import _loss_fn, _metric_fns

        x_arr, y_arr = _as_arrays(train_data)
        val_arrays = _as_arrays(validation_data) if validation_data is not None else None

        def log_epoch(epoch: int, total: int, logs: Dict[str, float], secs: float) -> None:
            if chief and verbose_ != 0:
                line = " - ".join(f"{k}: {v:.4f}" for k, v in logs.items())
                log.info("epoch %d/%d - %d steps - %.2fs - %s", epoch + 1, total, steps, secs, line)

        compiled_cbs = [cb for cb in cbs if cb is not timer]
        with backend.scope():
            # model.optimizer, not opt: under mixed_float16 compile() wrapped opt in a LossScaleOptimizer, which the
            # loop must use (scale_loss/apply); its variables (dynamic scale) are created here too, not mid-trace.
            if not model.optimizer.built:
                model.optimizer.build(model.trainable_variables)  # inside the scope: slots on the strategy's device
        with backend.scope():
            history, epoch_seconds, _ = fit_compiled(
                model, model.optimizer, loss_fn=_loss_fn(loss_), metric_fns=_metric_fns(metrics_, loss_), x=x_arr,
                y=y_arr,
                validation=val_arrays, epochs=epochs, start_epoch=start_epoch, batch_size=batch.global_batch,
                seed=seed, shuffle=shuffle, jit_compile=bool(plan.jit_compile), callbacks=compiled_cbs,
                strategy=backend.strategy, log_epoch=log_epoch)
        ran_steps = steps * len(epoch_seconds)
    elif start_epoch < epochs:
        phases = []
        if start_step:
            phases.append((start_epoch, start_epoch + 1, steps - start_step, inp.dataset))
            rest = make_input(train_data, backend=backend, batch=batch, epochs=epochs, seed=seed, shuffle=shuffle,
                              drop_remainder=drop_remainder, steps_per_epoch=steps_per_epoch,
                              start_epoch=start_epoch + 1) if start_epoch + 1 < epochs else None
            if rest is not None:
                phases.append((start_epoch + 1, epochs, steps, rest.dataset))
        else:
            phases.append((start_epoch, epochs, steps, inp.dataset))
        for initial, final, phase_steps, dataset in phases:
            fit_kwargs: Dict[str, Any] = {}
            if val is not None:
                fit_kwargs.update(validation_data=val.dataset, validation_steps=val.steps_per_epoch)
            hist = model.fit(dataset, epochs=final, initial_epoch=initial, steps_per_epoch=phase_steps,
                             callbacks=cbs, verbose=verbose_, shuffle=False, **fit_kwargs)  # ordered by tfaccel
            for key, values in hist.history.items():
                history.setdefault(key, []).extend(float(v) for v in values)
            ran_steps += phase_steps * (final - initial)
    seconds = time.perf_counter() - t0
    if backup_dir and chief:
        remove_backup(backup_dir)  # training completed: nothing to resume any more
    if epoch_seconds is not None:
        timed = epoch_seconds[1:] if len(epoch_seconds) > 1 else epoch_seconds
        examples_per_sec = (len(timed) * len(y_arr) / sum(timed)) if sum(timed) > 0 else 0.0
    else:
        examples_per_sec = timer.examples_per_sec()
    result = FitResult(
        model=model, history=history, plan=plan, examples_per_sec=examples_per_sec, seconds=seconds,
        global_batch_size=batch.global_batch, steps_per_epoch=steps, steps=ran_steps,
        resumed_from=(start_epoch, start_step) if state else None,
        details={**opt_info, "data": inp.note, "batch": batch.reason, "loop": loop_reason,
                 "steps_per_execution": spe,
                 "steps_per_execution_reason": spe_reason,
                 "checkpoints": list(ckpt_cb.saved) if ckpt_cb is not None else [],
                 "backups_written": backup_cb.saves if backup_cb is not None else 0})
    if chief:
        say("%s", result.summary())
    return result


def _refine_plan_for_model(plan: Any, model: Any, requested_jit: Union[str, bool]) -> Any:
    """The plan's "auto" XLA decision, revisited now that the model exists (convolutions on CPU: off)."""
    from tfaccel.devices import detect_devices
    from tfaccel.xla import refine_jit_for_model

    jit, reason = refine_jit_for_model(plan.jit_compile, plan.jit_reason, requested=requested_jit, model=model,
                                       devices=detect_devices())
    if (jit, reason) == (plan.jit_compile, plan.jit_reason):
        return plan
    return dataclasses.replace(plan, jit_compile=jit, jit_reason=reason)


def _warn_float16_outputs(model: Any, plan: Any) -> None:
    try:
        from tfaccel.precision import check_output_dtype
    except ImportError:
        return
    check_output_dtype(model)
