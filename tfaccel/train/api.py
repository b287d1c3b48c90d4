"""``tfaccel.fit`` and ``compile_and_fit``: train the user's compiled model exactly as Keras would, on any backend.

``fit(model, x, y, ...)`` takes ``keras.Model.fit``'s arguments with Keras' meaning plus tfaccel's keyword
options, prepares the data once (``tfaccel.train.data``), adapts the user's optimizer in place only where the
backend needs it (``tfaccel.train.optim``), picks one loop (``tfaccel.train.loops``) and says why in the
result. ``compile_and_fit`` builds and compiles inside ``tfaccel.scope()`` and calls ``fit``.
"""

import dataclasses
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from tfaccel.errors import ConfigError, invalid_choice
from tfaccel.log import get_logger

__all__ = ["FitResult", "fit", "compile_and_fit", "LOOP_CHOICES", "STEPS_PER_EXECUTION_AUTO_MAX"]

# Upper bound of steps_per_execution="auto" (measured: 64 steps per execution + XLA gave 6.3x a naive fit here).
STEPS_PER_EXECUTION_AUTO_MAX = 64
VERBOSE_CHOICES = ("auto", 0, 1, 2)
LOOP_CHOICES = ("auto", "keras", "compiled")


@dataclasses.dataclass(frozen=True)
class FitResult:
    """What ``fit`` did.

    Attributes:
        model: the trained Keras model (the user's own object).
        history: Keras' history dict (``{"loss": [...], "val_loss": [...], ...}``), as ``model.fit`` returns it.
        plan: the ``Plan`` (strategy, precision, XLA and why).
        examples_per_sec: training throughput, leaving out the first epoch when there are several.
        seconds: wall time of the training loop.
        global_batch_size: examples per step over all replicas (None for datasets, which carry their batches).
        steps_per_epoch: steps per epoch.
        steps: training steps run by this call (after a resume or an early stop, only those that ran).
        resumed_from: ``(epoch, step)`` of the backup this run resumed from, or None.
        details: the loop and why, the data, the optimizer changes, checkpoints, backups.
    """

    model: Any
    history: Dict[str, List[float]]
    plan: Any
    examples_per_sec: float
    seconds: float
    global_batch_size: Optional[int]
    steps_per_epoch: Optional[int]
    steps: int
    resumed_from: Optional[tuple] = None
    details: Dict[str, Any] = dataclasses.field(default_factory=dict)

    def summary(self) -> str:
        last = {k: v[-1] for k, v in self.history.items() if v}
        metrics = ", ".join(f"{k}={v:.4g}" for k, v in last.items())
        return (f"trained {self.steps} steps in {self.seconds:.1f}s, {self.examples_per_sec:,.0f} examples/s; "
                f"{metrics}; loop: {self.details.get('loop', '?')}; plan: {self.plan.summary()}")


def _check_int(name: str, value: Any, minimum: int, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be {'None or ' if optional else ''}a whole number >= {minimum}; "
                          f"received {value!r}")


def _validate(*, epochs: Any, initial_epoch: Any, steps_per_epoch: Any, backup_freq: Any, verbose: Any, loop: Any,
              callbacks: Any, gradient_accumulation_steps: Any, steps_per_execution: Any, warmup_epochs: Any) -> None:
    _check_int("epochs", epochs, 1)
    _check_int("initial_epoch", initial_epoch, 0)
    _check_int("gradient_accumulation_steps", gradient_accumulation_steps, 1)
    _check_int("steps_per_epoch", steps_per_epoch, 1, optional=True)
    _check_int("backup_freq", backup_freq, 1, optional=True)
    if steps_per_execution != "auto" and (isinstance(steps_per_execution, bool) or not isinstance(
            steps_per_execution, int) or steps_per_execution < 1):
        raise ConfigError(f"steps_per_execution must be 'auto' or a whole number >= 1; received {steps_per_execution!r}")
    if isinstance(warmup_epochs, bool) or not isinstance(warmup_epochs, (int, float)) or warmup_epochs < 0:
        raise ConfigError(f"warmup_epochs must be a number >= 0; received {warmup_epochs!r}")
    if verbose not in VERBOSE_CHOICES or isinstance(verbose, bool):
        raise invalid_choice("verbose", verbose, [str(v) for v in VERBOSE_CHOICES])
    if loop not in LOOP_CHOICES:
        raise invalid_choice("loop", loop, LOOP_CHOICES)
    if callbacks is not None and (isinstance(callbacks, (str, bytes)) or not isinstance(callbacks, (list, tuple))):
        raise ConfigError(f"callbacks must be a list of keras callbacks; received {type(callbacks).__name__}")


def _verbose(verbose: Any, chief: bool) -> int:
    if verbose == "auto":
        return (1 if sys.stdout.isatty() else 2) if chief else 0
    return int(verbose) if chief else 0


