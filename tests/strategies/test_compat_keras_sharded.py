"""tfaccel.compat.keras_sharded in one process: a ShardedVariable built by hand stands for the one the
parameter_server strategy creates (the real cluster run is tests/launch/test_launch_ps_sharded.py)."""

import numpy as np
import pytest

from strategies_logs import tfaccel_records
from tfaccel.compat import keras_sharded
from tfaccel.errors import ConfigError


@pytest.fixture
def patched(monkeypatch):
    monkeypatch.delenv("TFACCEL_DISABLE_COMPAT", raising=False)
    was = keras_sharded.is_applied()
    keras_sharded.apply()
    yield
    if not was:
        keras_sharded.remove()


def _sharded_embedding(rows=10, dim=3):
    """An Embedding whose table is a ShardedVariable of 2 shards (4 + 6 rows would break "div": use 5 + 5)."""
    import keras
    import tensorflow as tf
    from tensorflow.python.distribute.sharded_variable import ShardedVariable

    layer = keras.layers.Embedding(rows, dim)
    layer.build((None, 2))
    full = np.arange(rows * dim, dtype="float32").reshape(rows, dim)
    half = rows // 2
    shards = [tf.Variable(full[:half], name="part_0"), tf.Variable(full[half:], name="part_1")]
    layer._embeddings._value = ShardedVariable(shards)
    return layer, full, shards


def test_lookup_and_sparse_gradient_per_shard(patched) -> None:
    import tensorflow as tf

    layer, full, shards = _sharded_embedding()
    ids = tf.constant([[1, 7], [7, 4]])
    views = keras_sharded.trainable_shards(layer.trainable_variables)
    assert [v.value for v in views] == shards  # one Keras variable per shard, wrapping the shard itself
    assert keras_sharded.trainable_shards(layer.trainable_variables)[0] is views[0]  # made once
    with tf.GradientTape() as tape:
        out = layer(ids)
        loss = tf.reduce_sum(out * out)
    np.testing.assert_array_equal(out.numpy(), full[ids.numpy()])
    grads = tape.gradient(loss, views)
    assert all(isinstance(g, tf.IndexedSlices) for g in grads)  # a sparse update per shard
    dense = np.concatenate([tf.convert_to_tensor(g).numpy() for g in grads])
    expected = np.zeros_like(full)
    np.add.at(expected, ids.numpy().ravel(), 2 * full[ids.numpy().ravel()])
    np.testing.assert_allclose(dense, expected)


def test_optimizer_updates_each_shard(patched) -> None:
    import keras
    import tensorflow as tf

    layer, full, shards = _sharded_embedding()
    views = keras_sharded.trainable_shards(layer.trainable_variables)
    opt = keras.optimizers.SGD(0.5)
    opt.build(views)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(tf.constant([[0, 9]])))
    opt.apply(tape.gradient(loss, views), views)
    expected = full.copy()
    expected[[0, 9]] -= 0.5
    np.testing.assert_allclose(np.concatenate([s.numpy() for s in shards]), expected)
    placed = keras_sharded.placements(layer.variables)
    assert placed == [{"name": layer._embeddings.path, "shape": [10, 3], "shards": 2,
                       "shard_shapes": [[5, 3], [5, 3]], "devices": [s.device for s in shards]}]


def test_checkpoint_of_a_sharded_table_restores_sharded_and_whole(patched, tmp_path) -> None:
    import keras
    import tensorflow as tf

    layer, full, shards = _sharded_embedding()
    path = tf.train.Checkpoint(layer=layer).write(str(tmp_path / "ckpt"))
    whole = keras.layers.Embedding(10, 3)
    whole.build((None, 2))
    tf.train.Checkpoint(layer=whole).read(path).assert_existing_objects_matched()
    np.testing.assert_array_equal(whole.embeddings.numpy(), full)  # one variable from the two slices
    for shard in shards:
        shard.assign(tf.zeros_like(shard))
    tf.train.Checkpoint(layer=layer).read(path).assert_existing_objects_matched()
    np.testing.assert_array_equal(np.concatenate([s.numpy() for s in shards]), full)  # each shard its slice
    np.testing.assert_array_equal(np.asarray(layer._embeddings), full)  # what .keras saving reads


def test_without_the_fix_the_upstream_failure_remains(monkeypatch, tmp_path) -> None:
    import tensorflow as tf

    layer, _, _ = _sharded_embedding()
    monkeypatch.setenv("TFACCEL_DISABLE_COMPAT", "keras_sharded")
    assert keras_sharded.why_not_needed() == "switched off by TFACCEL_DISABLE_COMPAT (keras_sharded)"
    variables = keras_sharded.trainable_shards(layer.trainable_variables)
    assert variables == layer.trainable_variables
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(tf.constant([[0, 9]])))
    with pytest.raises(AttributeError, match="'ShardedVariable' object has no attribute 'handle'"):
        tape.gradient(loss, variables)
    was = keras_sharded.is_applied()
    keras_sharded.remove()
    try:
        with pytest.raises(AttributeError, match="'ShardedVariable' object has no attribute 'device'"):
            tf.train.Checkpoint(layer=layer).write(str(tmp_path / "ckpt"))
        with pytest.raises(AttributeError, match="'ShardedVariable' object has no attribute '__array__'"):
            np.asarray(layer._embeddings)
    finally:
        if was:
            keras_sharded.apply(force=True)


