"""A Python generator under a strategy: Keras 3.15's fit builds the model from an iterator it throws away, whose
prefetching takes some of the generator's batches that training never sees (how many depends on timing).
tfaccel.compat.keras_mwms builds from the batches Keras' adapter had already read, so training starts at the
generator's first batch, as Keras on one device does."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfaccel
from tfaccel.compat import keras_mwms

STEPS, EPOCHS = 5, 2


class Numbered:
    """A generator of batches of 8 whose inputs are all the batch's number; ``trained`` lists, per replica step, the
    number of each batch the model trained on (read in ``train_step``)."""

    def __init__(self) -> None:
        self.trained: list = []

    def batches(self):
        number = 0
        while True:
            yield np.full((8, 4), number, "float32"), np.zeros((8, 1), "float32")
            number += 1

    def model(self) -> keras.Model:
        trained = self.trained

        class Recording(keras.Sequential):
            def train_step(self, data):
                tf.py_function(lambda x: trained.append(int(x.numpy()[0, 0])), [data[0]], [])
                return super().train_step(data)

        model = Recording([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        return model


@pytest.fixture
def fix_removed():
    was = keras_mwms.remove()
    yield
    keras_mwms.remove()
    if was:
        keras_mwms.apply(force=True)


def test_plain_keras_under_a_strategy_skips_some_of_a_generator_s_batches(fix_removed, cpu_replicas):
    data = Numbered()
    with tf.distribute.MirroredStrategy(cpu_replicas, cross_device_ops=tf.distribute.ReductionToOneDevice()).scope():
        model = data.model()
    model.fit(data.batches(), steps_per_epoch=STEPS, epochs=1, verbose=0)
    # batches 0 and 1 (the adapter peeked them and yields them again), then a jump: the thrown-away iterator took some
    assert sorted(set(data.trained))[:2] == [0, 1] and max(data.trained) > STEPS - 1, data.trained


@pytest.mark.parametrize("strategy", ["mirrored", "one_device"])
def test_tfaccel_trains_a_generator_from_its_first_batch(strategy, clean_tf_config, cpu_replicas):
    data = Numbered()
    with tfaccel.scope(strategy=strategy):
        model = data.model()
    result = tfaccel.fit(model, data.batches(), steps_per_epoch=STEPS, epochs=EPOCHS, verbose=0)
    replicas = model.distribute_strategy.num_replicas_in_sync
    assert sorted(data.trained) == sorted(list(range(STEPS * EPOCHS)) * replicas), data.trained
    assert keras_mwms.NAME in result.details["generator_batches"]


def test_without_a_strategy_nothing_is_needed(clean_tf_config):
    data = Numbered()
    with tfaccel.scope(strategy="default"):
        model = data.model()
    result = tfaccel.fit(model, data.batches(), steps_per_epoch=STEPS, epochs=1, verbose=0)
    assert data.trained == list(range(STEPS)) and "generator_batches" not in result.details