def _choose_multi_step(requested: str, *, backend: Any, model: Any, data: Any, user_callbacks: Sequence[Any],
                       backup_freq: Optional[int], steps_per_execution: Any, validation_steps: Optional[int],
                       validation_batch_size: Optional[int]) -> tuple:
    """mirrored / multi_worker: tfaccel's multi-step loop where it trains exactly like Keras fit and runs more than
    one step per call ("auto"), or wherever it can (loop="compiled"); Keras fit otherwise."""
    from tfaccel.train.loops.multi_step import multi_step_blockers

    blockers = multi_step_blockers(model, backend=backend, data=data, validation_steps=validation_steps,
                                   validation_batch_size=validation_batch_size)
    if requested == "compiled" and blockers:
        raise ConfigError(f"loop='compiled' cannot train this job exactly like Keras fit under {backend.name}: " +
                          "; ".join(blockers) + ". Use loop='auto' (Keras fit then trains it)")
    if not blockers:
        spe, reason = _steps_per_execution(steps_per_execution, backend=backend, model=model, loop="multi_step",
                                           per_batch_callbacks=_needs_every_batch(model, user_callbacks)
                                           or bool(backup_freq), steps_per_epoch=data.steps_per_epoch)
        if spe > 1 or requested == "compiled":
            return "multi_step", (f"tfaccel's multi-step loop: {spe} steps of the model's train_step per call under "
                                  f"{backend.name}, each replica gathering its part of every batch from in-memory "
                                  "arrays")
        blockers.append(f"steps_per_execution {reason}")
    return "keras_fit", "Keras fit (" + "; ".join(blockers) + ")"


def _choose_loop(requested: str, *, backend: Any, model: Any, data: Any, user_callbacks: Sequence[Any],
                 backup_freq: Optional[int], steps_per_execution: Any, validation_steps: Optional[int] = None,
                 validation_batch_size: Optional[int] = None) -> tuple:
    """(loop name, reason). The compiled loop only where it trains exactly like Keras fit."""
    if not backend.uses_keras_fit:
        if requested != "auto":
            raise ConfigError(f"loop={requested!r}: strategy {backend.name} trains with tfaccel's ClusterCoordinator "
                              "loop only (Keras 3 fit does not run ParameterServerStrategy, keras-team/keras#18624)")
        if steps_per_execution != "auto":
            raise ConfigError(f"steps_per_execution={steps_per_execution!r}: strategy {backend.name} runs its steps in "
                              "closures scheduled on the workers by tfaccel's ClusterCoordinator loop, not in Keras' "
                              "train function; leave steps_per_execution unset")
        return "coordinator", "parameter_server: tfaccel's ClusterCoordinator loop (keras-team/keras#18624)"
    from tfaccel.train.loops.multi_step import MULTI_STEP_STRATEGIES

    if backend.name in MULTI_STEP_STRATEGIES and requested != "keras":
        return _choose_multi_step(requested, backend=backend, model=model, data=data, user_callbacks=user_callbacks,
                                  backup_freq=backup_freq, steps_per_execution=steps_per_execution,
                                  validation_steps=validation_steps, validation_batch_size=validation_batch_size)
    from tfaccel.train.loops.compiled import compiled_blockers

    blockers = []
    if backend.num_replicas_in_sync != 1 or backend.name not in ("default", "one_device"):
        blockers.append(f"strategy {backend.name} with {backend.num_replicas_in_sync} replica(s)")
    if data.kind != "arrays":
        blockers.append(f"data is {data.note.split(' used')[0]}, not in-memory arrays")
    elif data.validation is not None and data.validation[1] is None and data.validation[2] is None:
        blockers.append("validation_data is not arrays")
    if backup_freq:
        blockers.append("backup_freq asks for step-level backups")
    blockers += compiled_blockers(model, callbacks=list(user_callbacks),
                                  steps_per_execution_given=steps_per_execution != "auto")
    if requested == "compiled" and blockers:
        raise ConfigError("loop='compiled' cannot train this job exactly like Keras fit: " + "; ".join(blockers) +
                          ". Use loop='auto' (Keras fit then trains it)")
    if requested == "keras":
        return "keras_fit", "Keras fit (asked for)"
    if blockers:
        return "keras_fit", "Keras fit (" + "; ".join(blockers) + ")"
    return "compiled", "compiled whole-epoch loop running the model's train_step (one replica, array data)"


def _needs_every_batch(model: Any, user_callbacks: Sequence[Any]) -> bool:
    """Whether a user callback acts per batch (Keras calls batch hooks once per execution, not per step)."""
    from tfaccel.train.loops.compiled import compiled_blockers

    return any(b.startswith("callback ") for b in compiled_blockers(model, callbacks=list(user_callbacks)))


