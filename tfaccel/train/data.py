"""The one preparation of the user's data for ``tfaccel.fit``, with Keras' meaning.

``prepare_data`` takes ``model.fit``'s data arguments and returns a :class:`FitData`: ``batch_size`` is the
global batch, ``validation_split`` takes the last fraction before any shuffling, ``class_weight`` becomes
sample weights as Keras' data adapter makes them, user datasets are used as given (never cached, a warning
when ``shuffle`` cannot apply). The loops read it: the compiled loop takes the arrays, Keras ``fit`` takes
either the arrays or :func:`example_stream` (a dataset whose order is a function of ``(seed, epoch)`` only,
so that every worker agrees and a resumed job sees exactly the batches an uninterrupted one saw).
"""

import collections.abc
import dataclasses
import math
from typing import Any, Dict, Optional, Tuple

import keras
import numpy as np
import tensorflow as tf

from tfaccel.compat import tf_data
from tfaccel.compat.keras_internals import class_weight_to_sample_weights, train_validation_split
from tfaccel.errors import ConfigError
from tfaccel.log import get_logger
from tfaccel.train.seeds import check_seed

__all__ = ["FitData", "keras_adapted", "is_python_iterator", "check_data_for_backend", "batches_per_epoch",
           "example_shape", "prepare_data",
           "example_order", "example_stream", "is_batched", "DEFAULT_BATCH_SIZE",
           "keras_batch_size", "validation_batch_size"]

DEFAULT_BATCH_SIZE = 32  # Keras' own default for arrays


@dataclasses.dataclass(frozen=True)
class FitData:
    """The training data of one ``fit`` call, prepared once.

    Attributes:
        kind: ``"arrays"`` (numpy / tensors / dicts of them), ``"dataset"`` (a batched ``tf.data.Dataset``),
            ``"py_dataset"`` (a ``keras.utils.PyDataset``), ``"distributed"`` (a ``dataset_fn(input_context)``
            or a ``tf.distribute.DistributedDataset``), or ``"keras"`` (what Keras' own data adapters take and
            tfaccel does not prepare: a Python generator, sparse or ragged tensors, None for an optional input;
            handed to ``fit`` as given,
            with ``y``, ``sample_weight``, ``batch_size`` and ``class_weight``, on one process).
        x, y, sample_weight: the arrays (class weights folded into ``sample_weight``), or the dataset in ``x``.
        validation: ``(x, y, sample_weight)`` arrays, ``(dataset, None, None)``, or None.
        num_examples: training examples (arrays only).
        batch_size: the global batch (arrays only; datasets carry their own batches).
        steps_per_epoch: as given, or the number of batches of the arrays.
        shuffle: Keras' ``shuffle`` argument as given.
        seed: the seed of the example order as given (None: ``agree_on_seed`` draws one where tfaccel orders the
            examples itself; Keras' own shuffling applies otherwise).
        class_weight: left to Keras for datasets (for arrays it is already in ``sample_weight``).
        note: one line for the plan.
        what: what the data is, for messages (``"in-memory arrays"``, ``"a tf.data.Dataset"``, ...).
    """

    kind: str
    x: Any
    y: Any = None
    sample_weight: Any = None
    validation: Optional[Tuple[Any, Any, Any]] = None
    num_examples: Optional[int] = None
    batch_size: Optional[int] = None
    steps_per_epoch: Optional[int] = None
    shuffle: Any = True
    seed: Optional[int] = None
    class_weight: Optional[Dict[int, float]] = None
    note: str = ""
    what: str = "in-memory arrays"


def is_batched(dataset: Any) -> bool:
    """True when a tf.data.Dataset's elements are batches: made by a batching transformation, seen through those
    that keep elements whole (``tfaccel.compat.tf_data.batch_lineage``: a ``batch(32, drop_remainder=True)``
    followed by ``prefetch`` has elements of static shape ``(32, ...)``); where the chain cannot tell, when every
    element's first dimension is of unknown size."""
    lineage = tf_data.batch_lineage(dataset)
    if lineage is not None:
        return lineage
    specs = tf.nest.flatten(dataset.element_spec)
    return bool(specs) and all(getattr(s, "shape", None) is not None and s.shape.rank and s.shape[0] is None
                               for s in specs)


