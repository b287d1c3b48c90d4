"""tfaccel.compat.tf_data reads a dataset's chain of transformations: every class name it relies on is the one this
TensorFlow gives the transformation, and ``Dataset._inputs()`` leads to the transformation's input."""

import numpy as np
import pytest
import tensorflow as tf

from tfaccel.compat import tf_data

BASE = tf.data.Dataset.from_tensor_slices((np.zeros((12, 3), "float32"), np.zeros(12, "int32")))

MADE_BY = {  # transformation -> the class name tf_data expects for it
    "BatchDataset": lambda ds: ds.batch(4),
    "ParallelBatchDataset": lambda ds: ds.batch(4, num_parallel_calls=2),
    "PaddedBatchDataset": lambda ds: ds.padded_batch(4),
    "RebatchDataset": lambda ds: ds.batch(6).rebatch(4),
    "UnbatchDataset": lambda ds: ds.batch(4).unbatch(),
    "MapDataset": lambda ds: ds.map(lambda x, y: (x, y)),
    "ParallelMapDataset": lambda ds: ds.map(lambda x, y: (x, y), num_parallel_calls=2),
    "FilterDataset": lambda ds: ds.filter(lambda x, y: True),
    "ShuffleDataset": lambda ds: ds.shuffle(4),
    "RepeatDataset": lambda ds: ds.repeat(2),
    "CacheDataset": lambda ds: ds.cache(),
    "TakeDataset": lambda ds: ds.take(4),
    "SkipDataset": lambda ds: ds.skip(1),
    "ShardDataset": lambda ds: ds.shard(2, 0),
    "PrefetchDataset": lambda ds: ds.prefetch(1),
    "OptionsDataset": lambda ds: ds.with_options(tf.data.Options()),
    "AssertCardinalityDataset": lambda ds: ds.apply(tf.data.experimental.assert_cardinality(12)),
    "IgnoreErrorsDataset": lambda ds: ds.ignore_errors(),
    "TakeWhileDataset": lambda ds: ds.take_while(lambda x, y: True),
}


def test_every_class_name_relied_on_is_this_tensorflows():
    relied_on = tf_data.BATCHING | tf_data.UNBATCHING | tf_data.KEEPS_ELEMENTS
    assert set(MADE_BY) == relied_on
    for name, make in MADE_BY.items():
        assert type(make(BASE)).__name__.lstrip("_") == name


@pytest.mark.parametrize("name", sorted(tf_data.KEEPS_ELEMENTS))
def test_inputs_lead_through_the_transformations_that_keep_elements(name):
    made = MADE_BY[name](BASE.batch(4))
    assert [type(d).__name__ for d in made._inputs()] == ["_BatchDataset"]
    assert tf_data.batch_lineage(made) is True
    assert tf_data.batch_lineage(MADE_BY[name](BASE.batch(4).unbatch())) is False


def test_what_the_chain_cannot_tell_is_none():
    assert tf_data.batch_lineage(BASE) is None
    assert tf_data.batch_lineage(BASE.batch(4).flat_map(lambda x, y: tf.data.Dataset.from_tensors((x, y)))) is None
    assert tf_data.batch_lineage(tf.data.Dataset.zip((BASE.batch(4), BASE.batch(4)))) is None
    assert tf_data.batch_lineage(tf.data.Dataset.range(3)) is None
