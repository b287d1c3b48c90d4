"""String features into a model holding StringLookup, under MirroredStrategy (keras-io's structured-data pattern).

Plain Keras 3.15 cannot train it over several replicas: its fit reduces the first batch across the replicas to build
the model, and ``AddN`` has no string kernel. tfaccel's multi-step loop trains string tensors (it kept them as tensors
instead of NumPy object arrays, which Keras refuses); where the job goes through Keras fit (a dataset),
tfaccel.compat.keras_mwms builds the model from one replica's batch (refused before training when the fix is off).
"""

import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import layers

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "parity"))

from parity_cases import set_initial_weights  # noqa: E402

import tfaccel  # noqa: E402
from tfaccel.compat import keras_mwms  # noqa: E402
from tfaccel.errors import ConfigError  # noqa: E402

VOCAB = ["red", "green", "blue", "black"]


def _data():
    rng = np.random.default_rng(0)
    words = rng.choice(VOCAB + ["unknown"], size=(64, 1))
    return tf.constant(words.astype(str)), ((words[:, 0] == "red") | (words[:, 0] == "blue")).astype("float32")


def _model():
    inp = keras.Input((1,), dtype="string", name="colour")
    hot = layers.StringLookup(vocabulary=VOCAB, output_mode="one_hot")(inp)
    out = layers.Dense(1, activation="sigmoid")(layers.Dense(4, activation="relu")(layers.Flatten()(hot)))
    model = keras.Model(inp, out)
    model.compile(keras.optimizers.SGD(0.5), "binary_crossentropy", metrics=["accuracy"])
    return set_initial_weights(model)


def test_string_tensors_train_under_mirrored_as_on_one_device(clean_tf_config, cpu_replicas):
    x, y = _data()
    plain = _model()
    expected = plain.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0).history
    with tfaccel.scope(strategy="mirrored"):
        model = _model()
    result = tfaccel.fit(model, x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
    assert result.plan.num_replicas == 2 and result.details["loop"].startswith("tfaccel's multi-step loop")
    for key, values in expected.items():
        np.testing.assert_allclose(result.history[key], values, rtol=1e-5, atol=1e-6, err_msg=key)
    for got, ref in zip(model.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(got, ref, atol=1e-5)


def test_a_string_dataset_trains_through_keras_fit_under_mirrored(clean_tf_config, cpu_replicas):
    x, y = _data()
    plain = _model()
    expected = plain.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=2, verbose=0).history
    with tfaccel.scope(strategy="mirrored"):
        model = _model()
    result = tfaccel.fit(model, tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=2, verbose=0)
    assert result.details["loop"].startswith("Keras fit") and "keras_mwms" in result.details["symbolic_build"]
    for key, values in expected.items():
        np.testing.assert_allclose(result.history[key], values, rtol=1e-5, atol=1e-6, err_msg=key)
    for got, ref in zip(model.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(got, ref, atol=1e-5)


def test_without_the_fix_a_string_dataset_is_refused_before_training(clean_tf_config, cpu_replicas, monkeypatch):
    was_applied = keras_mwms.remove()
    monkeypatch.setenv("TFACCEL_DISABLE_COMPAT", "keras_mwms")
    try:
        with tfaccel.scope(strategy="mirrored"):
            model = _model()
        before = model.get_weights()
        ds = tf.data.Dataset.from_tensor_slices(_data()).batch(16)
        with pytest.raises(ConfigError, match=r"fit: model input\(s\) colour take strings, and this job runs Keras "
                                              r"fit over 2 replicas \(Keras fit \(data is a tf.data.Dataset"):
            tfaccel.fit(model, ds, epochs=1, verbose=0)
        assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
    finally:
        monkeypatch.delenv("TFACCEL_DISABLE_COMPAT")
        if was_applied:
            keras_mwms.apply()


def test_plain_keras_fails_on_strings_under_mirrored(clean_tf_config, cpu_replicas):
    """The upstream failure; when plain Keras trains this, the fix can be retired for it."""
    was_applied = keras_mwms.remove()
    try:
        _plain_keras_under_mirrored()
    finally:
        if was_applied:
            keras_mwms.apply()


def _plain_keras_under_mirrored():
    with tfaccel.get_strategy("mirrored").scope():
        model = _model()
    with pytest.raises(tf.errors.InvalidArgumentError, match="AddN"):
        model.fit(*_data(), batch_size=16, epochs=1, verbose=0)


def test_an_uneven_global_batch_trains_through_keras_fit_under_mirrored(clean_tf_config, cpu_replicas):
    """A global batch of 21 over 2 replicas: Keras fit's symbolic build summed parts of 11 and 10 rows (AddN)."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(84, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")

    def build():
        model = keras.Sequential([keras.Input((4,)), layers.Dense(2, activation="softmax")])
        model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy", metrics=["accuracy"])
        return set_initial_weights(model)

    was_applied = keras_mwms.remove()
    try:
        with tfaccel.get_strategy("mirrored").scope():
            plain = build()
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"AddN .*\[11,4\] != input 1: \[10,4\]"):
            plain.fit(x, y, batch_size=21, epochs=1, verbose=0)
    finally:
        if was_applied:
            keras_mwms.apply()
    with tfaccel.scope(strategy="mirrored"):
        model = build()
    result = tfaccel.fit(model, x, y, batch_size=21, epochs=2, verbose=0)
    assert result.details["loop"].startswith("Keras fit") and "keras_mwms" in result.details["symbolic_build"]
    assert result.steps == 2 * 4 and np.isfinite(result.history["loss"]).all()