def _length(a: Any) -> int:
    return int(len(tf.nest.flatten(a)[0]))


def _is_arrays(x: Any) -> bool:
    leaves = tf.nest.flatten(x)
    return bool(leaves) and all(isinstance(v, (np.ndarray, tf.Tensor, list)) or hasattr(v, "__array__")
                                for v in leaves)


def _check_arrays(x: Any, y: Any, sample_weight: Any) -> int:
    n = _length(x)
    for name, value in (("y", y), ("sample_weight", sample_weight)):
        if value is not None and _length(value) != n:
            raise ConfigError(f"fit: x has {n} examples but {name} has {_length(value)}; they must match")
    if n == 0:
        raise ConfigError("fit: x is empty")
    return n


def _split(x: Any, y: Any, sample_weight: Any, validation_split: float) -> Tuple[tuple, tuple]:
    """Keras' split: the last ``validation_split`` of the examples, before any shuffling."""
    if not 0.0 < validation_split < 1.0:
        raise ConfigError(f"validation_split must be a fraction between 0 and 1; received {validation_split!r}")

    try:
        return train_validation_split((x, y, sample_weight), validation_split)
    except ValueError as exc:
        raise ConfigError(f"validation_split={validation_split}: {exc}") from exc


def _class_weights(y: Any, class_weight: Optional[Dict[int, float]], sample_weight: Any) -> Any:
    if class_weight is None:
        return sample_weight
    if sample_weight is not None:
        raise ConfigError("fit: pass class_weight or sample_weight, not both (Keras refuses the pair too); fold the "
                          "class weights into sample_weight yourself to use both")
    if not isinstance(class_weight, dict):
        raise ConfigError(f"class_weight must be a dict {{class index: weight}}; received {class_weight!r}")
    if y is None:
        raise ConfigError("class_weight needs targets y")

    return class_weight_to_sample_weights(y, class_weight)


def _validation(validation_data: Any) -> Optional[Tuple[Any, Any, Any]]:
    if validation_data is None:
        return None

    if isinstance(validation_data, tf.data.Dataset) or not isinstance(validation_data, (tuple, list)):
        return (validation_data, None, None)
    if len(validation_data) not in (2, 3):
        raise ConfigError(f"validation_data must be (x, y), (x, y, sample_weight) or a dataset; received a "
                          f"{type(validation_data).__name__} of length {len(validation_data)}")
    vx, vy, *rest = validation_data
    return (vx, vy, rest[0] if rest else None)


