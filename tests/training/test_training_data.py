"""The one data preparation of tfaccel.fit (tfaccel.train.data), with Keras' meaning.

``prepare_data``: ``batch_size`` is the global batch, ``validation_split`` is the last fraction before any
shuffling, ``class_weight`` becomes sample weights, user datasets are used as given (never cached), a warning
says when ``shuffle`` cannot apply and ``seed=None`` draws a fresh seed that is logged. ``example_stream``: the
example order of the multi-process / resumable path is a function of ``(seed, epoch)`` only. The batch-size
options of compile_and_fit (global vs per replica) are checked here too.
"""

import logging
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "strategies"))

from strategies_logs import tfaccel_records  # noqa: E402

import tfaccel  # noqa: E402
from tfaccel.errors import ConfigError  # noqa: E402
from tfaccel.train.data import DEFAULT_BATCH_SIZE, example_stream, is_batched, prepare_data  # noqa: E402
from tfaccel.train.seeds import agree_on_seed  # noqa: E402


def _arrays(n=40):
    return np.arange(n, dtype="float32")[:, None], np.arange(n) % 3


def _messages(records, level=logging.INFO):
    return [r.getMessage() for r in records if r.levelno >= level]


# ------------------------------------------------------------------------------------------------ prepare_data

def test_arrays_batch_size_is_the_global_batch_and_defaults_to_keras():
    x, y = _arrays(70)
    data = prepare_data(x, y, batch_size=16, seed=0)
    assert (data.kind, data.num_examples, data.batch_size, data.steps_per_epoch) == ("arrays", 70, 16, 5)
    assert data.note == "arrays: 70 examples, global batch 16, 5 steps/epoch, last batch 6"  # no padding: 6 stay 6
    default = prepare_data(x, y, seed=0)
    assert default.batch_size == DEFAULT_BATCH_SIZE == 32 and "(Keras default)" in default.note
    assert prepare_data(x, y, batch_size=16, steps_per_epoch=2, seed=0).steps_per_epoch == 2


def test_validation_split_takes_the_last_fraction_before_shuffling():
    x, y = _arrays(10)
    sw = np.linspace(0.1, 1.0, 10).astype("float32")
    data = prepare_data(x, y, sample_weight=sw, validation_split=0.2, batch_size=4, shuffle=True, seed=0)
    np.testing.assert_array_equal(data.x[:, 0], np.arange(8))
    vx, vy, vsw = data.validation
    np.testing.assert_array_equal(vx[:, 0], [8, 9])
    np.testing.assert_array_equal(vy, y[8:])
    np.testing.assert_allclose(vsw, sw[8:])
    assert data.num_examples == 8 and "validation 2 examples" in data.note
    # validation_data wins over validation_split, as in Keras.
    given = prepare_data(x, y, validation_split=0.5, validation_data=(x[:3], y[:3]), seed=0)
    assert given.num_examples == 10 and len(given.validation[0]) == 3 and given.validation[2] is None


def test_class_weight_becomes_sample_weights():
    x, y = _arrays(6)
    data = prepare_data(x, y, class_weight={0: 1.0, 1: 2.0, 2: 0.5}, seed=0)
    np.testing.assert_allclose(np.asarray(data.sample_weight), [1.0, 2.0, 0.5, 1.0, 2.0, 0.5])
    assert data.class_weight is None  # folded into the sample weights


def test_dataset_used_as_given_never_cached_and_shuffle_warning():
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices(_arrays(16)).batch(4)
    with tfaccel_records() as records:
        data = prepare_data(ds, shuffle=True, seed=0, class_weight={0: 1.0, 1: 2.0, 2: 1.0})
    assert data.kind == "dataset" and data.x is ds  # the user's object itself: no .cache(), no re-batching
    assert data.batch_size is None and data.note == "a tf.data.Dataset used as given"
    assert data.class_weight == {0: 1.0, 1: 2.0, 2: 1.0}  # left to Keras for datasets
    assert _messages(records, logging.WARNING) == [
        "fit: shuffle=True does not apply to a tf.data.Dataset (Keras does not shuffle datasets either); shuffle "
        "inside your pipeline (dataset.shuffle(...)) if you want it"]
    with tfaccel_records() as records:
        prepare_data(ds, shuffle=False, seed=0)
    assert _messages(records, logging.WARNING) == []


