"""Every Keras / TensorFlow internal tfaccel reads that is not a fix (those are the other modules here).

Each function is the one place tfaccel touches that internal, for something Keras or TensorFlow does but does
not expose. Checked on Keras 3.15.1 and TensorFlow 2.21.0 (``CHECKED_ON``); no upstream issue asks for a public
API for any of them, so none is named. tests/strategies/test_compat_keras_internals.py calls each one and fails
when an upgrade moves or changes it.
"""

from typing import Any, Callable, Dict, List, Optional, Tuple

__all__ = ["CHECKED_ON", "train_validation_split", "class_weight_to_sample_weights", "reduce_per_replica",
           "symbolic_build", "compile_objects", "loss_tracker", "flatten_layers", "per_worker_value", "maybe_merge_call",
           "load_cifar_batch", "backup_and_restore_epoch", "optimizer_strategy", "learning_rate_or_schedule", "global_random_seed",
           "model_strategy"]

CHECKED_ON = {"keras": "3.15.1", "tensorflow": "2.21.0"}


def train_validation_split(arrays: Tuple[Any, ...], validation_split: float) -> Tuple[tuple, tuple]:
    """Keras' ``validation_split``: the last fraction of the arrays, before any shuffling, as ``fit`` takes it.

    Raises:
        ValueError: Keras' own, e.g. a split that leaves no training example.
    """
    from keras.src.trainers.data_adapters.array_slicing import train_validation_split as split

    return split(arrays, validation_split=validation_split)


def class_weight_to_sample_weights(y: Any, class_weight: Dict[int, float]) -> Any:
    """Keras' sample weights for ``class_weight``, exactly as its array adapter makes them."""
    from keras.src.trainers.data_adapters.data_adapter_utils import class_weight_to_sample_weights as convert

    return convert(y, class_weight)


def reduce_per_replica(outputs: Any, strategy: Any) -> Any:
    """Keras' reduction of a step's per-replica outputs (``reduction="auto"``), read at call time, so that the
    ``tfaccel.compat.keras_mwms`` fix, which patches it in Keras' trainer module, applies here too."""
    from keras.src.backend.tensorflow import trainer

    return trainer.reduce_per_replica(outputs, strategy, reduction="auto")


def symbolic_build(model: Any, data_batch: Any) -> None:
    """Builds the model, its compiled metrics and loss on one batch, as Keras ``fit`` does before its first step."""
    model._symbolic_build(data_batch=data_batch)


def needs_symbolic_build(model: Any) -> bool:
    """Whether Keras' symbolic build still has something to build from a batch: a layer, the compiled metrics or
    the compiled loss not built yet (the optimizer it builds from the variables alone)."""
    return not all(layer.built for layer in flatten_layers(model)) or any(
        part is not None and not part.built for part in compile_objects(model))


def compile_objects(model: Any) -> Tuple[Any, Any]:
    """(the loss, the metrics container) that ``model.compile`` made: a new ``compile`` makes new ones."""
    return getattr(model, "_compile_loss", None), getattr(model, "_compile_metrics", None)


def loss_tracker(model: Any) -> Optional[Any]:
    """The ``Mean`` that Keras' ``train_step`` updates with the loss (batch size as weight); None without one."""
    return getattr(model, "_loss_tracker", None)


def flatten_layers(model: Any) -> List[Any]:
    """Every layer of the model, nested ones included, as Keras walks them."""
    return list(model._flatten_layers())


def per_worker_value(values: Any, worker: int) -> Any:
    """The ``worker``-th worker's ``RemoteValue`` of a ``PerWorkerValues`` (TensorFlow has no accessor)."""
    return values._values[worker]


def maybe_merge_call(fn: Callable[..., Any], strategy: Any, *args: Any) -> Any:
    """``fn(distribution, *args)`` in cross-replica context, as Keras' optimizers apply their updates."""
    import tensorflow as tf

    return tf.__internal__.distribute.interim.maybe_merge_call(fn, strategy, *args)


def backup_and_restore_epoch(model: Any) -> Optional[int]:
    """The epoch Keras' ``BackupAndRestore`` restored on train begin (it sets it on the model); None without one."""
    return getattr(model, "_initial_epoch", None)


def optimizer_strategy(optimizer: Any) -> Optional[Any]:
    """The ``tf.distribute`` strategy a Keras 3 TF optimizer bound itself to when it was created (or None)."""
    return getattr(optimizer, "_distribution_strategy", None)


def model_strategy(model: Any) -> Optional[Any]:
    """The ``tf.distribute`` strategy a Keras 3 TF model was created under (None outside any): with one, Keras' fit
    and evaluate build the model from a first batch of the data before training."""
    return getattr(model, "_distribute_strategy", None)


def learning_rate_or_schedule(optimizer: Any) -> Any:
    """The optimizer's learning rate as given: its schedule object, or its variable (``learning_rate`` evaluates a
    schedule at the current step)."""
    return optimizer._learning_rate


def load_cifar_batch(path: str) -> Tuple[Any, Any]:
    """Keras' parser of one CIFAR batch file (its restricted unpickler): (images, labels)."""
    from keras.src.datasets.cifar import load_batch

    return load_batch(path)


def global_random_seed() -> Optional[int]:
    """The seed ``keras.utils.set_random_seed`` was given in this process, else None (Keras keeps it in
    ``keras.src.utils.rng_utils.get_random_seed``, not exported)."""
    from keras.src.utils import rng_utils

    return rng_utils.get_random_seed()
