"""tfaccel.compat.keras_internals: each accessor of a Keras / TensorFlow internal still finds it and still does what
tfaccel relies on (Keras 3.15.1, TensorFlow 2.21.0). A failure here after an upgrade names the internal that moved."""

import numpy as np
import pytest

from tfaccel.compat import keras_internals


def _model():
    import keras

    inner = keras.Sequential([keras.layers.Dense(2)], name="inner")
    model = keras.Sequential([keras.Input((3,)), inner, keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    return model


def test_versions_checked_are_named():
    assert set(keras_internals.CHECKED_ON) == {"keras", "tensorflow"}


def test_train_validation_split_takes_the_last_fraction():
    x, y = np.arange(10).reshape(10, 1), np.arange(10)
    (tx, ty, tsw), (vx, vy, vsw) = keras_internals.train_validation_split((x, y, None), 0.2)
    assert tx.shape[0] == 8 and vy.tolist() == [8, 9] and tsw is None and vsw is None


def test_class_weight_to_sample_weights():
    weights = keras_internals.class_weight_to_sample_weights(np.array([0, 1, 1]), {0: 1.0, 1: 3.0})
    assert np.asarray(weights).tolist() == [1.0, 3.0, 3.0]


def test_reduce_per_replica_under_the_default_strategy():
    import tensorflow as tf

    out = keras_internals.reduce_per_replica({"loss": tf.constant(2.0)}, tf.distribute.get_strategy())
    assert float(out["loss"]) == 2.0


def test_symbolic_build_loss_tracker_and_flatten_layers():
    model = _model()
    keras_internals.symbolic_build(model, (np.zeros((2, 3), "float32"), np.zeros((2, 1), "float32")))
    assert model.compiled_metrics is not None or model.metrics  # the compiled metrics exist now
    tracker = keras_internals.loss_tracker(model)
    assert tracker is not None and type(tracker).__name__ == "Mean"
    names = [layer.name for layer in keras_internals.flatten_layers(model)]
    assert "inner" in names and len(names) >= 4  # the model, the nested model and its layer, the last Dense


def test_per_worker_value_reads_the_workers_values():
    import tensorflow as tf

    class Remote(tf.distribute.experimental.coordinator.RemoteValue):  # a worker's value, without a cluster
        def __init__(self, value):
            self.value = value

    remotes = (Remote("a"), Remote("b"))
    values = tf.distribute.experimental.coordinator.PerWorkerValues(remotes)
    assert keras_internals.per_worker_value(values, 1) is remotes[1]


def test_maybe_merge_call_runs_in_cross_replica_context():
    import tensorflow as tf

    seen = []

    def fn(distribution, value):
        seen.append((distribution is tf.distribute.get_strategy(), value))

    keras_internals.maybe_merge_call(fn, tf.distribute.get_strategy(), 7)
    assert seen == [(True, 7)]


def test_load_cifar_batch_parses_keras_format(tmp_path):
    import pickle

    path = tmp_path / "data_batch_1"
    data = np.arange(2 * 3072, dtype=np.uint8).reshape(2, 3072)
    with open(path, "wb") as f:
        pickle.dump({b"data": data, b"labels": [3, 5]}, f)
    images, labels = keras_internals.load_cifar_batch(str(path))
    assert np.asarray(images).shape == (2, 3, 32, 32) and list(labels) == [3, 5]


def test_optimizer_strategy_and_learning_rate_or_schedule():
    import keras
    import tensorflow as tf

    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5)
    scheduled, plain = keras.optimizers.SGD(learning_rate=schedule), keras.optimizers.SGD(learning_rate=0.25)
    assert keras_internals.optimizer_strategy(plain) is tf.distribute.get_strategy()
    assert keras_internals.learning_rate_or_schedule(scheduled) is schedule
    assert float(keras_internals.learning_rate_or_schedule(plain).numpy()) == 0.25


def test_model_strategy_is_the_one_the_model_was_created_under():
    import tensorflow as tf

    assert keras_internals.model_strategy(_model()) is None
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        assert keras_internals.model_strategy(_model()) is strategy


def test_backup_and_restore_epoch(tmp_path):
    """Keras' BackupAndRestore tells the model where an interrupted fit resumes; tfaccel's epoch driver reads it."""
    import keras

    model, seen = _model(), []
    assert keras_internals.backup_and_restore_epoch(model) is None

    class Interrupt(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise RuntimeError("interrupted")

    class Record(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            seen.append(keras_internals.backup_and_restore_epoch(self.model))

    x, y = np.zeros((4, 3), "float32"), np.zeros((4, 1), "float32")
    backup = keras.callbacks.BackupAndRestore(str(tmp_path))
    with pytest.raises(RuntimeError, match="interrupted"):
        model.fit(x, y, epochs=3, verbose=0, callbacks=[backup, Interrupt()])
    model.fit(x, y, epochs=3, verbose=0, callbacks=[backup, Record()])
    assert seen == [1]


def test_global_random_seed_reads_what_set_random_seed_set():
    import keras

    keras.utils.set_random_seed(11)
    assert keras_internals.global_random_seed() == 11