def _steps_per_execution(requested: Any, *, backend: Any, model: Any, per_batch_callbacks: bool,
                         steps_per_epoch: Optional[int], loop: str = "keras_fit") -> tuple:
    if backend.name == "multi_worker" and loop == "keras_fit":
        # Keras 3.15's multi-step loop fails under MultiWorkerMirroredStrategy: "You must feed a value for
        # placeholder tensor .../while/cond/Placeholder" from the distributed iterator (Keras 3.15.1, TF 2.21.0).
        if requested not in ("auto", 1):
            get_logger().warning("steps_per_execution=%s cannot work under multi_worker (Keras 3.15's multi-step loop "
                                 "fails under MultiWorkerMirroredStrategy); using 1", requested)
        return 1, "multi_worker: Keras 3.15's multi-step loop fails under MultiWorkerMirroredStrategy"
    if requested != "auto":
        return int(requested), "given"
    if model.steps_per_execution != 1:
        return model.steps_per_execution, "as compiled"
    if per_batch_callbacks or not steps_per_epoch:
        # A dataset of unknown length: Keras would end its last call where the data ends, but reports the batch
        # numbers of a full call, so the steps run could not be counted.
        return 1, "1: per-batch callbacks must see every batch" if per_batch_callbacks else "1: epoch length unknown"
    spe = min(steps_per_epoch, STEPS_PER_EXECUTION_AUTO_MAX)
    return spe, f"auto: min(steps/epoch={steps_per_epoch}, {STEPS_PER_EXECUTION_AUTO_MAX})"


def _resume(backup_dir: Optional[str], *, backend: Any, model: Any) -> tuple:
    """(state, epoch, step) of the backup to resume from; the weights and optimizer state are loaded."""
    from tfaccel.train.backups import load_backup_weights, read_backup

    state = read_backup(backup_dir)
    if state and state.get("format") and backend.uses_keras_fit:
        raise ConfigError(f"backup_dir {backup_dir}: holds {state['weights']}, a {state['format']} backup written by "
                          f"a parameter_server job; strategy {backend.name} resumes only from its own Keras weight "
                          "backups. Resume it with strategy='parameter_server', or give this job another backup_dir")
    if backup_dir and backend.name == "horovod":  # only rank 0 writes backups: every rank resumes from its one
        from tfaccel.strategies.horovod import agree_on_backup

        state = agree_on_backup(state)
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
    return state, (state.epoch, state.step)


