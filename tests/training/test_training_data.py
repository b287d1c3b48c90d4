import numpy as np
import pytest

from tfaccel.train.data import is_batched, make_input, resolve_batch_sizes
from tfaccel.errors import ConfigError
from tfaccel.strategies.base import Backend


def _default_backend():
    import tensorflow as tf

    return Backend(name="default", strategy=tf.distribute.get_strategy())


@pytest.mark.parametrize("kwargs,expected", [
    ({"global_batch_size": 64, "per_replica_batch_size": None, "replicas": 2}, (64, 32)),
    ({"global_batch_size": None, "per_replica_batch_size": 16, "replicas": 4}, (64, 16)),
    ({"global_batch_size": 64, "per_replica_batch_size": 32, "replicas": 2}, (64, 32)),
    ({"global_batch_size": None, "per_replica_batch_size": None, "replicas": 2}, (64, 32)),
])
def test_batch_sizes(kwargs, expected):
    out = resolve_batch_sizes(pre_batched=False, **kwargs)
    assert (out.global_batch, out.per_replica) == expected


@pytest.mark.parametrize("kwargs,message", [
    ({"global_batch_size": 64, "per_replica_batch_size": 16, "replicas": 2},
     r"global_batch_size=64 disagrees with per_replica_batch_size=16 x 2 replicas = 32"),
    ({"global_batch_size": 63, "per_replica_batch_size": None, "replicas": 2},
     r"global_batch_size=63 does not split evenly over 2 replicas"),
    ({"global_batch_size": 0, "per_replica_batch_size": None, "replicas": 1},
     r"global_batch_size must be a whole number >= 1; received 0"),
    ({"global_batch_size": None, "per_replica_batch_size": 2.5, "replicas": 1},
     r"per_replica_batch_size must be a whole number >= 1; received 2.5"),
])
def test_batch_size_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        resolve_batch_sizes(pre_batched=False, **kwargs)


def test_batched_dataset_with_a_batch_size_is_refused():
    with pytest.raises(ConfigError, match="already batched"):
        resolve_batch_sizes(global_batch_size=32, per_replica_batch_size=None, replicas=1, pre_batched=True)


def test_is_batched():
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices((np.zeros((10, 3)), np.zeros(10)))
    assert not is_batched(ds)
    assert is_batched(ds.batch(4))
    assert is_batched(ds.batch(4).map(lambda a, b: (a, b)).prefetch(1))


def _epochs(plan, steps, epochs):
    batches = list(plan.dataset.take(steps * epochs).as_numpy_iterator())
    return [np.concatenate([b[1] for b in batches[e * steps:(e + 1) * steps]]) for e in range(epochs)]


def test_order_is_a_function_of_seed_and_epoch():
    x = np.arange(40, dtype="float32")[:, None]
    y = np.arange(40)
    batch = resolve_batch_sizes(global_batch_size=8, per_replica_batch_size=None, replicas=1, pre_batched=False)
    be = _default_backend()
    full = make_input((x, y), backend=be, batch=batch, epochs=3, seed=7)
    assert full.steps_per_epoch == 5
    e0, e1, e2 = _epochs(full, 5, 3)
    assert sorted(e0) == list(range(40)) and list(e0) != list(e1)  # each epoch a permutation, reshuffled
    # A job resumed at epoch 1, step 2 sees exactly the remaining batches of the uninterrupted job.
    resumed = make_input((x, y), backend=be, batch=batch, epochs=3, seed=7, start_epoch=1, start_step=2)
    rest = np.concatenate([b[1] for b in resumed.dataset.take(3 + 5).as_numpy_iterator()])
    np.testing.assert_array_equal(rest, np.concatenate([e1[16:], e2]))
    # Another seed, another order.
    other = _epochs(make_input((x, y), backend=be, batch=batch, epochs=1, seed=8), 5, 1)[0]
    assert list(other) != list(e0)


def test_horovod_backend_shards_by_rank():
    import tensorflow as tf

    x = np.arange(16, dtype="float32")[:, None]
    y = np.arange(16)
    batch = resolve_batch_sizes(global_batch_size=8, per_replica_batch_size=None, replicas=2, pre_batched=False)
    seen = []
    for rank in range(2):
        be = Backend(name="horovod", strategy=tf.distribute.get_strategy(), num_replicas_in_sync=2, num_workers=2,
                     worker_index=rank)
        plan = make_input((x, y), backend=be, batch=batch, epochs=1, seed=0)
        assert plan.steps_per_epoch == 2
        got = np.concatenate([b[1] for b in plan.dataset.take(2).as_numpy_iterator()])
        assert len(got) == 8
        seen.append(set(got.tolist()))
    assert seen[0].isdisjoint(seen[1]) and seen[0] | seen[1] == set(range(16))


@pytest.mark.parametrize("data,message", [
    ((np.zeros((4, 2)), np.zeros(3)), r"x has 4 examples but y has 3"),
    ([1, 2, 3], r"train_data must be \(x, y\) arrays, a tf.data.Dataset, or a dataset_fn"),
    ((np.zeros((0, 2)), np.zeros(0)), r"x and y are empty"),
])
def test_bad_data(data, message):
    batch = resolve_batch_sizes(global_batch_size=2, per_replica_batch_size=None, replicas=1, pre_batched=False)
    with pytest.raises(ConfigError, match=message):
        make_input(data, backend=_default_backend(), batch=batch, epochs=1, seed=0)


def test_fewer_examples_than_a_batch_with_drop_remainder():
    batch = resolve_batch_sizes(global_batch_size=8, per_replica_batch_size=None, replicas=1, pre_batched=False)
    with pytest.raises(ConfigError, match="fewer than one batch of 8"):
        make_input((np.zeros((4, 2)), np.zeros(4)), backend=_default_backend(), batch=batch, epochs=1, seed=0,
                   drop_remainder=True)
