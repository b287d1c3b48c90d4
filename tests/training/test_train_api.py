"""tfaccel.scope() + tfaccel.fit: the user's objects stay theirs, what tfaccel changes is said, bad input fails clearly."""

import logging
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfaccel
from tfaccel.errors import ConfigError

X = np.random.default_rng(0).normal(size=(40, 4)).astype("float32")
Y = (X[:, 0] > 0).astype("int32")


def _model(optimizer=None):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer=optimizer or keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


def _scoped(optimizer=None, strategy="default"):
    with tfaccel.scope(strategy=strategy):
        return _model(optimizer() if callable(optimizer) else optimizer)


def test_the_optimizer_object_is_the_users_and_gets_its_class_back(clean_tf_config, tmp_path):
    opt = keras.optimizers.SGD(0.1, clipnorm=1.0)
    model = _scoped(opt)
    result = tfaccel.fit(model, X, Y, batch_size=8, epochs=2, verbose=0, gradient_accumulation_steps=2, seed=1)
    assert model.optimizer is opt and type(opt) is keras.optimizers.SGD  # swapped for training, given back
    assert "accumulated over 2 micro-batches" in result.details["optimizer"]
    assert int(opt.iterations) == 2 * 5 // 2  # updates, not micro-batches
    assert opt.clipnorm == 1.0 and float(opt.learning_rate) == pytest.approx(0.1)


def test_a_keras_file_saved_during_training_loads_without_tfaccel(clean_tf_config, tmp_path):
    path = str(tmp_path / "m.keras")
    model = _scoped(lambda: keras.optimizers.Adam(1e-2, global_clipnorm=1.0), strategy="mirrored")
    tfaccel.fit(model, X, Y, batch_size=8, epochs=1, verbose=0,
                callbacks=[keras.callbacks.ModelCheckpoint(path)])  # saved while the class was swapped
    code = ("import sys, keras; m = keras.models.load_model(sys.argv[1]); "
            "print(type(m.optimizer).__module__, type(m.optimizer).__name__, 'tfaccel' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-3:] == ["keras.src.optimizers.adam", "Adam", "False"], out.stdout


def test_learning_rate_scaling_is_opt_in_and_wraps_the_schedule(clean_tf_config):
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5)
    model = _scoped(keras.optimizers.SGD(schedule))
    result = tfaccel.fit(model, X, Y, batch_size=8, epochs=1, verbose=0, scale_learning_rate="linear",
                         base_batch_size=4)
    assert "x2" in result.details["learning_rate"]
    wrapped = model.optimizer._learning_rate
    assert wrapped.inner is schedule
    for step in (0, 3):
        assert float(wrapped(step)) == pytest.approx(2 * float(schedule(step)))
    untouched = _scoped()
    assert tfaccel.fit(untouched, X, Y, batch_size=8, verbose=0).details["learning_rate"] == "learning rate as compiled"


def test_the_loop_and_its_reason_are_reported(clean_tf_config):
    result = tfaccel.fit(_scoped(), X, Y, batch_size=8, epochs=1, verbose=0)
    assert result.details["loop"].startswith("compiled whole-epoch loop")
    cb = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: None)
    result = tfaccel.fit(_scoped(), X, Y, batch_size=8, epochs=1, verbose=0, callbacks=[cb])
    assert "LambdaCallback has per-batch hooks" in result.details["loop"]
    assert result.details["steps_per_execution"].startswith("1 ")
    with pytest.raises(ConfigError, match="loop='compiled' cannot train this job exactly like Keras fit: callback "
                                          "LambdaCallback has per-batch hooks"):
        tfaccel.fit(_scoped(), X, Y, batch_size=8, verbose=0, callbacks=[cb], loop="compiled")


@pytest.mark.parametrize("kwargs, message", [
    (dict(sample_weight=np.ones(40), class_weight={0: 1.0}), "pass class_weight or sample_weight, not both"),
    (dict(validation_split=1.5), r"validation_split must be a fraction between 0 and 1; received 1.5"),
    (dict(batch_size=0), "batch_size must be a whole number >= 1 or None; received 0"),
    (dict(epochs=0), "epochs must be a whole number >= 1; received 0"),
    (dict(loop="fast"), "loop"),
    (dict(seed="x"), "seed must be a whole number or None; received 'x'"),
    (dict(y=Y[:10]), "x has 40 examples but y has 10"),
])
def test_bad_arguments_fail_before_training(kwargs, message, clean_tf_config):
    model = _scoped()
    before = [w.copy() for w in model.get_weights()]
    args = {"y": Y, **kwargs}
    with pytest.raises(ConfigError, match=message):
        tfaccel.fit(model, X, verbose=0, **args)
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))