def _adapt(model: Any, *, backend: Any, plan: Any, requested_jit: Any, data: Any, scale_learning_rate: Any,
           base_batch_size: Optional[int], warmup_epochs: float, accumulation: int) -> Dict[str, Any]:
    """Everything tfaccel changes on the user's model before training, each change named for the plan."""
    from tfaccel.train.optim import adapt_optimizer, scale_learning_rate as scale_lr

    if getattr(model, "optimizer", None) is None or not getattr(model, "compiled", False):
        raise ConfigError("fit: the model is not compiled; call model.compile(optimizer=..., loss=...) inside "
                          "`with tfaccel.scope():` first")
    if backend.uses_keras_fit:  # the coordinator loop warns itself
        from tfaccel.precision import check_output_dtype

        check_output_dtype(model)  # float16/bfloat16 outputs: the Keras mixed precision guide's warning
    changes: Dict[str, Any] = {}
    note = adapt_optimizer(model, replicas=backend.num_replicas_in_sync, accumulation_steps=accumulation)
    if note:
        changes["optimizer"] = note
    updates = max(1, (data.steps_per_epoch or 1) // accumulation)
    base = base_batch_size or (data.batch_size // backend.num_replicas_in_sync if data.batch_size else None)
    changes["learning_rate"] = scale_lr(model, scale_learning_rate, global_batch=data.batch_size, base_batch=base,
                                        warmup_steps=int(round(warmup_epochs * updates)))
    if backend.name == "horovod":
        backend.wrap_optimizer(model.optimizer)  # in place: the user keeps their object
        changes["horovod"] = "optimizer averages gradients over ranks; weights broadcast from rank 0; metrics averaged"
    jit, jit_reason = _refined_jit(plan, model, requested_jit)
    if bool(model.jit_compile) != jit or jit_reason != plan.jit_reason:  # the model's own reason, e.g. convolutions
        changes["jit_compile"] = f"{model.jit_compile} -> {jit} ({jit_reason})"
        model.jit_compile = jit
        model.train_function = model.test_function = model.predict_function = None
    return changes


def _refined_jit(plan: Any, model: Any, requested_jit: Any) -> Tuple[bool, str]:
    """The plan's "auto" XLA decision, revisited now that the model exists (convolutions on CPU: off)."""
    from tfaccel.devices import detect_devices
    from tfaccel.xla import refine_jit_for_model

    jit, reason = refine_jit_for_model(plan.jit_compile, plan.jit_reason, requested=requested_jit, model=model,
                                       devices=detect_devices())
    return bool(jit), reason


def _tfaccel_callbacks(*, backend: Any, data: Any, backup_dir: Optional[str], backup_freq: Optional[int],
                       checkpoint_dir: Optional[str], tensorboard_dir: Optional[str], start_step: int,
                       per_batch: bool) -> tuple:
    """(callbacks before the user's, callbacks after the user's, named ones) that tfaccel adds."""
    import keras

    from tfaccel.train.backups import ChiefCheckpoint, StepBackup, Throughput

    chief = backend.is_chief
    named: Dict[str, Any] = {"timer": Throughput(examples_per_step=data.batch_size or 0)}
    if backup_dir and backend.uses_keras_fit:  # parameter_server: the coordinator loop writes its own backups
        named["backup"] = StepBackup(backup_dir, save_freq=backup_freq, is_chief=chief, step_offset=start_step,
                                     steps_per_epoch=data.steps_per_epoch or 0)
    if checkpoint_dir:
        named["checkpoint"] = ChiefCheckpoint(checkpoint_dir, is_chief=chief,
                                              every_worker_saves=backend.name == "multi_worker")
    after = (list(backend.batch_sync_callbacks()) if per_batch else []) + list(named.values())
    from tfaccel.train.evaluator import evaluator_callbacks

    after += evaluator_callbacks(checkpoint_dir=checkpoint_dir, checkpoints=named.get("checkpoint"), is_chief=chief)
    if tensorboard_dir and chief:
        after.append(keras.callbacks.TensorBoard(tensorboard_dir))
    from tfaccel.launch.ray import report_callbacks

    after += report_callbacks(is_chief=chief, checkpoint_dir=checkpoint_dir)  # after the checkpoint: [] outside Ray
    # Backend callbacks first: Horovod's metric averaging must run before a user's EarlyStopping or checkpoint
    # reads the metrics, or ranks could stop at different epochs and hang.
    return list(backend.extra_callbacks()), after, named


def _run_loop(name: str, model: Any, *, data: Any, backend: Any, plan: Any, epochs: int, initial_epoch: int,
              start_step: int, callbacks: List[Any], named: Dict[str, Any], verbose: int, options: Dict[str, Any]) -> Any:
    if name == "compiled":
        from tfaccel.train.loops.compiled import run_compiled

        x = data.x
        return run_compiled(model, x=x, y=data.y, sample_weight=data.sample_weight, batch_size=data.batch_size,
                            epochs=epochs, initial_epoch=initial_epoch, shuffle=bool(data.shuffle), seed=data.seed,
                            validation=data.validation, validation_batch_size=options["validation_batch_size"],
                            validation_freq=options["validation_freq"], jit_compile=bool(model.jit_compile),
                            callbacks=[cb for cb in callbacks if cb is not named["timer"]], verbose=verbose)
    if name == "multi_step":
        from tfaccel.train.loops.multi_step import run_multi_step

        return run_multi_step(model, data=data, epochs=epochs, initial_epoch=initial_epoch, start_step=start_step,
                              steps_per_execution=model.steps_per_execution,
                              validation_batch_size=options["validation_batch_size"],
                              validation_freq=options["validation_freq"],
                              callbacks=[cb for cb in callbacks if cb is not named["timer"]], verbose=verbose)
    if name == "coordinator":
        from tfaccel.train.loops.coordinator import run_coordinator

        return run_coordinator(model, data=data, backend=backend, plan=plan, epochs=epochs,
                               initial_epoch=initial_epoch, start_step=start_step, callbacks=callbacks,
                               verbose=verbose, options=options)
    from tfaccel.train.loops.keras_fit import run_keras_fit

    return run_keras_fit(model, data=data, backend=backend, epochs=epochs, initial_epoch=initial_epoch,
                         start_step=start_step, backups=bool(options["backup_dir"]), callbacks=callbacks,
                         verbose=verbose, validation_steps=options["validation_steps"],
                         validation_batch_size=options["validation_batch_size"],
                         validation_freq=options["validation_freq"], step_counter=named["timer"])


def fit(model: Any, x: Any = None, y: Any = None, batch_size: Optional[int] = None, epochs: int = 1,
        verbose: Union[str, int] = "auto", callbacks: Optional[Sequence[Any]] = None, validation_split: float = 0.0,
        validation_data: Any = None, shuffle: Any = True, class_weight: Optional[Dict[int, float]] = None,
        sample_weight: Any = None, initial_epoch: int = 0, steps_per_epoch: Optional[int] = None,
        validation_steps: Optional[int] = None, validation_batch_size: Optional[int] = None,
        validation_freq: Any = 1, *, loop: str = "auto", seed: Optional[int] = None,
        backup_dir: Optional[str] = None, backup_freq: Optional[int] = None, checkpoint_dir: Optional[str] = None,
        tensorboard_dir: Optional[str] = None, gradient_accumulation_steps: int = 1,
        scale_learning_rate: Optional[str] = None, base_batch_size: Optional[int] = None,
        warmup_epochs: float = 0, steps_per_execution: Union[str, int] = "auto", recompute: Any = None) -> FitResult:
    """Trains a model compiled inside ``tfaccel.scope()`` exactly as ``model.fit`` would, on this process's backend.

    The positional arguments are ``keras.Model.fit``'s, with Keras' meaning (``batch_size`` is the global
    batch; ``x`` may be arrays, a dict of arrays, a ``tf.data.Dataset``, a ``keras.utils.PyDataset`` or a
    ``dataset_fn(input_context)``). The keyword-only ones are tfaccel's.

    Args:
        loop: ``"auto"`` (tfaccel's compiled whole-epoch loop where it trains exactly like ``fit``: one replica,
            array data, epoch-level callbacks; under mirrored / multi_worker, tfaccel's multi-step loop, K steps of
            the model's ``train_step`` per call, for array data when more than one step per call applies; Keras
            ``fit`` elsewhere, the reason in ``details["loop"]``), ``"keras"`` or ``"compiled"`` (tfaccel's loop;
            an error where it cannot be exact). Defaults to "auto".
        seed: the seed of the example order (a function of (seed, epoch)); None draws one and logs it.
        backup_dir, backup_freq: backups a restarted job resumes from (epoch and step); removed when training
            completes. ``backup_freq``: also every this many steps.
        checkpoint_dir: ``tf.train.Checkpoint``s written by the chief at each epoch end.
        tensorboard_dir: TensorBoard logs from the chief.
        gradient_accumulation_steps: micro-batches per optimizer update, under any strategy. Defaults to 1.
        scale_learning_rate: ``"linear"`` or ``"sqrt"``: scale the compiled rate (or schedule) by the global batch
            over ``base_batch_size`` (defaults to the per-replica batch), with ``warmup_epochs`` of linear warmup.
            Defaults to None (the rate as compiled).
        steps_per_execution: steps per compiled call on the Keras path and in the multi-step loop; "auto" keeps 1
            where per-batch callbacks must see every batch and goes up to 64 otherwise.
        recompute: recompute the activations of these blocks in the backward pass (less memory, more compute):
            ``"auto"``, ``"all"`` or block names, as ``tfaccel.memory.enable_recompute``, which it calls on the model
            (it stays on after training; ``tfaccel.memory.disable_recompute(model)`` turns it off). Defaults to None.

    Returns:
        A ``FitResult``; ``result.history`` is Keras' history dict.

    Raises:
        ConfigError: a bad argument or combination, before any training starts.

    Example:
        >>> import numpy as np, keras, tfaccel
        >>> x, y = np.random.rand(256, 8).astype("float32"), np.random.randint(0, 2, 256)
        >>> with tfaccel.scope():  # doctest: +SKIP
        ...     model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2, activation="softmax")])
        ...     model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        >>> tfaccel.fit(model, x, y, batch_size=64, epochs=2, validation_split=0.1).history  # doctest: +SKIP
    """
    _validate(epochs=epochs, initial_epoch=initial_epoch, steps_per_epoch=steps_per_epoch, backup_freq=backup_freq,
              verbose=verbose, loop=loop, callbacks=callbacks, gradient_accumulation_steps=gradient_accumulation_steps,
              steps_per_execution=steps_per_execution, warmup_epochs=warmup_epochs)
    from tfaccel.train.evaluator import is_evaluator_task, run_evaluator
    from tfaccel.train.keras_callbacks import keras_resume_epoch, worker_callbacks
    from tfaccel.train.keras_generation import check_keras3_model

    check_keras3_model(model)  # a tf_keras model: say so, not "not compiled"
    if is_evaluator_task():  # the side-car evaluator of a cluster: evaluate the chief's checkpoints, do not train
        return run_evaluator(model, validation_data=validation_data, checkpoint_dir=checkpoint_dir,
                             backup_dir=backup_dir, tensorboard_dir=tensorboard_dir,
                             batch_size=validation_batch_size or batch_size, validation_steps=validation_steps)
    from tfaccel.train.backup_check import check_position
    from tfaccel.train.data import agree_on_seed, batches_per_epoch, prepare_data
    from tfaccel.train.scope import plan_for_model

    plan, backend, requested_jit = plan_for_model(model)
    user_callbacks = list(callbacks or [])
    data = prepare_data(x, y, sample_weight=sample_weight, class_weight=class_weight, validation_split=validation_split,
                        validation_data=validation_data, batch_size=batch_size, shuffle=shuffle,
                        steps_per_epoch=steps_per_epoch, seed=seed)
    loop_name, loop_reason = _choose_loop(loop, backend=backend, model=model, data=data, user_callbacks=user_callbacks,
                                          backup_freq=backup_freq, steps_per_execution=steps_per_execution,
                                          validation_steps=validation_steps,
                                          validation_batch_size=validation_batch_size)
    from tfaccel.train.loops.keras_fit import uses_stream

    if loop_name != "keras_fit" or uses_stream(data, backend=backend, backups=bool(backup_dir)):
        data = dataclasses.replace(data, seed=agree_on_seed(data.seed, backend=backend))  # tfaccel orders examples
    changes = _adapt(model, backend=backend, plan=plan, requested_jit=requested_jit, data=data,
                     scale_learning_rate=scale_learning_rate, base_batch_size=base_batch_size,
                     warmup_epochs=warmup_epochs, accumulation=gradient_accumulation_steps)
    if recompute is not None:
        from tfaccel.memory import enable_recompute

        changes["recompute"] = "blocks " + ", ".join(enable_recompute(model, recompute))
    state, (start_epoch, start_step) = _resume(backup_dir, backend=backend, model=model)
    check_position(state, backup_dir=backup_dir, steps_per_epoch=data.steps_per_epoch)
    start_epoch = max(start_epoch, initial_epoch)
    start_epoch = max(start_epoch, keras_resume_epoch(user_callbacks, model=model, backend=backend))
    user_callbacks = worker_callbacks(user_callbacks, backend=backend)  # the chief alone writes the user's paths
    per_batch = _needs_every_batch(model, user_callbacks)
    before, after, named = _tfaccel_callbacks(backend=backend, data=data, backup_dir=backup_dir,
                                              backup_freq=backup_freq, checkpoint_dir=checkpoint_dir,
                                              tensorboard_dir=tensorboard_dir, start_step=start_step,
                                              per_batch=per_batch)
    if loop_name in ("keras_fit", "multi_step"):
        spe, spe_reason = _steps_per_execution(steps_per_execution, backend=backend, model=model,
                                               per_batch_callbacks=per_batch or bool(backup_freq),
                                               steps_per_epoch=batches_per_epoch(data), loop=loop_name)
        if spe != model.steps_per_execution:
            model.steps_per_execution, model.train_function = spe, None
        changes["steps_per_execution"] = f"{spe} ({spe_reason})"
    _announce(plan, backend, data=data, loop_reason=loop_reason, changes=changes, verbose=verbose)
    options = dict(validation_steps=validation_steps, validation_batch_size=validation_batch_size,
                   validation_freq=validation_freq, backup_dir=backup_dir, backup_freq=backup_freq,
                   checkpoint_dir=checkpoint_dir, gradient_accumulation_steps=gradient_accumulation_steps)
    return _train(model, loop_name, data=data, backend=backend, plan=plan, epochs=epochs, start=(start_epoch, start_step),
                  callbacks=before + user_callbacks + after, named=named, verbose=_verbose(verbose, backend.is_chief),
                  options=options, details={"loop": loop_reason, "data": data.note, "seed": data.seed, **changes},
                  resumed=state is not None)


def _announce(plan: Any, backend: Any, *, data: Any, loop_reason: str, changes: Dict[str, Any], verbose: Any) -> None:
    if not backend.is_chief:
        return
    say = get_logger().info if verbose != 0 else get_logger().debug  # verbose=0: quiet, like Keras
    say("plan: %s", plan.summary())
    say("data: %s; loop: %s%s", data.note, loop_reason,
        "".join(f"; {k}: {v}" for k, v in changes.items()))


def _train(model: Any, loop_name: str, *, data: Any, backend: Any, plan: Any, epochs: int, start: tuple,
           callbacks: List[Any], named: Dict[str, Any], verbose: int, options: Dict[str, Any],
           details: Dict[str, Any], resumed: bool) -> FitResult:
    from tfaccel.train.backups import remove_backup
    from tfaccel.train.optim import restore_optimizer_class

    start_epoch, start_step = start
    t0 = time.perf_counter()
    try:
        outcome = _run_loop(loop_name, model, data=data, backend=backend, plan=plan, epochs=epochs,
                            initial_epoch=start_epoch, start_step=start_step, callbacks=callbacks, named=named,
                            verbose=verbose, options=options) if start_epoch < epochs else None
    finally:
        restore_optimizer_class(model)
    seconds = time.perf_counter() - t0
    if options["backup_dir"] and backend.is_chief:
        remove_backup(options["backup_dir"])  # training completed: nothing to resume any more
    history = outcome.history if outcome else {}
    epoch_seconds = outcome.epoch_seconds if outcome else []
    timed = epoch_seconds[1:] if len(epoch_seconds) > 1 else epoch_seconds
    per_epoch = data.num_examples or (data.batch_size or 0) * (data.steps_per_epoch or 0)
    examples_per_sec = len(timed) * per_epoch / sum(timed) if timed and sum(timed) > 0 else 0.0
    if outcome is not None and "examples_per_sec" in outcome.details:  # parameter_server: counted on the ps
        examples_per_sec = outcome.details.pop("examples_per_sec")
    if outcome is not None:
        details.update(outcome.details)
    if backend.name == "parameter_server":  # how each large variable was placed over the ps tasks
        from tfaccel.compat.keras_sharded import placements

        details["variable_placement"] = placements(model.variables)
    if "backup" in named:
        details["backups_written"] = named["backup"].saves
    if "checkpoint" in named:
        details["checkpoints"] = list(named["checkpoint"].saved)
    result = FitResult(model=model, history=history, plan=plan, examples_per_sec=examples_per_sec, seconds=seconds,
                       global_batch_size=data.batch_size, steps_per_epoch=data.steps_per_epoch,
                       steps=outcome.steps if outcome else 0, resumed_from=start if resumed else None,
                       details=details)
    if backend.is_chief and verbose:
        get_logger().info("%s", result.summary())
    return result


def _make_optimizer(optimizer: Any, *, learning_rate: Optional[float], clipnorm: Optional[float],
                    global_clipnorm: Optional[float]) -> Any:
    """compile_and_fit's optimizer: a name, a Keras optimizer (used as given) or a callable returning one."""
    import keras

    from tfaccel.train.optim import OPTIMIZER_NAMES

    if clipnorm is not None and global_clipnorm is not None:
        raise ConfigError(f"give clipnorm or global_clipnorm, not both (received clipnorm={clipnorm!r}, "
                          f"global_clipnorm={global_clipnorm!r})")
    for name, value in (("clipnorm", clipnorm), ("global_clipnorm", global_clipnorm), ("learning_rate", learning_rate)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            raise ConfigError(f"{name} must be a positive number; received {value!r}")
    given = {k: v for k, v in (("learning_rate", learning_rate), ("clipnorm", clipnorm),
                               ("global_clipnorm", global_clipnorm)) if v is not None}
    if isinstance(optimizer, str):
        if optimizer.lower() not in OPTIMIZER_NAMES:
            raise invalid_choice("optimizer", optimizer, OPTIMIZER_NAMES, "Or pass a keras.optimizers.Optimizer.")
        return keras.optimizers.get({"class_name": optimizer.lower(), "config": given})
    if not isinstance(optimizer, keras.optimizers.Optimizer) and callable(optimizer):
        optimizer = optimizer()
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ConfigError(f"optimizer must be a name {OPTIMIZER_NAMES}, a keras Optimizer or a callable returning one; "
                          f"received {type(optimizer).__name__}")
    if given:
        raise ConfigError(f"{', '.join(given)}: set these on your optimizer object ({type(optimizer).__name__}); "
                          "tfaccel uses the optimizer you pass as given")
    return optimizer


def compile_and_fit(build_model: Callable[[], Any], train_data: Any, *, validation_data: Any = None, epochs: int = 1,
                    steps_per_epoch: Optional[int] = None, global_batch_size: Optional[int] = None,
                    per_replica_batch_size: Optional[int] = None, strategy: str = "auto", precision: str = "auto",
                    jit_compile: Union[str, bool] = "auto", optimizer: Any = "adam",
                    learning_rate: Optional[float] = None, loss: Any = None, metrics: Optional[Sequence[Any]] = None,
                    clipnorm: Optional[float] = None, global_clipnorm: Optional[float] = None,
                    strategy_options: Optional[Dict[str, Any]] = None, **fit_options: Any) -> FitResult:
    """Builds and compiles a model inside ``tfaccel.scope()``, then trains it with ``tfaccel.fit``.

    Args:
        build_model: ``() -> keras.Model``, called inside the strategy scope. A model it already compiled keeps
            its optimizer, loss and metrics unless ``loss`` is given here.
        train_data: ``(x, y)`` or ``(x, y, sample_weight)`` arrays, a ``tf.data.Dataset`` (batched: used as given;
            unbatched: batched by the global batch), a ``keras.utils.PyDataset`` or a ``dataset_fn(input_context)``.
        validation_data: as ``fit``'s. Defaults to None.
        global_batch_size, per_replica_batch_size: give either (both must agree); defaults to 32 per replica.
        strategy, precision, jit_compile, strategy_options: as ``tfaccel.scope``.
        optimizer: a name, a Keras optimizer (used as given) or a callable returning one. Defaults to "adam".
        learning_rate, clipnorm, global_clipnorm: for an optimizer given by name.
        loss, metrics: as for ``model.compile``.
        **fit_options: every other ``tfaccel.fit`` keyword (callbacks, seed, backup_dir, loop, ...). A ``seed`` also
            seeds Keras (``keras.utils.set_random_seed``) before ``build_model`` runs, so the weights repeat too.

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
    """
    import keras

    from tfaccel.train.keras_generation import check_keras3_model
    from tfaccel.train.scope import scope

    if not callable(build_model) or isinstance(build_model, keras.layers.Layer):
        raise ConfigError(f"build_model must be a callable returning a keras.Model (it is called inside the strategy "
                          f"scope); received {type(build_model).__name__}. Pass the function, not its result: "
                          "compile_and_fit(build_model, ...) rather than compile_and_fit(build_model(), ...)")
    if isinstance(train_data, (tuple, list)) and len(train_data) not in (2, 3):
        raise ConfigError(f"train_data must be (x, y) or (x, y, sample_weight) arrays, a dataset or a dataset_fn; "
                          f"received a {type(train_data).__name__} of length {len(train_data)}")
    _check_fit_options(epochs=epochs, steps_per_epoch=steps_per_epoch, **fit_options)  # before anything is built
    with scope(strategy, precision, jit_compile, strategy_options=strategy_options) as plan:
        batch = _global_batch(global_batch_size, per_replica_batch_size, plan.num_replicas, train_data)
        given_optimizer = None if loss is None else _make_optimizer(
            optimizer, learning_rate=learning_rate, clipnorm=clipnorm, global_clipnorm=global_clipnorm)
        if fit_options.get("seed") is not None:  # tfaccel builds the model here: the seed makes its weights repeatable
            from tfaccel.train.data import check_seed

            keras.utils.set_random_seed(check_seed(fit_options["seed"]))
        model = build_model()
        check_keras3_model(model, where="compile_and_fit: build_model")
        if not isinstance(model, keras.Model):
            raise ConfigError(f"build_model must return a keras.Model; it returned {type(model).__name__}")
        if loss is not None or not getattr(model, "compiled", False):
            if loss is None:
                raise ConfigError("loss is required (e.g. loss='sparse_categorical_crossentropy'), unless build_model "
                                  "returns a model it already compiled")
            model.compile(optimizer=given_optimizer, loss=loss, metrics=list(metrics or []))
    if isinstance(train_data, (tuple, list)):
        x, y, *sw = train_data
        return fit(model, x, y, batch_size=batch, epochs=epochs, validation_data=validation_data,
                   steps_per_epoch=steps_per_epoch, sample_weight=sw[0] if sw else None, **fit_options)
    return fit(model, train_data, batch_size=batch, epochs=epochs, validation_data=validation_data,
               steps_per_epoch=steps_per_epoch, **fit_options)


def _check_fit_options(**given: Any) -> None:
    """compile_and_fit: ``fit``'s keyword options checked before the model is built, so a typo costs no build."""
    import inspect

    params = inspect.signature(fit).parameters
    try:
        bound = inspect.signature(fit).bind(None, **given)
    except TypeError as exc:
        valid = ", ".join(p for p in params if p not in ("model", "x", "y", "batch_size", "sample_weight"))
        raise ConfigError(f"compile_and_fit: {exc}; the options it passes to tfaccel.fit are: {valid}") from exc
    bound.apply_defaults()
    _validate(**{k: bound.arguments[k] for k in ("epochs", "initial_epoch", "steps_per_epoch", "backup_freq", "verbose",
                                                 "loop", "callbacks", "gradient_accumulation_steps",
                                                 "steps_per_execution", "warmup_epochs")})


def _global_batch(global_batch_size: Optional[int], per_replica_batch_size: Optional[int], replicas: int,
                  train_data: Any) -> Optional[int]:
    from tfaccel.train.data import DEFAULT_BATCH_SIZE, is_batched

    for name, value in (("global_batch_size", global_batch_size), ("per_replica_batch_size", per_replica_batch_size)):
        _check_int(name, value, 1, optional=True)
    if hasattr(train_data, "element_spec") and is_batched(train_data) or callable(train_data) \
            and not hasattr(train_data, "element_spec"):
        if global_batch_size is not None or per_replica_batch_size is not None:
            raise ConfigError("train_data is already batched (a batched dataset or a dataset_fn), so global_batch_size "
                              f"/ per_replica_batch_size cannot apply (received global_batch_size={global_batch_size!r}"
                              f", per_replica_batch_size={per_replica_batch_size!r}). Pass the unbatched dataset and a "
                              "batch size, or leave both unset to use the batches as given")
        return None
    if global_batch_size is not None and per_replica_batch_size is not None \
            and global_batch_size != per_replica_batch_size * replicas:
        raise ConfigError(f"global_batch_size={global_batch_size} disagrees with per_replica_batch_size="
                          f"{per_replica_batch_size} x {replicas} replicas = {per_replica_batch_size * replicas}. "
                          "Give only one of them, or make global = per_replica x replicas.")
    if global_batch_size is not None:
        if global_batch_size % replicas:
            raise ConfigError(f"global_batch_size={global_batch_size} does not split evenly over {replicas} replicas; "
                              f"use a multiple of {replicas} (e.g. {replicas * max(1, global_batch_size // replicas)}).")
        return global_batch_size
    return (per_replica_batch_size or DEFAULT_BATCH_SIZE) * replicas
