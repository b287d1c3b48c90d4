"""write_tfrecords / tfrecord_dataset round-trip, and tf.data FILE auto-sharding gives workers whole files."""

from pathlib import Path
from typing import List, Set

import numpy as np
import pytest
import tensorflow as tf

from tfaccel.datasets import load_dataset, tfrecord_dataset, write_tfrecords
from tfaccel.errors import ConfigError


def test_round_trip_float_images(tmp_path: Path) -> None:
    x, y = load_dataset("digits", num_examples=50)
    paths = write_tfrecords(x, y, str(tmp_path / "digits"), num_shards=4)
    assert [Path(p).name for p in paths] == [f"data-0000{i}-of-00004.tfrecord" for i in range(4)]
    ds = tfrecord_dataset(str(tmp_path / "digits" / "*.tfrecord"), feature_shape=(8, 8, 1))
    assert ds.element_spec[0].shape == (8, 8, 1) and ds.element_spec[0].dtype == tf.float32
    assert ds.element_spec[1].dtype == tf.int32
    got = [(a.numpy(), int(b.numpy())) for a, b in ds]
    assert len(got) == 50
    # deterministic interleave: round-robin over the 4 files restores the original order
    np.testing.assert_allclose(np.stack([g[0] for g in got]), x)
    assert [g[1] for g in got] == list(y)


def test_round_trip_int_tokens(tmp_path: Path) -> None:
    x, y = load_dataset("synthetic_text", sequence_length=6, vocab_size=30, num_examples=9)
    write_tfrecords(x, y, str(tmp_path), num_shards=3, prefix="text")
    ds = tfrecord_dataset(str(tmp_path / "text-*"), feature_shape=(6,), dtype="int32", shuffle_files=True, seed=1)
    got_x = np.stack([a.numpy() for a, _ in ds])
    assert got_x.dtype == np.int32
    assert sorted(map(tuple, got_x)) == sorted(map(tuple, x))


def _auto_shard(ds: tf.data.Dataset, policy: tf.data.experimental.AutoShardPolicy, workers: int,
                index: int) -> tf.data.Dataset:
    """Applies the same graph rewrite tf.distribute applies per worker (private TF API: the test needs no cluster)."""
    from tensorflow.python.data.experimental.ops.distribute import _AutoShardDataset

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = policy
    return _AutoShardDataset(ds.with_options(options), workers, index)


def test_file_auto_sharding_gives_each_worker_whole_files(tmp_path: Path) -> None:
    x = np.arange(40, dtype=np.float32).reshape(40, 1)
    y = np.arange(40) % 4  # example i lands in shard i % 4, so y names its file
    write_tfrecords(x, y, str(tmp_path), num_shards=4)
    ds = tfrecord_dataset(str(tmp_path / "*.tfrecord"), feature_shape=(1,)).batch(5)
    seen: List[Set[int]] = []
    values: List[Set[float]] = []
    for index in range(2):
        sharded = _auto_shard(ds, tf.data.experimental.AutoShardPolicy.FILE, 2, index)
        labels, xs = set(), set()
        for bx, by in sharded:
            labels.update(int(v) for v in by.numpy())
            xs.update(float(v) for v in bx.numpy().reshape(-1))
        seen.append(labels)
        values.append(xs)
    assert seen == [{0, 2}, {1, 3}]  # worker 0 reads files 0 and 2, worker 1 files 1 and 3
    assert values[0].isdisjoint(values[1]) and len(values[0] | values[1]) == 40


def test_file_sharding_needs_files_and_fails_on_in_memory_data() -> None:
    """The contrast: FILE sharding of an in-memory dataset finds no reader, which is why the TFRecords exist."""
    ds = tf.data.Dataset.from_tensor_slices(np.arange(8.0)).batch(2)
    with pytest.raises(tf.errors.NotFoundError):
        list(_auto_shard(ds, tf.data.experimental.AutoShardPolicy.FILE, 2, 0))


def test_writer_and_reader_errors(tmp_path: Path) -> None:
    x = np.zeros((4, 2), np.float32)
    with pytest.raises(ConfigError, match=r"write_tfrecords: x has 4 examples but y has 3 labels"):
        write_tfrecords(x, np.zeros(3), str(tmp_path))
    with pytest.raises(ConfigError, match=r"write_tfrecords: num_shards must be an integer from 1 to the number "
                                          r"of examples \(4\); received num_shards=5"):
        write_tfrecords(x, np.zeros(4), str(tmp_path), num_shards=5)
    with pytest.raises(ConfigError, match=r"tfrecord_dataset: no file matches pattern '.*nothing-\*'; write the "
                                          r"files with tfaccel.datasets.write_tfrecords"):
        tfrecord_dataset(str(tmp_path / "nothing-*"), feature_shape=(2,))
    with pytest.raises(ConfigError, match=r"tfrecord_dataset dtype: unknown value 'float16'; valid values are: "
                                          r"'float32', 'int32'"):
        tfrecord_dataset(str(tmp_path / "*"), feature_shape=(2,), dtype="float16")
