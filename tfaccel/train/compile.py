"""What ``compile_and_fit`` does before ``fit``: check its inputs, make the optimizer, build and compile the model
inside ``tfaccel.scope()`` and settle the global batch."""

from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

import keras

from tfaccel.compat.keras_generation import check_keras3_model
from tfaccel.errors import ConfigError, invalid_choice
from tfaccel.train.data import DEFAULT_BATCH_SIZE, is_batched
from tfaccel.train.request import OPTIMIZER_NAMES
from tfaccel.train.request import check_int
from tfaccel.train.scope import scope
from tfaccel.train.seeds import check_seed

__all__ = ["check_build_inputs", "build_compiled", "make_optimizer", "global_batch"]


def check_build_inputs(build_model: Any, train_data: Any) -> None:
    """``compile_and_fit``'s own arguments, before anything is built.

    Raises:
        ConfigError: ``build_model`` is not a callable, or ``train_data`` is a sequence of the wrong length.
    """
    if not callable(build_model) or isinstance(build_model, keras.layers.Layer):
        raise ConfigError(f"build_model must be a callable returning a keras.Model (it is called inside the strategy "
                          f"scope); received {type(build_model).__name__}. Pass the function, not its result: "
                          "compile_and_fit(build_model, ...) rather than compile_and_fit(build_model(), ...)")
    if isinstance(train_data, (tuple, list)) and len(train_data) not in (2, 3):
        raise ConfigError(f"train_data must be (x, y) or (x, y, sample_weight) arrays, a dataset or a dataset_fn; "
                          f"received a {type(train_data).__name__} of length {len(train_data)}")


def build_compiled(build_model: Callable[[], Any], train_data: Any, *, strategy: str, precision: str,
                   jit_compile: Union[str, bool], strategy_options: Optional[Dict[str, Any]],
                   batch_sizes: Tuple[Optional[int], Optional[int]], optimizer: Any, optimizer_options: Dict[str, Any],
                   loss: Any, metrics: Optional[Sequence[Any]], seed: Any) -> Tuple[Any, Optional[int]]:
    """(the model built and compiled inside ``tfaccel.scope()``, the global batch); see ``compile_and_fit``.

    Args:
        batch_sizes: (global_batch_size, per_replica_batch_size). optimizer_options: learning_rate, clipnorm,
            global_clipnorm (for an optimizer given by name). seed: ``fit``'s seed (also seeds Keras, so the
            weights repeat).
    """
    with scope(strategy, precision, jit_compile, strategy_options=strategy_options) as plan:
        batch = global_batch(*batch_sizes, plan.num_replicas, train_data)
        given_optimizer = None if loss is None else make_optimizer(optimizer, **optimizer_options)
        if seed is not None:  # tfaccel builds the model here: the seed makes its weights repeatable
            keras.utils.set_random_seed(check_seed(seed))
        model = build_model()
        check_keras3_model(model, where="compile_and_fit: build_model")
        if not isinstance(model, keras.Model):
            raise ConfigError(f"build_model must return a keras.Model; it returned {type(model).__name__}")
        if loss is not None or not getattr(model, "compiled", False):
            if loss is None:
                raise ConfigError("loss is required (e.g. loss='sparse_categorical_crossentropy'), unless build_model "
                                  "returns a model it already compiled")
            model.compile(optimizer=given_optimizer, loss=loss, metrics=list(metrics or []))
    return model, batch


def make_optimizer(optimizer: Any, *, learning_rate: Optional[float], clipnorm: Optional[float],
                    global_clipnorm: Optional[float]) -> Any:
    """compile_and_fit's optimizer: a name, a Keras optimizer (used as given) or a callable returning one."""
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


def global_batch(global_batch_size: Optional[int], per_replica_batch_size: Optional[int], replicas: int,
                  train_data: Any) -> Optional[int]:
    """The global batch ``compile_and_fit`` trains with (None for data that carries its own batches).

    Raises:
        ConfigError: the two sizes disagree, or do not split over the replicas, or the data is already batched.
    """
    for name, value in (("global_batch_size", global_batch_size), ("per_replica_batch_size", per_replica_batch_size)):
        check_int(name, value, 1, optional=True)
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
