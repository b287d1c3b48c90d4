"""write_tfrecords / tfrecord_dataset round-trip, and tf.data FILE auto-sharding gives workers whole files."""

from pathlib import Path
from typing import List, Set

import numpy as np
import pytest
import tensorflow as tf

from tfaccel.datasets import load_dataset, tfrecord_dataset, write_tfrecords
from tfaccel.errors import ConfigError
from tfaccel.tfrecords import reads_in_parallel


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


def _read(pattern: str, shape: tuple, **options: object) -> tuple:
    batches = list(tfrecord_dataset(pattern, feature_shape=shape, **options))
    xs = [b[0].numpy().reshape((-1,) + shape) for b in batches]
    return np.concatenate(xs), np.concatenate([b[1].numpy().reshape(-1) for b in batches]), batches


def test_blocks_give_the_same_examples_in_the_same_order(tmp_path: Path) -> None:
    x, y = load_dataset("digits", num_examples=50)
    write_tfrecords(x, y, str(tmp_path / "one"), num_shards=4)
    write_tfrecords(x, y, str(tmp_path / "block"), num_shards=4, examples_per_record=3)  # 17 blocks, last holds 2
    assert sum(1 for _ in tf.data.TFRecordDataset(sorted(map(str, (tmp_path / "block").iterdir())))) == 17
    one_x, one_y, _ = _read(str(tmp_path / "one" / "*"), (8, 8, 1))
    for batch_size in (None, 8, 2):  # unbatched; several blocks per parse; fewer examples per batch than a block
        got_x, got_y, batches = _read(str(tmp_path / "block" / "*"), (8, 8, 1), examples_per_record=3,
                                      batch_size=batch_size)
        np.testing.assert_array_equal(got_x, one_x)
        np.testing.assert_array_equal(got_y, one_y)
        np.testing.assert_array_equal(got_x, x)
        sizes = [len(b[1].numpy().reshape(-1)) for b in batches]
        full, rest = divmod(50, batch_size or 1)
        assert sizes == [batch_size or 1] * full + [rest] * (rest > 0)
        assert batches[0][0].dtype == tf.float32 and batches[0][1].dtype == tf.int32
    # shuffled files: each file's examples still come in written order, the same set as one per record
    got_x, got_y, _ = _read(str(tmp_path / "block" / "*"), (8, 8, 1), examples_per_record=3, batch_size=8,
                            shuffle_files=True, seed=3)
    assert sorted(map(tuple, got_x.reshape(50, -1))) == sorted(map(tuple, x.reshape(50, -1)))
    index = {tuple(row): i for i, row in enumerate(x.reshape(50, -1))}
    positions = [index[tuple(row)] for row in got_x.reshape(50, -1)]
    for shard in range(4):
        mine = [p for p in positions if (p // 3) % 4 == shard]
        assert mine == sorted(mine) and len(mine) == len([i for i in range(50) if (i // 3) % 4 == shard])


def test_int_blocks_and_input_context(tmp_path: Path) -> None:
    x, y = load_dataset("synthetic_text", sequence_length=6, vocab_size=30, num_examples=20)
    write_tfrecords(x, y, str(tmp_path), num_shards=2, examples_per_record=4)
    got = []
    for worker in range(2):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=worker)
        got_x, got_y, _ = _read(str(tmp_path / "*"), (6,), dtype="int32", examples_per_record=4, batch_size=5,
                                input_context=context)
        assert got_x.dtype == np.int32
        expected = [i for i in range(20) if (i // 4) % 2 == worker]  # worker w reads blocks w, w+2, ...
        np.testing.assert_array_equal(got_x, x[expected])
        np.testing.assert_array_equal(got_y, y[expected])
        got.extend(expected)
    assert sorted(got) == list(range(20))


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
                                          r"of records \(4: 4 examples, 1 per record\); received num_shards=5"):
        write_tfrecords(x, np.zeros(4), str(tmp_path), num_shards=5)
    with pytest.raises(ConfigError, match=r"write_tfrecords: num_shards must be an integer from 1 to the number "
                                          r"of records \(2: 4 examples, 3 per record\); received num_shards=3"):
        write_tfrecords(x, np.zeros(4), str(tmp_path), num_shards=3, examples_per_record=3)
    with pytest.raises(ConfigError, match=r"write_tfrecords: examples_per_record must be a positive integer \(1: one "
                                          r"example per record, k > 1: blocks of k examples, e.g. 64\); received "
                                          r"examples_per_record=0"):
        write_tfrecords(x, np.zeros(4), str(tmp_path), examples_per_record=0)
    with pytest.raises(ConfigError, match=r"tfrecord_dataset: examples_per_record must be a positive integer .*"
                                          r"received examples_per_record='64'"):
        tfrecord_dataset(str(tmp_path / "*"), feature_shape=(2,), examples_per_record="64")
    write_tfrecords(x, np.zeros(4), str(tmp_path / "ok"), num_shards=1)
    write_tfrecords(x, np.zeros(4), str(tmp_path / "blocks"), num_shards=1, examples_per_record=3)
    with pytest.raises(ConfigError, match=r"tfrecord_dataset: examples_per_record=1 but '.*blocks.*' holds 3 "
                                          r"examples per record \(as written by write_tfrecords\); pass "
                                          r"examples_per_record=3"):
        tfrecord_dataset(str(tmp_path / "blocks" / "*"), feature_shape=(2,))
    with pytest.raises(ConfigError, match=r"examples_per_record=4 but '.*ok.*' holds 1 examples per record"):
        tfrecord_dataset(str(tmp_path / "ok" / "*"), feature_shape=(2,), examples_per_record=4)
    with pytest.raises(ConfigError, match=r"tfrecord_dataset: batch_size must be a positive integer or None "
                                          r"\(unbatched\); received batch_size=0"):
        tfrecord_dataset(str(tmp_path / "ok" / "*"), feature_shape=(2,), batch_size=0)
    with pytest.raises(ConfigError, match=r"tfrecord_dataset: no file matches pattern '.*nothing-\*'; write the "
                                          r"files with tfaccel.datasets.write_tfrecords"):
        tfrecord_dataset(str(tmp_path / "nothing-*"), feature_shape=(2,))
    with pytest.raises(ConfigError, match=r"tfrecord_dataset dtype: unknown value 'float16'; valid values are: "
                                          r"'float32', 'int32'"):
        tfrecord_dataset(str(tmp_path / "*"), feature_shape=(2,), dtype="float16")


@pytest.mark.parametrize("per_record", [1, 4])
def test_the_reader_can_be_built_while_tensorflow_traces(tmp_path: Path, per_record: int) -> None:
    """ClusterCoordinator.create_per_worker_dataset traces the dataset function: building the pipeline inside a
    tf.function must work (reading the files' format by iterating a dataset there failed: "a return statement
    cannot be placed inside this TensorFlow loop")."""
    x, y = load_dataset("synthetic", input_shape=(3,), num_classes=2, num_examples=10)
    write_tfrecords(x, y, str(tmp_path), num_shards=2, examples_per_record=per_record)

    @tf.function
    def count() -> tf.Tensor:
        ds = tfrecord_dataset(str(tmp_path / "*.tfrecord"), feature_shape=(3,), batch_size=4,
                              examples_per_record=per_record)
        return ds.reduce(tf.constant(0), lambda total, batch: total + tf.shape(batch[0])[0])

    assert int(count()) == 10


def test_local_files_are_read_sequentially_and_others_in_parallel_with_the_same_order(tmp_path: Path) -> None:
    assert not reads_in_parallel(str(tmp_path / "*.tfrecord"))
    assert not reads_in_parallel("file:///data/*.tfrecord") and not reads_in_parallel("FILE:///data/*")
    assert reads_in_parallel("gs://bucket/data-*.tfrecord") and reads_in_parallel("s3://b/*")
    x, y = load_dataset("digits", num_examples=50)
    paths = write_tfrecords(x, y, str(tmp_path), num_shards=4, examples_per_record=3)
    for path in paths:  # TensorFlow's in-memory file system: not local, so read in parallel
        tf.io.gfile.copy(path, f"ram://{tmp_path.name}/{Path(path).name}", overwrite=True)
    # local files (read sequentially) give back the written order in the other tests; so do parallel reads:
    got_x, got_y, _ = _read(f"ram://{tmp_path.name}/*.tfrecord", (8, 8, 1), examples_per_record=3, batch_size=8)
    np.testing.assert_array_equal(got_x, x)
    np.testing.assert_array_equal(got_y, y)
