"""A tf_keras (Keras 2) model given to tfaccel gets an error saying so and what to do (issue 24, point 10).

With the real tf_keras package where it is installed (tf-keras 2.21.0 installs with --no-deps beside
tensorflow-cpu); otherwise with a faithful stand-in: a class hierarchy with tf_keras' module paths
(``tf_keras.src.engine.sequential.Sequential`` -> ``...functional.Functional`` -> ``...training.Model``) and the
attributes a compiled tf_keras model has that made tfaccel say "not compiled" (an ``optimizer``, no ``compiled``).
"""

import importlib.util

import keras
import numpy as np
import pytest

import tfaccel
from tfaccel.errors import ConfigError
from tfaccel.compat.keras_generation import keras2_flavour

X = np.zeros((8, 3), "float32")
Y = np.zeros((8, 2), "float32")
REAL_TF_KERAS = importlib.util.find_spec("tf_keras") is not None


def _stand_in():
    def cls(name, module, *bases):
        return type(name, bases or (object,), {"__module__": module})

    model_cls = cls("Model", "tf_keras.src.engine.training")
    functional = cls("Functional", "tf_keras.src.engine.functional", model_cls)
    sequential = cls("Sequential", "tf_keras.src.engine.sequential", functional)
    model = sequential()
    model.optimizer = cls("Adam", "tf_keras.src.optimizers.adam")()
    model.built = True
    return model


def _tf_keras_model():
    """A compiled tf_keras model: the real package when installed, else the stand-in."""
    if not REAL_TF_KERAS:
        return _stand_in()
    import tf_keras

    model = tf_keras.Sequential([tf_keras.Input((3,)), tf_keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    return model


EXPECTED = (r"fit: the model is a tf_keras \(Keras 2\) model \(tf_keras\.src\.engine\.sequential\.Sequential\); "
            r"tfaccel\.fit and compile_and_fit train Keras 3 models .* model\.fit inside `with "
            r"tfaccel\.get_strategy\(\)\.scope\(\):` .* unset TF_USE_LEGACY_KERAS")


def test_tfaccel_fit_names_a_tf_keras_model_and_what_to_do():
    with pytest.raises(ConfigError, match=EXPECTED):
        tfaccel.fit(_tf_keras_model(), X, Y, epochs=1)


def test_compile_and_fit_names_a_tf_keras_model_from_build_model():
    with pytest.raises(ConfigError, match=r"compile_and_fit: build_model: the model is a tf_keras \(Keras 2\) model"):
        tfaccel.compile_and_fit(_tf_keras_model, (X, Y), loss="mse", strategy="default")


def test_keras2_layouts_are_told_apart_from_keras3():
    assert keras2_flavour(_stand_in()) == "tf_keras (Keras 2)"
    old = type("Model", (), {"__module__": "keras.src.engine.training"})()  # Keras 2.13-2.15's own package
    assert keras2_flavour(old) == "Keras 2"
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    assert keras2_flavour(model) is None and keras2_flavour(keras.layers.Dense(2)) is None
    assert keras2_flavour(object()) is None
