"""Input pipelines for compile_and_fit: batch semantics, sharding, deterministic order, prefetch.

The order of examples is a function of ``(seed, epoch)`` only, so a job restarted from a backup at
epoch ``e``, step ``s`` sees exactly the batches the uninterrupted job saw from there on.
"""

import dataclasses
import math
from typing import Any, Callable, Optional, Tuple

import numpy as np

from tfaccel.errors import ConfigError

__all__ = ["BatchSizes", "resolve_batch_sizes", "InputPlan", "make_input"]

DEFAULT_PER_REPLICA_BATCH = 32


@dataclasses.dataclass(frozen=True)
class BatchSizes:
    """Global and per-replica batch sizes: ``global_batch = per_replica * replicas``."""

    global_batch: Optional[int]
    per_replica: Optional[int]
    replicas: int
    reason: str


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"{name} must be a whole number >= 1; received {value!r}")
    return int(value)


def resolve_batch_sizes(*, global_batch_size: Optional[int], per_replica_batch_size: Optional[int],
                        replicas: int, pre_batched: bool) -> BatchSizes:
    """Works out both batch sizes from whichever was given.

    Raises:
        ConfigError: both given and they disagree, a size is not a positive integer, the global batch does
            not split evenly over the replicas, or a size was given for data that is already batched.
    """
    if pre_batched:
        if global_batch_size is not None or per_replica_batch_size is not None:
            raise ConfigError(
                "train_data is a tf.data.Dataset that is already batched, so global_batch_size / "
                f"per_replica_batch_size cannot apply (received global_batch_size={global_batch_size!r}, "
                f"per_replica_batch_size={per_replica_batch_size!r}). Pass the unbatched dataset and a batch size, "
                "or leave both sizes unset to use the batches as given.")
        return BatchSizes(None, None, replicas, "dataset is already batched: batches used as given")
    if global_batch_size is not None:
        global_batch_size = _positive_int("global_batch_size", global_batch_size)
    if per_replica_batch_size is not None:
        per_replica_batch_size = _positive_int("per_replica_batch_size", per_replica_batch_size)
    if global_batch_size is not None and per_replica_batch_size is not None:
        if global_batch_size != per_replica_batch_size * replicas:
            raise ConfigError(
                f"global_batch_size={global_batch_size} disagrees with per_replica_batch_size="
                f"{per_replica_batch_size} x {replicas} replicas = {per_replica_batch_size * replicas}. "
                "Give only one of them, or make global = per_replica x replicas.")
        return BatchSizes(global_batch_size, per_replica_batch_size, replicas, "both given and consistent")
    if global_batch_size is not None:
        if global_batch_size % replicas:
            raise ConfigError(
                f"global_batch_size={global_batch_size} does not split evenly over {replicas} replicas; "
                f"use a multiple of {replicas} (e.g. {replicas * max(1, global_batch_size // replicas)}).")
        return BatchSizes(global_batch_size, global_batch_size // replicas, replicas, "global batch given")
    per = per_replica_batch_size or DEFAULT_PER_REPLICA_BATCH
    reason = "per-replica batch given" if per_replica_batch_size else f"default {per} per replica"
    return BatchSizes(per * replicas, per, replicas, reason)


@dataclasses.dataclass
class InputPlan:
    """What ``make_input`` built: the dataset (or distributed dataset) and how it was built."""

    dataset: Any
    steps_per_epoch: Optional[int]
    num_examples: Optional[int]
    kind: str                 # "arrays" | "dataset" | "batched_dataset" | "dataset_fn"
    shard_policy: str
    note: str


def _is_dataset(obj: Any) -> bool:
    import tensorflow as tf

    return isinstance(obj, tf.data.Dataset)


def is_batched(dataset: Any) -> bool:
    """True when a tf.data.Dataset's elements already carry a (unknown-size) batch dimension."""
    import tensorflow as tf

    if type(dataset).__name__ in ("BatchDataset", "_BatchDataset", "PaddedBatchDataset", "_PaddedBatchDataset",
                                  "ParallelBatchDataset", "_ParallelBatchDataset"):
        return True
    # A batch in the lineage followed by map/prefetch/cache keeps a leading None dimension.
    specs = tf.nest.flatten(dataset.element_spec)
    return bool(specs) and all(getattr(s, "shape", None) is not None and s.shape.rank and s.shape[0] is None
                               for s in specs)


def _as_arrays(data: Any) -> Tuple[Any, Any]:
    if not (isinstance(data, (tuple, list)) and len(data) == 2):
        raise ConfigError(
            "train_data must be (x, y) arrays, a tf.data.Dataset, or a dataset_fn(input_context) callable; "
            f"received {type(data).__name__}")
    x, y = data
    import tensorflow as tf

    def length(a: Any) -> int:
        flat = tf.nest.flatten(a)
        return len(flat[0])

    if length(x) != length(y):
        raise ConfigError(f"train_data: x has {length(x)} examples but y has {length(y)}; they must match")
    if length(x) == 0:
        raise ConfigError("train_data: x and y are empty")
    return x, y


def make_input(data: Any, *, backend: Any, batch: BatchSizes, epochs: int, seed: Optional[int],
               shuffle: bool = True, drop_remainder: bool = False, steps_per_epoch: Optional[int] = None,
               start_epoch: int = 0, start_step: int = 0, what: str = "train_data") -> InputPlan:
    """Builds the input pipeline for one backend.

    Args:
        data: (x, y) arrays, a tf.data.Dataset (batched or not), or ``dataset_fn(input_context)``.
        backend: the ``Backend`` the job runs on (its strategy, workers and rank decide the sharding).
        batch: the resolved batch sizes.
        epochs: how many epochs the stream must cover.
        seed: shuffle seed; the order of each epoch depends on (seed, epoch) only.
        start_epoch, start_step: where a resumed job starts within the stream.
    """
    import tensorflow as tf

    options = tf.data.Options()
    options.deterministic = seed is not None
    if callable(data) and not _is_dataset(data):
        return _from_dataset_fn(data, backend=backend, batch=batch, steps_per_epoch=steps_per_epoch, what=what)
    if _is_dataset(data):
        if is_batched(data):
            ds = data.prefetch(tf.data.AUTOTUNE)
            return InputPlan(ds, steps_per_epoch, None, "batched_dataset", _set_shard(ds, "AUTO", options)[1],
                             "batched dataset used as given")
        base, n = data, None
        card = int(data.cardinality())
        if card > 0:
            n = card
        policy = "FILE" if _reads_files(data) else "DATA"
        kind = "dataset"
    else:
        x, y = _as_arrays(data)
        base = tf.data.Dataset.from_tensor_slices((x, y))
        n = len(tf.nest.flatten(x)[0])
        policy = "DATA"
        kind = "arrays"
    horovod = backend.name == "horovod"
    per_pipeline = batch.global_batch // backend.num_workers if horovod else batch.global_batch
    if horovod and backend.num_workers > 1:
        base = base.shard(backend.num_workers, backend.worker_index)  # Horovod has no tf.distribute sharding
        policy = "OFF (sharded by rank)"
        n = math.ceil(n / backend.num_workers) if n else None
    if n is not None:
        steps = n // per_pipeline if drop_remainder else math.ceil(n / per_pipeline)
        if steps == 0:
            raise ConfigError(f"{what} has {n} examples, fewer than one batch of {per_pipeline}; lower the batch "
                              "size or pass more data")
    else:
        steps = None
    if steps_per_epoch is not None:
        steps = steps_per_epoch
    if steps is None:
        raise ConfigError(f"{what}: the dataset's length is unknown (infinite or filtered); pass steps_per_epoch")
    if kind == "arrays" or (n is not None and n <= 1_000_000):
        base = base.cache()
    seed_base = 0 if seed is None else int(seed)

    def epoch_stream(epoch: int) -> tf.data.Dataset:
        ds = base
        if shuffle and n is not None:
            ds = ds.shuffle(n, seed=seed_base * 1_000_003 + epoch, reshuffle_each_iteration=False)
        ds = ds.batch(per_pipeline, drop_remainder=drop_remainder)
        if steps_per_epoch is not None:
            ds = ds.repeat().take(steps_per_epoch)
        return ds

    # One stream over all remaining epochs, each epoch's order fixed by (seed, epoch): Keras keeps the iterator
    # across epochs when steps_per_epoch is given, and a resumed job rebuilds exactly the same stream.
    epochs_left = range(start_epoch, max(epochs, start_epoch + 1))
    stream = epoch_stream(epochs_left[0])
    for epoch in epochs_left[1:]:
        stream = stream.concatenate(epoch_stream(epoch))
    if start_step:
        stream = stream.skip(start_step)
    stream = stream.prefetch(tf.data.AUTOTUNE)
    stream, policy = _set_shard(stream, policy, options)
    note = (f"{kind}: batched by {'per-rank ' if horovod else 'global '}batch {per_pipeline}, order fixed by "
            f"(seed, epoch), auto-shard {policy}, prefetch AUTOTUNE")
    return InputPlan(stream, steps, n, kind, policy, note)


def _set_shard(ds: Any, policy: str, options: Any) -> Tuple[Any, str]:
    import tensorflow as tf

    name = policy.split()[0]
    options.experimental_distribute.auto_shard_policy = getattr(tf.data.experimental.AutoShardPolicy, name)
    return ds.with_options(options), policy


def _reads_files(ds: Any) -> bool:
    """True when the dataset's lineage starts from files (TFRecord/text), so FILE sharding is right."""
    seen, stack = 0, [ds]
    while stack and seen < 64:
        cur = stack.pop()
        seen += 1
        name = type(cur).__name__
        if "TFRecord" in name or "TextLine" in name or "FixedLengthRecord" in name:
            return True
        stack.extend(getattr(cur, "_inputs", lambda: [])())
    return False


def _from_dataset_fn(fn: Callable, *, backend: Any, batch: BatchSizes, steps_per_epoch: Optional[int],
                     what: str) -> InputPlan:
    if steps_per_epoch is None:
        raise ConfigError(f"{what} is a dataset_fn(input_context); pass steps_per_epoch, since the length of each "
                          "worker's pipeline is not known in advance")
    import tensorflow as tf

    global_batch = batch.global_batch

    def wrapped(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        ds = fn(ctx)
        if not isinstance(ds, tf.data.Dataset):
            raise ConfigError(f"{what}: dataset_fn must return a tf.data.Dataset; it returned {type(ds).__name__}")
        if not is_batched(ds) and global_batch:
            ds = ds.batch(ctx.get_per_replica_batch_size(global_batch))
        return ds.repeat().prefetch(tf.data.AUTOTUNE)

    if backend.coordinator is not None:
        return InputPlan(wrapped, steps_per_epoch, None, "dataset_fn", "per-worker function",
                         "dataset_fn run on each worker by the coordinator")
    if backend.name == "horovod":
        ctx = tf.distribute.InputContext(backend.num_workers, backend.worker_index, backend.num_replicas_in_sync)
        return InputPlan(wrapped(ctx), steps_per_epoch, None, "dataset_fn", "per-rank input context",
                         "dataset_fn called with this rank's input context")
    dist = backend.strategy.distribute_datasets_from_function(wrapped)
    return InputPlan(dist, steps_per_epoch, None, "dataset_fn", "per-worker function",
                     "dataset_fn distributed with distribute_datasets_from_function")
