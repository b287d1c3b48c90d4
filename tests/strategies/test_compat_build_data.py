"""The data under a strategy: Keras 3.15's fit builds the model from an iterator it throws away. Its prefetching
takes some of a Python generator's batches that training never sees (how many depends on timing), and over a
seeded shuffled tf.data.Dataset it draws one of the dataset's orders, so the epochs train on other orders than
Keras on one device (one device: the 1st and 3rd of the dataset's orders; mirrored: the 2nd and 4th).
tfaccel.compat.keras_mwms builds from the dataset's spec, or from the batches Keras' adapter had already read, so
training sees what Keras on one device sees."""

from typing import Any, Callable, Optional

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
    assert keras_mwms.NAME in result.details["build_data"]


def test_without_a_strategy_nothing_is_needed(clean_tf_config):
    data = Numbered()
    with tfaccel.scope(strategy="default"):
        model = data.model()
    result = tfaccel.fit(model, data.batches(), steps_per_epoch=STEPS, epochs=1, verbose=0)
    assert data.trained == list(range(STEPS)) and "build_data" not in result.details


class Quarters(keras.utils.PyDataset):
    """``x`` in 4 batches, its targets zeros."""

    def __init__(self, x: np.ndarray) -> None:
        super().__init__()
        self.x = x

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> tuple:
        part = self.x[4 * i:4 * i + 4]
        return part, np.zeros_like(part)


def shuffled_steps(strategy: Any = None, *, fit: Optional[Callable] = None, data: str = "dataset") -> list:
    """The examples of each training step (both replicas' parts together) of 2 epochs over 16 numbered examples in
    batches of 4, under ``strategy`` (a ``tf.distribute`` strategy or a tfaccel name): ``data`` "dataset" is
    ``dataset.shuffle(16, seed=0).batch(4)``, "py_dataset" a ``PyDataset`` that Keras shuffles (seeds set to 0)."""
    parts: list = []

    class Recording(keras.Sequential):
        def train_step(self, data):
            tf.py_function(lambda x: parts.append(sorted(int(v) for v in x.numpy()[:, 0])), [data[0]], [])
            return super().train_step(data)

    def build() -> keras.Model:
        model = Recording([keras.Input((1,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        return model

    if isinstance(strategy, str):
        scope = tfaccel.scope(strategy=strategy)
    else:
        scope = (strategy or tf.distribute.get_strategy()).scope()
    with scope:
        model = build()
    x = np.arange(16, dtype="float32")[:, None]
    if data == "dataset":
        dataset = tf.data.Dataset.from_tensor_slices((x, np.zeros_like(x))).shuffle(16, seed=0).batch(4)
    else:
        keras.utils.set_random_seed(0)
        dataset = Quarters(x)
    if fit is None:
        model.fit(dataset, epochs=2, verbose=0)
    else:
        fit(model, dataset, epochs=2, verbose=0)
    per_step = model.distribute_strategy.num_replicas_in_sync
    return [sorted(sum(parts[i:i + per_step], [])) for i in range(0, len(parts), per_step)]


def test_plain_keras_under_a_strategy_trains_other_shuffled_orders(fix_removed, cpu_replicas):
    one_device = shuffled_steps()
    mirrored = shuffled_steps(tf.distribute.MirroredStrategy(cpu_replicas,
                                                             cross_device_ops=tf.distribute.ReductionToOneDevice()))
    assert len(mirrored) == len(one_device) == 8 and mirrored[:4] != one_device[:4], (mirrored, one_device)


@pytest.mark.parametrize("data", ["dataset", "py_dataset"])
@pytest.mark.parametrize("strategy", ["mirrored", "one_device"])
def test_tfaccel_trains_a_seeded_shuffle_in_one_device_s_order(strategy, data, clean_tf_config, cpu_replicas):
    results = []
    steps = shuffled_steps(strategy, data=data,
                           fit=lambda model, batches, **kw: results.append(tfaccel.fit(model, batches, **kw)))
    assert steps == shuffled_steps(data=data), steps
    assert keras_mwms.NAME in results[0].details["build_data"]