def test_dataset_rules(clean_tf_config, caplog):
    ds = tf.data.Dataset.from_tensor_slices((X, Y)).batch(8)
    with pytest.raises(ConfigError, match="validation_split needs arrays"):
        tfaccel.fit(_scoped(), ds, validation_split=0.2, verbose=0)
    with pytest.raises(ConfigError, match="y cannot be given when x is a tf.data.Dataset"):
        tfaccel.fit(_scoped(), ds, Y, verbose=0)
    with caplog.at_level(logging.WARNING, logger="tfaccel"):
        result = tfaccel.fit(_scoped(), ds, epochs=1, verbose=0)
    assert "shuffle=True does not apply to a tf.data.Dataset" in caplog.text
    assert "Keras fit (data is a tf.data.Dataset" in result.details["loop"] and result.steps == 5


BATCHED_PIPELINES = {
    "batch": lambda ds: ds.batch(8),
    # static batch dimension (8, 4), as TPUs need: not to be batched again
    "drop_remainder_prefetch": lambda ds: ds.batch(8, drop_remainder=True).prefetch(2),
    "drop_remainder_map_cache": lambda ds: ds.batch(8, drop_remainder=True).map(lambda x, y: (x * 1.0, y)).cache(),
    "rebatch": lambda ds: ds.batch(20).rebatch(8, drop_remainder=True),
}