def prepare_data(x: Any, y: Any = None, *, sample_weight: Any = None, class_weight: Optional[Dict] = None,
                 validation_split: float = 0.0, validation_data: Any = None, batch_size: Optional[int] = None,
                 shuffle: Any = True, steps_per_epoch: Optional[int] = None, seed: Optional[int] = None) -> FitData:
    """Turns ``fit``'s data arguments into a :class:`FitData`.

    Raises:
        ConfigError: a combination Keras refuses too (y, validation_split or sample_weight beside a dataset,
            class_weight with sample_weight), mismatched lengths. A ``batch_size`` beside a batched dataset is
            ignored with a log line, as Keras ignores it.
    """
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer))
                                   or batch_size < 1):
        raise ConfigError(f"batch_size must be a whole number >= 1 or None; received {batch_size!r}")
    seed_ = check_seed(seed)
    validation = _validation(validation_data)
    if callable(x) and not isinstance(x, (tf.data.Dataset, keras.utils.PyDataset)) \
            or isinstance(x, tf.distribute.DistributedDataset):
        return _not_arrays("distributed", x, y, sample_weight, validation_split, batch_size, steps_per_epoch,
                           shuffle, seed_, class_weight, validation)
    if isinstance(x, keras.utils.PyDataset):
        return _not_arrays("py_dataset", x, y, sample_weight, validation_split, batch_size, steps_per_epoch,
                           shuffle, seed_, class_weight, validation)
    if isinstance(x, tf.data.Dataset):
        if batch_size is not None and not is_batched(x):
            get_logger().info("fit: batching the unbatched dataset by batch_size=%d", batch_size)
            x, batch_size = x.batch(int(batch_size)), None
        return _not_arrays("dataset", x, y, sample_weight, validation_split, batch_size, steps_per_epoch, shuffle,
                           seed_, class_weight, validation)
    adapted = keras_adapted(x)
    if adapted:
        return _keras_input(adapted, x, y, sample_weight=sample_weight, class_weight=class_weight,
                            validation_split=validation_split, validation=validation, batch_size=batch_size,
                            shuffle=shuffle, steps_per_epoch=steps_per_epoch)
    if not _is_arrays(x):
        raise ConfigError(f"fit: x must be arrays (numpy or tensors, or a dict/list of them), a tf.data.Dataset, a "
                          f"keras.utils.PyDataset or a dataset_fn(input_context); received {type(x).__name__}")
    _check_arrays(x, y, sample_weight)
    if validation_split and validation is None:
        (x, y, sample_weight), validation = _split(x, y, sample_weight, validation_split)
    n = _check_arrays(x, y, sample_weight)
    sample_weight = _class_weights(y, class_weight, sample_weight)
    batch = int(batch_size or keras_batch_size(n, steps_per_epoch))
    steps = steps_per_epoch or math.ceil(n / batch)
    default = f" (Keras: {n} examples / steps_per_epoch={steps_per_epoch})" if steps_per_epoch else " (Keras default)"
    note = (f"arrays: {n} examples, global batch {batch}{default if batch_size is None else ''}, "
            f"{steps} steps/epoch" + (f", last batch {n % batch}" if n % batch else "") +
            (f", validation {_length(validation[0])} examples" if validation and _is_arrays(validation[0]) else ""))
    return FitData("arrays", x, y, sample_weight, validation, n, batch, steps, shuffle, seed_, None, note)


def keras_batch_size(num_examples: int, steps: Optional[int]) -> int:
    """The batch size Keras' array adapter takes where ``fit`` is given none: the examples over ``steps`` (fit's
    ``steps_per_epoch``, or ``validation_steps`` for the validation arrays), rounded up, or 32 without steps."""
    return math.ceil(num_examples / steps) if steps else DEFAULT_BATCH_SIZE


def validation_batch_size(data: FitData, *, batch_size: Optional[int], validation_batch_size: Optional[int],
                          validation_steps: Optional[int]) -> Optional[int]:
    """The batch size of the validation arrays, as ``fit`` takes it: ``validation_batch_size``, else ``batch_size``
    as given (not the training batch Keras worked out from ``steps_per_epoch``), else Keras' array adapter's own
    (:func:`keras_batch_size` of ``validation_steps``). None where the validation data is not arrays."""
    if validation_batch_size or batch_size:
        return validation_batch_size or batch_size
    if data.validation is None or not _is_arrays(data.validation[0]):
        return None
    return keras_batch_size(_length(data.validation[0]), validation_steps)


def is_python_iterator(x: Any) -> bool:
    """A Python generator or iterator (what Keras' ``GeneratorDataAdapter`` reads), not a ``tf.data`` one."""
    return isinstance(x, collections.abc.Iterator) and not isinstance(x, (tf.data.Iterator, str, bytes))


def keras_adapted(x: Any) -> Optional[str]:
    """What ``x`` is when it is input Keras' own data adapters take but tfaccel does not prepare (a Python generator
    or iterator, sparse or ragged tensors, a dict of arrays with None for an optional input: Keras'
    ``GeneratorDataAdapter`` and its array adapter), for messages; None for anything else."""
    if is_python_iterator(x):
        return "a Python generator"
    leaves = tf.nest.flatten(x)
    if len(leaves) > 1 and any(leaf is None for leaf in leaves):
        return "arrays with None for an optional input"
    for leaf in leaves:
        module = type(leaf).__module__
        if isinstance(leaf, (tf.SparseTensor, tf.RaggedTensor)) or module.startswith(("scipy.sparse",
                                                                                        "jax.experimental.sparse")):
            return "sparse or ragged tensors"
    return None


