"""tfaccel's compiled loop trains exactly like Keras fit, and says when it cannot run."""

import logging

import numpy as np
import pytest

import tfaccel
from tfaccel.errors import ConfigError
from tfaccel.strategies.base import Backend
from tfaccel.train.api import _choose_steps_per_execution


def _build():
    import keras

    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"),
                             keras.layers.Dense(3, activation="softmax")])


def _data(n=70):  # 70 = 4 full batches of 16 + a partial batch of 6
    rng = np.random.default_rng(3)
    x = rng.standard_normal((n, 6)).astype("float32")
    return x, (x[:, 0] > 0).astype("int32") + (x[:, 1] > 0).astype("int32")


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_compiled_loop_matches_keras_fit(optimizer, clean_tf_config):
    x, y = _data()
    runs = {}
    for loop in ("keras", "compiled"):
        result = tfaccel.compile_and_fit(_build, (x, y), validation_data=(x[:20], y[:20]), epochs=3,
                                         global_batch_size=16, strategy="default", optimizer=optimizer,
                                         learning_rate=0.05, loss="sparse_categorical_crossentropy",
                                         metrics=["accuracy"], seed=5, shuffle=False, loop=loop, verbose=0)
        assert result.details["loop"].startswith("compiled" if loop == "compiled" else "keras")
        runs[loop] = result
    for a, b in zip(runs["keras"].model.get_weights(), runs["compiled"].model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
        np.testing.assert_allclose(runs["keras"].history[key], runs["compiled"].history[key], rtol=1e-4, atol=1e-5)


def test_auto_uses_keras_fit_with_the_reason_when_blocked(clean_tf_config):
    import keras

    class PerBatch(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            pass

    x, y = _data()
    result = tfaccel.compile_and_fit(_build, (x, y), epochs=1, global_batch_size=16, strategy="default",
                                     loss="sparse_categorical_crossentropy", callbacks=[PerBatch()], verbose=0)
    assert result.details["loop"] == "keras fit (callback PerBatch has per-batch hooks (on_train_batch_end))"


def test_compiled_loop_refused_where_it_cannot_run(clean_tf_config, cpu_replicas):
    x, y = _data()
    with pytest.raises(ConfigError, match=r"loop='compiled' cannot run this job: strategy mirrored with 2 replicas"):
        tfaccel.compile_and_fit(_build, (x, y), global_batch_size=16, strategy="mirrored",
                                loss="sparse_categorical_crossentropy", loop="compiled", verbose=0)


def test_unknown_loop(clean_tf_config):
    x, y = _data()
    with pytest.raises(ConfigError, match=r"loop: unknown value 'fast'; valid values are: 'auto', 'keras', 'compiled'"):
        tfaccel.compile_and_fit(_build, (x, y), loss="mse", loop="fast")


def test_multi_worker_steps_per_execution_falls_back_with_a_warning(caplog):
    import tensorflow as tf

    backend = Backend(name="multi_worker", strategy=tf.distribute.get_strategy())
    with caplog.at_level(logging.WARNING, logger="tfaccel"):
        logger = logging.getLogger("tfaccel")
        logger.propagate = True
        try:
            spe, reason = _choose_steps_per_execution(8, steps_per_epoch=20, backup_freq=None, backend=backend)
        finally:
            logger.propagate = False
    assert spe == 1 and "multi-step loop fails under MultiWorkerMirroredStrategy" in reason
    assert "steps_per_execution=8 cannot work here" in caplog.text


def test_auto_steps_per_execution_divides_backup_freq():
    import tensorflow as tf

    backend = Backend(name="default", strategy=tf.distribute.get_strategy())
    assert _choose_steps_per_execution("auto", steps_per_epoch=100, backup_freq=10, backend=backend)[0] == 10
    assert _choose_steps_per_execution("auto", steps_per_epoch=100, backup_freq=None, backend=backend)[0] == 64
    assert _choose_steps_per_execution("auto", steps_per_epoch=12, backup_freq=None, backend=backend)[0] == 12


@pytest.mark.parametrize("conv,requested,expected", [(True, "auto", False), (False, "auto", True),
                                                     (True, True, True), (True, False, False)])
def test_auto_xla_is_off_for_convolutions_on_cpu(conv, requested, expected, clean_tf_config):
    import keras

    from tfaccel.xla import CPU_CONV_NOTE

    def build():
        layers = [keras.Input((8, 8, 1))]
        layers += [keras.layers.Conv2D(4, 3)] if conv else []
        layers += [keras.layers.Flatten(), keras.layers.Dense(3, activation="softmax")]
        return keras.Sequential(layers)

    x = np.random.default_rng(0).random((32, 8, 8, 1), dtype=np.float32)
    y = np.arange(32) % 3
    result = tfaccel.compile_and_fit(build, (x, y), global_batch_size=16, strategy="default", jit_compile=requested,
                                     loss="sparse_categorical_crossentropy", verbose=0)
    assert result.plan.jit_compile is expected and result.model.jit_compile is expected
    assert (result.plan.jit_reason == CPU_CONV_NOTE) is (conv and requested == "auto")