@pytest.mark.parametrize("pipeline", sorted(BATCHED_PIPELINES))
def test_batch_size_beside_a_dataset_trains_as_keras_fit(pipeline, clean_tf_config):
    """``fit(dataset, batch_size=...)`` runs in Keras (the batch size is ignored); after the 3-line change it must too,
    also where the batch dimension is static (``drop_remainder=True``) and the batching is not the last step."""
    ds = BATCHED_PIPELINES[pipeline](tf.data.Dataset.from_tensor_slices((X, Y)))
    plain, ours = _scoped(), _scoped()
    ours.set_weights(plain.get_weights())
    expected = plain.fit(ds, batch_size=8, epochs=2, verbose=0).history
    result = tfaccel.fit(ours, ds, batch_size=8, epochs=2, verbose=0)
    assert result.steps == 2 * 5  # 40 examples in batches of 8, as the dataset has them
    for key, values in expected.items():
        np.testing.assert_allclose(result.history[key], values, rtol=1e-5, atol=1e-6)
    for a, b in zip(plain.get_weights(), ours.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_seed_none_draws_a_fresh_seed_and_logs_it(clean_tf_config, caplog):
    with caplog.at_level(logging.INFO, logger="tfaccel"):
        a = tfaccel.fit(_scoped(), X, Y, batch_size=8, verbose=2).details["seed"]
        b = tfaccel.fit(_scoped(), X, Y, batch_size=8, verbose=0).details["seed"]
    assert a != b and f"drew seed {a}" in caplog.text and f"seed={b}" not in caplog.text  # verbose=0: no seed line


def test_models_outside_a_tfaccel_scope(clean_tf_config, cpu_replicas, monkeypatch):
    import tfaccel.train.scope as scope_module

    monkeypatch.setattr(scope_module, "_PLANS", {})  # as in a fresh process: no plan entered yet
    plain = _model()  # no scope at all; this process's "auto" plan is mirrored over 2 virtual CPUs
    with pytest.raises(ConfigError, match="built outside tfaccel.scope\\(\\).*plan is strategy 'mirrored'"):
        tfaccel.fit(plain, X, Y, verbose=0)
    with pytest.raises(ConfigError, match="fit: the model is not compiled"):
        with tfaccel.scope(strategy="default"):
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        tfaccel.fit(model, X, Y, verbose=0)
    foreign = tf.distribute.OneDeviceStrategy("/cpu:1")
    with foreign.scope():
        model = _model()
    with pytest.raises(ConfigError, match="built under a OneDeviceStrategy that tfaccel did not make"):
        tfaccel.fit(model, X, Y, verbose=0)


def test_a_strategy_of_the_users_own_may_be_entered_inside_the_default_scope(clean_tf_config):
    """tfaccel.scope(strategy="default") enters nothing (TF's default strategy's scope would make TF refuse the
    user's own strategy inside it, "Mixing different tf.distribute.Strategy objects", which plain Keras allows);
    tfaccel.fit then says it did not make that strategy."""
    with tfaccel.scope(strategy="default"):
        assert not tf.distribute.has_strategy()
        with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
            model = _model()
    with pytest.raises(ConfigError, match="built under a OneDeviceStrategy that tfaccel did not make"):
        tfaccel.fit(model, X, Y, verbose=0)


def test_an_optimizer_created_outside_the_scope_is_named(clean_tf_config, cpu_replicas):
    opt = keras.optimizers.Adam(1e-3)  # created under the default strategy
    model = _scoped(opt, strategy="mirrored")
    with pytest.raises(ConfigError, match="optimizer Adam was created under a _DefaultDistributionStrategy, but the "
                                          "model is built under a MirroredStrategy.*Create the optimizer inside"):
        tfaccel.fit(model, X, Y, verbose=0)


def test_the_precision_policy_is_restored_after_the_scope(clean_tf_config):
    before = keras.config.dtype_policy().name
    with tfaccel.scope(strategy="default", precision="mixed_bfloat16") as plan:
        assert keras.config.dtype_policy().name == "mixed_bfloat16" == plan.precision
    assert keras.config.dtype_policy().name == before


@pytest.mark.parametrize("loop", ["compiled", "keras"])
def test_tensorboard_dir_writes_epoch_summaries(loop, clean_tf_config, tmp_path):
    result = tfaccel.fit(_scoped(), X, Y, batch_size=8, epochs=2, verbose=0, loop=loop,
                         tensorboard_dir=str(tmp_path / "tb"))
    events = list((tmp_path / "tb").rglob("events.out.tfevents.*"))
    assert events and result.details["loop"].lower().startswith(loop)


def test_recompute_option_trains_the_same_model(clean_tf_config):
    def build():
        inputs = keras.Input((4,))
        h = keras.layers.Dense(8, activation="relu", name="b1_dense")(inputs)
        h = keras.layers.Dense(8, activation="relu", name="b2_dense")(h)
        return keras.Model(inputs, keras.layers.Dense(2, activation="softmax", name="head")(h))

    results = []
    for recompute in (None, "all"):
        keras.utils.set_random_seed(3)
        with tfaccel.scope(strategy="default"):
            model = build()
            model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
        result = tfaccel.fit(model, X, Y, batch_size=8, epochs=2, verbose=0, shuffle=False, recompute=recompute)
        results.append((result, model.get_weights()))
    (plain, w_plain), (recomputed, w_rec) = results
    assert recomputed.details["recompute"] == "blocks b1, b2" and "recompute" not in plain.details
    assert np.allclose(plain.history["loss"], recomputed.history["loss"], rtol=1e-5)
    assert all(np.allclose(a, b, atol=1e-5) for a, b in zip(w_plain, w_rec))
    with pytest.raises(ConfigError, match="recompute"):
        tfaccel.fit(_scoped(), X, Y, verbose=0, recompute="all")  # a Sequential model cannot be cut



def test_a_dataset_of_known_length_runs_many_steps_per_call_and_trains_like_keras_fit(clean_tf_config):
    """"auto" gives a finite dataset min(batches, 64) steps per call (the last batch partial): the same history and
    weights as plain model.fit at one step per call, and the steps counted exactly."""
    def dataset():  # 40 examples in 6 batches of 7 + 5
        return tf.data.Dataset.from_tensor_slices((X, Y)).batch(7)

    reference = _model()
    initial = reference.get_weights()
    expected = reference.fit(dataset(), epochs=3, verbose=0).history
    model = _scoped()
    model.set_weights(initial)
    result = tfaccel.fit(model, dataset(), epochs=3, verbose=0)
    assert result.details["steps_per_execution"] == "6 (auto: min(steps/epoch=6, 64))", result.details
    assert result.steps == 18
    assert result.history.keys() == expected.keys()
    for key, values in expected.items():
        np.testing.assert_allclose(result.history[key], values, rtol=1e-6, err_msg=key)
    for got, want in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, atol=1e-6)
    unknown = dataset().filter(lambda x, y: True)
    assert tfaccel.fit(_scoped(), unknown, verbose=0).details["steps_per_execution"] == "1 (1: epoch length unknown)"


def test_steps_are_counted_exactly_when_the_last_call_of_an_epoch_is_short(clean_tf_config):
    """70 batches at 64 steps per call: Keras numbers the second call's batches up to 127; 70 steps ran."""
    x = np.repeat(X, 7, axis=0)[:280]
    y = np.repeat(Y, 7, axis=0)[:280]
    result = tfaccel.fit(_scoped(), x, y, batch_size=4, epochs=2, verbose=0, loop="keras")
    assert result.details["steps_per_execution"].startswith("64 "), result.details
    assert result.steps == 140
