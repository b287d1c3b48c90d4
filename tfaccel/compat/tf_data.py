"""tf.data internals: which transformation made a dataset, and from which dataset.

TensorFlow 2.21 has no public way to ask whether a dataset's elements are batches, and the element spec cannot
always tell: ``batch(32, drop_remainder=True)`` (which TPUs need) gives elements of static shape ``(32, ...)``,
as unbatched examples of 32 rows would. So tfaccel reads the chain of transformations: each dataset's class and
its input datasets (``Dataset._inputs()``). Checked on TensorFlow 2.21.0; tests/strategies/test_compat_tf_data.py
fails if the method or a class name it relies on moves.
"""

from typing import Any, Optional

__all__ = ["CHECKED_ON", "BATCHING", "UNBATCHING", "KEEPS_ELEMENTS", "batch_lineage"]

CHECKED_ON = "2.21.0"
# Transformations whose elements are batches of their input's elements (class names without leading "_").
BATCHING = frozenset({"BatchDataset", "ParallelBatchDataset", "PaddedBatchDataset", "RebatchDataset"})
UNBATCHING = frozenset({"UnbatchDataset"})
# Transformations whose elements are their input's elements (transformed one by one, dropped, reordered, repeated).
KEEPS_ELEMENTS = frozenset({
    "MapDataset", "ParallelMapDataset", "FilterDataset", "ShuffleDataset", "RepeatDataset", "CacheDataset",
    "TakeDataset", "SkipDataset", "ShardDataset", "PrefetchDataset", "OptionsDataset", "AssertCardinalityDataset",
    "IgnoreErrorsDataset", "TakeWhileDataset"})
_MAX_DEPTH = 10_000  # a chain longer than any pipeline: no loop on an object that is not what it seems


def batch_lineage(dataset: Any) -> Optional[bool]:
    """Whether a batching transformation made ``dataset``'s elements, read from its chain of transformations.

    Args:
        dataset: a ``tf.data.Dataset``.

    Returns:
        True where the last transformation that groups or splits elements batches them (``batch``,
        ``padded_batch``, ``rebatch``, ``ragged_batch``), looking through those that keep elements whole (map,
        filter, shuffle, repeat, cache, take, skip, shard, prefetch, options); False where it is ``unbatch``;
        None where the chain cannot tell (a source, ``flat_map``, ``interleave``, ``zip``, ``window``, a
        generator, another class).
    """
    for _ in range(_MAX_DEPTH):
        name = type(dataset).__name__.lstrip("_")
        if name in BATCHING:
            return True
        if name in UNBATCHING:
            return False
        inputs = dataset._inputs() if name in KEEPS_ELEMENTS and hasattr(dataset, "_inputs") else []
        if len(inputs) != 1:
            return None
        dataset = inputs[0]
    return None