def test_version_guard_idempotent_and_reversible(monkeypatch) -> None:
    import keras

    monkeypatch.delenv("TFACCEL_DISABLE_COMPAT", raising=False)
    was = keras_sharded.is_applied()
    keras_sharded.remove()
    try:
        from keras.src.backend.tensorflow.core import Variable

        original = keras.layers.Embedding.__dict__["call"]
        original_save = Variable.__dict__["_serialize_to_tensors"]
        assert keras_sharded.apply() and keras_sharded.apply()
        assert keras.layers.Embedding.call._tfaccel_fix == "keras_sharded"
        assert Variable._serialize_to_tensors._tfaccel_fix == Variable._restore_from_tensors._tfaccel_fix
        assert Variable._serialize_to_tensors.__closure__[0].cell_contents is original_save  # wrapped once
        assert keras_sharded.remove() and not keras_sharded.remove()
        assert keras.layers.Embedding.__dict__["call"] is original
        assert Variable.__dict__["_serialize_to_tensors"] is original_save
        assert "__array__" not in Variable.__dict__  # inherited from KerasVariable again
        monkeypatch.setattr(keras, "__version__", "3.16.0")
        with tfaccel_records() as records:
            assert not keras_sharded.apply() and not keras_sharded.is_applied()
        text = "\n".join(r.getMessage() for r in records)
        assert "compat fix keras_sharded not applied: Keras 3.16.0 is outside the versions" in text
        assert "keras-team/keras#18624" in text
    finally:
        if was:
            keras_sharded.apply(force=True)


@pytest.mark.parametrize("options, message", [
    ({"variable_partitioner": 0}, r"variable_partitioner must be None, a number of shards >= 1.*received 0"),
    ({"variable_partitioner": "max_size"}, r"variable_partitioner must be None.*received 'max_size'"),
    ({"variable_partitioner": 2, "max_shards": 3},
     r"max_shards=3 applies to variable_partitioner='min_size' only; received variable_partitioner=2"),
    ({"variable_partitioner": None, "min_shard_bytes": 1024},
     r"min_shard_bytes=1024 applies to variable_partitioner='min_size' only; received variable_partitioner=None"),
    ({"variable_partitioner": "min_size", "min_shard_bytes": 0},
     r"min_shard_bytes must be an integer >= 1; received 0"),
    ({"variable_partitioner": "min_size", "max_shards": 1.5}, r"max_shards must be an integer >= 1; received 1.5"),
])
def test_partitioner_option_errors(options, message) -> None:
    from tfaccel.strategies.builtin import parameter_server_request

    with pytest.raises(ConfigError, match=message):
        parameter_server_request(devices=None, task=None, **options)


def test_partitioner_settings_and_note() -> None:
    import tensorflow as tf

    from tfaccel.cluster import ClusterSpec, TaskInfo
    from tfaccel.strategies import builtin

    spec = ClusterSpec.from_hosts(workers=["localhost:2000"], ps=["localhost:3000", "localhost:3001"],
                                  chief="localhost:4000")
    request = builtin.parameter_server_request(devices=None, task=TaskInfo(spec, "chief", 0),
                                               variable_partitioner="min_size")
    assert (request["min_shard_bytes"], request["max_shards"]) == (256 << 10, 2)  # one shard per ps by default
    settings = {k: request[k] for k in ("variable_partitioner", "min_shard_bytes", "max_shards")}
    partitioner = builtin._partitioner(settings)
    assert partitioner(tf.TensorShape([200000, 32]), tf.float32) == [2, 1]  # 25.6 MB: capped at 2 shards
    assert partitioner(tf.TensorShape([1000, 32]), tf.float32) == [1, 1]  # 128 KB: one shard
    custom = builtin._partitioner({"variable_partitioner": "min_size", "min_shard_bytes": 1 << 20, "max_shards": 8})
    assert custom(tf.TensorShape([200000, 32]), tf.float32) == [8, 1]
    note = builtin._partitioner_note(settings, 2)
    assert note.startswith("variable_partitioner 'min_size': variables of at least 2 x 262144 bytes")
    assert "keras-team/keras#18624" in note
    assert builtin._partitioner_note({"variable_partitioner": partitioner}, 2).startswith(
        "variable_partitioner a custom partitioner (MinSizePartitioner), placed round-robin over the 2 ps task(s)")
    assert builtin._partitioner({"variable_partitioner": partitioner}) is partitioner  # given: used as is
