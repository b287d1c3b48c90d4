"""``tfaccel.fit`` and ``compile_and_fit``: train the user's compiled model exactly as Keras would, on any backend.

``fit(model, x, y, ...)`` takes ``keras.Model.fit``'s arguments with Keras' meaning plus tfaccel's keyword
options: the request (``tfaccel.train.request``) -> ``prepare`` (``tfaccel.train.context``: the data, the loop
from ``tfaccel.train.loops``, the optimizer, callbacks) -> the loop runs -> the ``FitResult``, with why.
``compile_and_fit`` builds and compiles inside ``tfaccel.scope()`` (``tfaccel.train.compile``) and calls ``fit``.
"""

import inspect
from typing import Any, Callable, Dict, Optional, Sequence, Union

from tfaccel.compat.keras_generation import check_keras3_model
from tfaccel.errors import ConfigError
from tfaccel.resilience.evaluator import is_evaluator_task, run_evaluator
from tfaccel.train.compile import build_compiled, check_build_inputs
from tfaccel.train.context import prepare, train
from tfaccel.train.loops.base import STEPS_PER_EXECUTION_AUTO_MAX
from tfaccel.train.request import LOOP_CHOICES, FitRequest
from tfaccel.train.result import FitResult

__all__ = ["FitResult", "fit", "compile_and_fit", "LOOP_CHOICES", "STEPS_PER_EXECUTION_AUTO_MAX"]


def fit(model: Any, x: Any = None, y: Any = None, batch_size: Optional[int] = None, epochs: int = 1,
        verbose: Union[str, int] = "auto", callbacks: Optional[Sequence[Any]] = None, validation_split: float = 0.0,
        validation_data: Any = None, shuffle: Any = True, class_weight: Optional[Dict[int, float]] = None,
        sample_weight: Any = None, initial_epoch: int = 0, steps_per_epoch: Optional[int] = None,
        validation_steps: Optional[int] = None, validation_batch_size: Optional[int] = None,
        validation_freq: Any = 1, *, loop: str = "auto", seed: Optional[int] = None,
        backup_dir: Optional[str] = None, backup_freq: Optional[int] = None, checkpoint_dir: Optional[str] = None,
        tensorboard_dir: Optional[str] = None, gradient_accumulation_steps: int = 1,
        scale_learning_rate: Optional[str] = None, base_batch_size: Optional[int] = None,
        warmup_epochs: float = 0, steps_per_execution: Union[str, int] = "auto", recompute: Any = None,
        shard_optimizer_state: Union[bool, str] = False) -> FitResult:
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
        shard_optimizer_state: False, True or ``"auto"``: optimizer-state sharding, see ``tfaccel.train.zero``.

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
    request = FitRequest.from_fit(**locals())  # every argument checked, before anything is built
    check_keras3_model(model)  # a tf_keras model: say so, not "not compiled"
    if is_evaluator_task():  # the side-car evaluator of a cluster: evaluate the chief's checkpoints, do not train
        return run_evaluator(model, validation_data=validation_data, checkpoint_dir=checkpoint_dir,
                             backup_dir=backup_dir, tensorboard_dir=tensorboard_dir,
                             batch_size=validation_batch_size or batch_size, validation_steps=validation_steps)
    return train(*prepare(model, request))


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
    check_build_inputs(build_model, train_data)
    _check_fit_options(epochs=epochs, steps_per_epoch=steps_per_epoch, **fit_options)  # before anything is built
    model, batch = build_compiled(
        build_model, train_data, strategy=strategy, precision=precision, jit_compile=jit_compile,
        strategy_options=strategy_options, batch_sizes=(global_batch_size, per_replica_batch_size), optimizer=optimizer,
        optimizer_options=dict(learning_rate=learning_rate, clipnorm=clipnorm, global_clipnorm=global_clipnorm),
        loss=loss, metrics=metrics, seed=fit_options.get("seed"))
    if isinstance(train_data, (tuple, list)):
        x, y, *sw = train_data
        return fit(model, x, y, batch_size=batch, epochs=epochs, validation_data=validation_data,
                   steps_per_epoch=steps_per_epoch, sample_weight=sw[0] if sw else None, **fit_options)
    return fit(model, train_data, batch_size=batch, epochs=epochs, validation_data=validation_data,
               steps_per_epoch=steps_per_epoch, **fit_options)


def _check_fit_options(**given: Any) -> None:
    """compile_and_fit: ``fit``'s keyword options checked before the model is built, so a typo costs no build."""
    params = inspect.signature(fit).parameters
    try:
        bound = inspect.signature(fit).bind(None, **given)
    except TypeError as exc:
        valid = ", ".join(p for p in params if p not in ("model", "x", "y", "batch_size", "sample_weight"))
        raise ConfigError(f"compile_and_fit: {exc}; the options it passes to tfaccel.fit are: {valid}") from exc
    bound.apply_defaults()
    FitRequest.from_fit(**bound.arguments)