def test_unbatched_dataset_is_batched_by_the_global_batch():
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices(_arrays(10))
    with tfaccel_records() as records:
        data = prepare_data(ds, batch_size=4, shuffle=False, seed=0)
    assert is_batched(data.x) and [len(b[0]) for b in data.x.as_numpy_iterator()] == [4, 4, 2]
    assert "fit: batching the unbatched dataset by batch_size=4" in _messages(records)


def test_py_dataset_and_dataset_fn():
    import keras
    import tensorflow as tf

    class Seq(keras.utils.PyDataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return np.zeros((4, 1), "float32"), np.zeros(4)

    assert prepare_data(Seq(), seed=0).kind == "py_dataset"

    def dataset_fn(ctx):
        return tf.data.Dataset.from_tensor_slices(_arrays(8)).batch(4)

    data = prepare_data(dataset_fn, steps_per_epoch=2, seed=0)
    assert data.kind == "distributed" and data.x is dataset_fn and data.steps_per_epoch == 2


def _generator_model(seed, optional_input=False):
    import keras

    keras.utils.set_random_seed(seed)
    if optional_input:  # Keras' own test_functional_optional_inputs, smaller
        class AddOptional(keras.layers.Layer):
            def call(self, x, o=None):
                return x if o is None else x + o

        ix, io = keras.Input((3,), name="x"), keras.Input((3,), name="o", optional=True)
        model = keras.Model({"x": ix, "o": io}, keras.layers.Dense(2)(AddOptional()(ix, io)))
    else:
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def test_generators_and_sparse_input_train_as_keras_fit_trains_them():
    """What Keras' own data adapter takes and tfaccel does not prepare (a Python generator, sparse tensors, None for
    an optional input) goes to
    Keras fit as given, with its arguments: the same weights and history as plain fit (it was a ConfigError)."""
    import tensorflow as tf

    x = np.linspace(-1, 1, 24, dtype="float32").reshape(8, 3)
    y = np.ones((8, 2), "float32")

    def batches():
        while True:
            yield x[:4], y[:4]
            yield x[4:], y[4:]

    sparse = tf.sparse.from_dense(x * (x > 0))
    for data, kwargs in ((batches, dict(steps_per_epoch=3)), (lambda: sparse, dict(y=y, batch_size=4)),
                         (lambda: {"x": x, "o": None}, dict(y=y, batch_size=4))):
        assert prepare_data(data(), **kwargs, seed=0).kind == "keras"
        optional = isinstance(data(), dict)
        plain = _generator_model(3, optional)
        expected = plain.fit(data(), epochs=2, verbose=0, shuffle=False, **kwargs).history
        with tfaccel.scope(strategy="default"):
            model = _generator_model(3, optional)
        result = tfaccel.fit(model, data(), epochs=2, verbose=0, shuffle=False, **kwargs)
        assert "Keras' own data adapter" in result.details["data"]
        np.testing.assert_allclose(result.history["loss"], expected["loss"], rtol=1e-6)
        for got, want in zip(model.get_weights(), plain.get_weights()):
            np.testing.assert_allclose(got, want, rtol=1e-6)


def test_generator_input_is_refused_for_several_processes_and_with_validation_split():
    from tfaccel.train.data import check_data_for_backend

    data = prepare_data(iter([]), seed=0)
    check_data_for_backend(data, num_workers=1, uses_keras_fit=True)
    with pytest.raises(ConfigError, match="x is a Python generator, which tfaccel cannot split between 2 processes"):
        check_data_for_backend(data, num_workers=2, uses_keras_fit=True)
    with pytest.raises(ConfigError, match="validation_split needs arrays; x is a Python generator"):
        prepare_data(iter([]), validation_split=0.5, seed=0)


def test_seed_none_draws_a_fresh_seed_and_logs_it():
    import tensorflow as tf

    from tfaccel.strategies.base import Backend

    x, y = _arrays(8)
    assert prepare_data(x, y, seed=None).seed is None and prepare_data(x, y, seed=7).seed == 7
    backend = Backend(name="default", strategy=tf.distribute.get_strategy())
    with tfaccel_records() as records:
        seeds = {agree_on_seed(None, backend=backend) for _ in range(3)}
    assert len(seeds) == 3  # a new order on every run, as with Keras
    logged = [m for m in _messages(records) if m.startswith("seed=None: drew seed")]
    assert len(logged) == 3 and all(f"pass seed={s} to repeat it" in " ".join(logged) for s in seeds)
    assert agree_on_seed(7, backend=backend) == 7


def _dataset():
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices(_arrays(8)).batch(4)


@pytest.mark.parametrize("make,kwargs,message", [
    (lambda: (np.zeros((4, 2)), np.zeros(3)), {}, r"fit: x has 4 examples but y has 3; they must match"),
    (lambda: (np.zeros((4, 2)), np.zeros(4)), {"sample_weight": np.ones(2)}, r"x has 4 examples but sample_weight has 2"),
    (lambda: (np.zeros((0, 2)), np.zeros(0)), {}, r"fit: x is empty"),
    (lambda: ("text", None), {}, r"fit: x must be arrays .* received str"),
    (lambda: _arrays(8), {"batch_size": 0}, r"batch_size must be a whole number >= 1 or None; received 0"),
    (lambda: _arrays(8), {"batch_size": 2.5}, r"batch_size must be a whole number >= 1 or None; received 2.5"),
    (lambda: _arrays(8), {"validation_split": 1.5}, r"validation_split must be a fraction between 0 and 1; "
                                                    r"received 1.5"),
    (lambda: _arrays(8), {"class_weight": {0: 1.0}, "sample_weight": np.ones(8)},
     r"pass class_weight or sample_weight, not both"),
    (lambda: _arrays(8), {"class_weight": [1.0, 2.0]}, r"class_weight must be a dict \{class index: weight\}"),
    (lambda: (_arrays(8)[0], None), {"class_weight": {0: 1.0}}, r"class_weight needs targets y"),
    (lambda: _arrays(8), {"validation_data": (1, 2, 3, 4)}, r"validation_data must be \(x, y\), \(x, y, "
                                                            r"sample_weight\) or a dataset; received a tuple of length 4"),
    (lambda: _arrays(8), {"seed": "abc"}, r"seed must be a whole number or None; received 'abc'"),
    (lambda: (_dataset(), np.zeros(8)), {}, r"fit: y cannot be given when x is a tf.data.Dataset"),
    (lambda: (_dataset(), None), {"validation_split": 0.2}, r"validation_split needs arrays; x is a tf.data.Dataset. "
                                                            r"Pass validation_data instead"),
    (lambda: (lambda ctx: None, None), {}, r"a dataset_fn\(input_context\) needs steps_per_epoch"),
])
def test_bad_data(make, kwargs, message):
    x, y = make()
    with pytest.raises(ConfigError, match=message):
        prepare_data(x, y, **kwargs)


def test_batch_size_beside_a_dataset_is_ignored_as_keras_does():
    """Keras' fit accepts ``batch_size`` beside a batched dataset and ignores it; so does tfaccel, with one line."""
    with tfaccel_records() as records:
        data = prepare_data(_dataset(), None, batch_size=64)
    assert data.kind == "dataset" and data.batch_size is None
    assert [r.getMessage() for r in records if "batch_size" in r.getMessage()] == [
        "fit: batch_size=64 is ignored: x is a tf.data.Dataset, whose elements are already batches (as in Keras' fit)"]


def test_is_batched():
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices((np.zeros((10, 3)), np.zeros(10)))
    assert not is_batched(ds)
    assert is_batched(ds.batch(4))
    assert is_batched(ds.batch(4).map(lambda a, b: (a, b)).prefetch(1))
    # a static batch dimension: the chain of transformations says it, the element spec cannot
    assert is_batched(ds.batch(4, drop_remainder=True).prefetch(1))
    assert is_batched(ds.batch(4, drop_remainder=True).shuffle(2).repeat(2).take(3).with_options(tf.data.Options()))
    assert is_batched(ds.batch(10).rebatch(4, drop_remainder=True))
    assert not is_batched(ds.batch(4).unbatch().prefetch(1))
    assert not is_batched(ds.map(lambda a, b: (a, b)).shuffle(4))
    # where the chain cannot tell (elements from a function), the element spec decides
    assert is_batched(ds.batch(4).flat_map(lambda a, b: tf.data.Dataset.from_tensors((a, b))))
    assert not is_batched(ds.flat_map(lambda a, b: tf.data.Dataset.from_tensors((a, b))))


# ---------------------------------------------------------------------------------------------- example_stream

def _labels_per_epoch(stream, steps, epochs):
    batches = list(stream.take(steps * epochs).as_numpy_iterator())
    return [np.concatenate([b[1] for b in batches[e * steps:(e + 1) * steps]]) for e in range(epochs)]


def test_order_is_a_function_of_seed_and_epoch():
    x = np.arange(40, dtype="float32")[:, None]
    y = np.arange(40)
    data = prepare_data(x, y, batch_size=8, seed=7)
    full, steps = example_stream(data, epochs=3, initial_epoch=0)
    assert steps == 5
    e0, e1, e2 = _labels_per_epoch(full, 5, 3)
    assert sorted(e0) == list(range(40)) and list(e0) != list(e1)  # each epoch a permutation, reshuffled
    # A job resumed at epoch 1, step 2 sees exactly the remaining batches of the uninterrupted job.
    resumed, _ = example_stream(data, epochs=3, initial_epoch=1, start_step=2)
    rest = np.concatenate([b[1] for b in resumed.as_numpy_iterator()])
    np.testing.assert_array_equal(rest, np.concatenate([e1[16:], e2]))
    # Another seed, another order; shuffle=False keeps the arrays' order.
    other, _ = example_stream(prepare_data(x, y, batch_size=8, seed=8), epochs=1, initial_epoch=0)
    assert list(_labels_per_epoch(other, 5, 1)[0]) != list(e0)
    plain, _ = example_stream(prepare_data(x, y, batch_size=8, shuffle=False, seed=7), epochs=1, initial_epoch=0)
    np.testing.assert_array_equal(_labels_per_epoch(plain, 5, 1)[0], np.arange(40))


def test_partial_last_batch_is_kept_not_padded():
    x, y = _arrays(10)
    stream, steps = example_stream(prepare_data(x, y, batch_size=4, shuffle=False, seed=0), epochs=1,
                                   initial_epoch=0)
    assert steps == 3 and [len(b[1]) for b in stream.as_numpy_iterator()] == [4, 4, 2]


def test_sample_weights_travel_with_their_examples():
    x, y = _arrays(8)
    data = prepare_data(x, y, class_weight={0: 1.0, 1: 2.0, 2: 3.0}, batch_size=4, seed=3)
    stream, _ = example_stream(data, epochs=1, initial_epoch=0)
    for bx, by, bsw in stream.as_numpy_iterator():
        np.testing.assert_allclose(bsw, np.array([1.0, 2.0, 3.0])[by])
        np.testing.assert_array_equal(bx[:, 0].astype(int) % 3, by)


def test_shards_split_every_global_batch_by_rank():
    x = np.arange(16, dtype="float32")[:, None]
    y = np.arange(16)
    data = prepare_data(x, y, batch_size=8, seed=0)
    full, _ = example_stream(data, epochs=1, initial_epoch=0)
    ordered = [b[1].tolist() for b in full.as_numpy_iterator()]
    global_batches = [set(b) for b in ordered]
    per_rank = []
    for rank in range(2):
        stream, steps = example_stream(data, epochs=1, initial_epoch=0, shards=2, shard_index=rank)
        assert steps == 2
        per_rank.append([b[1].tolist() for b in stream.as_numpy_iterator()])
        assert [len(b) for b in per_rank[-1]] == [4, 4]
    for step, expected in enumerate(global_batches):  # the ranks' batches of one step are that step's global batch
        assert set(per_rank[0][step]).isdisjoint(per_rank[1][step])
        assert set(per_rank[0][step]) | set(per_rank[1][step]) == expected
        # contiguous halves, as tf.distribute cuts a global batch over replicas (BatchNorm sees the same groups)
        assert per_rank[0][step] + per_rank[1][step] == ordered[step]


@pytest.mark.parametrize("n,batch,kwargs,message", [
    (16, 6, {"shards": 4}, r"global batch 6 with 16 examples: every batch must split evenly over 4 ranks"),
    (18, 8, {"shards": 4}, r"global batch 8 with 18 examples: every batch must split evenly over 4 ranks "
                           r"\(the last has 2 examples\)"),
])
def test_stream_errors(n, batch, kwargs, message):
    data = prepare_data(*_arrays(n), batch_size=batch, seed=0)
    with pytest.raises(ConfigError, match=message):
        example_stream(data, epochs=1, initial_epoch=0, shard_index=0, **kwargs)


def test_stream_refuses_a_steps_per_epoch_that_breaks_the_order():
    data = prepare_data(*_arrays(16), batch_size=4, steps_per_epoch=3, seed=0)
    with pytest.raises(ConfigError, match=r"steps_per_epoch=3 with arrays of 16 examples and batch 4 \(4 batches\) "
                                          r"cannot keep a fixed example order; leave steps_per_epoch unset"):
        example_stream(data, epochs=1, initial_epoch=0)


# ----------------------------------------------------------------------- compile_and_fit's batch-size options

def _tiny():
    import keras

    return keras.Sequential([keras.Input((1,)), keras.layers.Dense(3, activation="softmax")])


@pytest.mark.parametrize("strategy,kwargs,expected", [
    ("mirrored", {"global_batch_size": 16}, 16),
    ("mirrored", {"per_replica_batch_size": 4}, 8),
    ("mirrored", {"global_batch_size": 8, "per_replica_batch_size": 4}, 8),
    ("mirrored", {}, 2 * DEFAULT_BATCH_SIZE),  # 32 per replica, like Keras on one device
    ("default", {}, DEFAULT_BATCH_SIZE),
])
def test_compile_and_fit_global_batch(strategy, kwargs, expected, clean_tf_config, cpu_replicas):
    x, y = _arrays(64)
    result = tfaccel.compile_and_fit(_tiny, (x, y), strategy=strategy, loss="sparse_categorical_crossentropy",
                                     verbose=0, seed=0, **kwargs)
    assert result.global_batch_size == expected and result.steps_per_epoch == -(-64 // expected)


@pytest.mark.parametrize("kwargs,message", [
    ({"global_batch_size": 64, "per_replica_batch_size": 16},
     r"global_batch_size=64 disagrees with per_replica_batch_size=16 x 2 replicas = 32"),
    ({"global_batch_size": 63}, r"global_batch_size=63 does not split evenly over 2 replicas; use a multiple of 2"),
    ({"global_batch_size": 0}, r"global_batch_size must be None or a whole number >= 1; received 0"),
    ({"per_replica_batch_size": 2.5}, r"per_replica_batch_size must be None or a whole number >= 1; received 2.5"),
])
def test_compile_and_fit_batch_size_errors(kwargs, message, clean_tf_config, cpu_replicas):
    built = []
    with pytest.raises(ConfigError, match=message):
        tfaccel.compile_and_fit(lambda: built.append(1) or _tiny(), _arrays(8), strategy="mirrored",
                                loss="sparse_categorical_crossentropy", **kwargs)
    assert built == []  # refused before the model was built