def _keras_input(what: str, x: Any, y: Any, *, sample_weight: Any, class_weight: Any, validation_split: float,
                 validation: Any, batch_size: Any, shuffle: Any, steps_per_epoch: Optional[int]) -> FitData:
    """``x`` for Keras' own data adapter: every argument goes to ``fit`` as given, with Keras' meaning."""
    if validation_split:
        raise ConfigError(f"fit: validation_split needs arrays; x is {what}. Pass validation_data instead")
    return FitData("keras", x, y, sample_weight, validation, None, batch_size, steps_per_epoch, shuffle, None,
                   class_weight, f"{what}, handed to Keras' own data adapter as given", what)


def check_data_for_backend(data: FitData, *, num_workers: int, uses_keras_fit: bool) -> None:
    """Input only Keras' own data adapter reads (``FitData.kind == "keras"``) trains on one process only.

    Raises:
        ConfigError: such input under several processes or the parameter-server coordinator.
    """
    if data.kind == "keras" and (num_workers > 1 or not uses_keras_fit):
        raise ConfigError(f"fit: x is {data.what}, which tfaccel cannot split between {num_workers} processes in one "
                          "agreed order; pass arrays, a tf.data.Dataset or a dataset_fn(input_context) instead")


def _not_arrays(kind: str, x: Any, y: Any, sample_weight: Any, validation_split: float, batch_size: Any,
                steps_per_epoch: Optional[int], shuffle: Any, seed: Optional[int], class_weight: Any,
                validation: Any) -> FitData:
    what = {"dataset": "a tf.data.Dataset", "py_dataset": "a keras.utils.PyDataset",
            "distributed": "a dataset_fn / distributed dataset"}[kind]
    if batch_size is not None:  # Keras' fit ignores it beside a dataset too (its elements are the batches)
        get_logger().info("fit: batch_size=%s is ignored: x is %s, whose elements are already batches (as in "
                          "Keras' fit)", batch_size, what)
    for name, value in (("y", y), ("sample_weight", sample_weight)):
        if value is not None:
            raise ConfigError(f"fit: {name} cannot be given when x is {what} (its elements carry the batch, the "
                              f"targets and the weights); received {name}={type(value).__name__}")
    if validation_split:
        raise ConfigError(f"fit: validation_split needs arrays; x is {what}. Pass validation_data instead")
    if kind == "distributed" and steps_per_epoch is None:
        raise ConfigError("fit: a dataset_fn(input_context) needs steps_per_epoch, since the length of each "
                          "worker's pipeline is not known in advance")
    if shuffle and shuffle != "batch" and kind == "dataset":
        get_logger().warning("fit: shuffle=True does not apply to a tf.data.Dataset (Keras does not shuffle datasets "
                             "either); shuffle inside your pipeline (dataset.shuffle(...)) if you want it")
    return FitData(kind, x, None, None, validation, None, None, steps_per_epoch, shuffle, seed, class_weight,
                   f"{what} used as given", what)


def example_order(num_examples: int, seed: Optional[int], epoch: int, shuffle: Any) -> np.ndarray:
    """THE example order of one epoch of array data, used by every loop and by :func:`example_stream`.

    A function of ``(seed, epoch)`` only (int32 indices), so every process, every loop and a resumed job see the
    same batches: batch ``i`` is ``order[i * batch : (i + 1) * batch]``.

    Args:
        num_examples: the training examples.
        seed: the job's seed (None counts as 0).
        epoch: the 0-based epoch.
        shuffle: Keras' ``shuffle`` argument; ``False`` and ``"batch"`` keep the arrays' order.

    Example:
        >>> example_order(4, 7, 0, shuffle=False).tolist()
        [0, 1, 2, 3]
    """
    if not shuffle or shuffle == "batch":
        return np.arange(num_examples, dtype=np.int32)
    rng = np.random.default_rng([0 if seed is None else int(seed), int(epoch)])
    return rng.permutation(num_examples).astype(np.int32)


def example_shape(data: FitData) -> Optional[Tuple[int, ...]]:
    """One example's shape of the data's first input (arrays, or a batched ``tf.data.Dataset`` whose shapes are
    known): what fills a model's open axes (a sequence length) where its memory is estimated; None otherwise."""
    if data.kind == "arrays":
        first = tf.nest.flatten(data.x)[0] if data.x is not None else None
        shape = getattr(first, "shape", None)
    elif data.kind == "dataset":
        spec = data.x.element_spec
        shape = tf.nest.flatten(spec[0] if isinstance(spec, tuple) else spec)[0].shape
    else:
        return None
    dims = tuple(shape)[1:] if shape is not None and len(shape) > 1 else ()
    return tuple(int(d) for d in dims) if dims and all(d is not None for d in dims) else None


def batches_per_epoch(data: FitData) -> Optional[int]:
    """The batches of one epoch where known before training: ``steps_per_epoch``, the arrays' batches, a finite
    ``tf.data.Dataset``'s cardinality or a ``PyDataset``'s ``num_batches``; None when only the data's end tells."""
    if data.steps_per_epoch:
        return data.steps_per_epoch
    if data.kind == "dataset":
        cardinality = int(data.x.cardinality().numpy())
        return cardinality if cardinality > 0 else None  # -1 infinite, -2 unknown
    if data.kind == "py_dataset":
        return getattr(data.x, "num_batches", None)
    return None


def example_stream(data: FitData, *, epochs: int, initial_epoch: int, start_step: int = 0,
                   shards: int = 1, shard_index: int = 0) -> Tuple[Any, int]:
    """A dataset of every remaining epoch's batches, each epoch's order fixed by ``(seed, epoch)``.

    Args:
        data: arrays prepared by ``prepare_data``.
        epochs, initial_epoch: the epochs the stream covers.
        start_step: batches of ``initial_epoch`` already trained (a resumed job).
        shards, shard_index: split every global batch over ``shards`` pipelines (Horovod ranks): this one keeps
            the ``shard_index``-th of ``shards`` contiguous equal parts of each batch (as tf.distribute splits a
            batch over replicas), so the ranks' batches of one step together are the global batch.

    Returns:
        (dataset of ``(x, y[, sample_weight])`` batches, steps per epoch).

    Raises:
        ConfigError: the global batch or the last partial batch cannot be split evenly over the shards.
    """
    n, batch = data.num_examples, data.batch_size
    if batch % shards or (n % batch) % shards:
        raise ConfigError(
            f"global batch {batch} with {n} examples: every batch must split evenly over {shards} ranks (the last "
            f"has {n % batch or batch} examples), or the ranks would average unequal batches; use a batch size and "
            f"a number of examples divisible by {shards}")
    parts = tuple(p for p in (data.x, data.y, data.sample_weight) if p is not None)
    steps = math.ceil(n / batch)
    if data.steps_per_epoch and data.steps_per_epoch != steps:
        raise ConfigError(f"steps_per_epoch={data.steps_per_epoch} with arrays of {n} examples and batch {batch} "
                          f"({steps} batches) cannot keep a fixed example order; leave steps_per_epoch unset")
    tensors = tf.nest.map_structure(tf.constant, parts)

    def epoch_batches(epoch: int) -> Any:
        order = example_order(n, data.seed, epoch, data.shuffle)
        # Each global batch is cut into `shards` contiguous equal parts, as tf.distribute's rebatching cuts it over
        # replicas: rank i takes part i (the partial last batch too, which splits evenly: checked above).
        windows = (order[s:s + batch] for s in range(0, n, batch))
        mine = np.concatenate([w[shard_index * len(w) // shards:(shard_index + 1) * len(w) // shards]
                               for w in windows]).astype(np.int64)
        return tf.data.Dataset.from_tensor_slices(mine).batch(batch // shards)

    stream = epoch_batches(initial_epoch)
    for epoch in range(initial_epoch + 1, epochs):
        stream = stream.concatenate(epoch_batches(epoch))
    stream = stream.map(lambda idx: tf.nest.map_structure(lambda t: tf.gather(t, idx), tensors))
    if start_step:
        stream = stream.skip(start_step)
    return stream.prefetch(tf.data.AUTOTUNE), steps
