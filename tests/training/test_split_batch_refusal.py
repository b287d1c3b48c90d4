"""A ``train_step`` whose batch's axis 0 is not examples (keras-io's metric learning) is refused before training
under several replicas, saying what, why and the fix; before, it ended in Keras' raw input-shape error."""

import numpy as np
import pytest

import tfaccel
from tfaccel.compat.keras_mwms import split_batch_refusal
from tfaccel.errors import ConfigError


def _anchor_positive_model():
    import keras
    import tensorflow as tf

    class Pairs(keras.utils.PyDataset):  # axis 0: (anchors, positives) of 4 classes
        def __len__(self):
            return 2

        def __getitem__(self, idx):
            return np.ones((2, 4, 3), "float32")

    class Embedding(keras.Model):
        def train_step(self, data):
            data = data[0] if isinstance(data, tuple) else data  # as keras-io's example
            anchors, positives = data[0], data[1]
            with tf.GradientTape() as tape:
                similarities = keras.ops.einsum("ae,pe->ap", self(anchors), self(positives))
                loss = self.compute_loss(y=keras.ops.arange(4), y_pred=similarities)
            grads = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
            return {"loss": loss}

    inputs = keras.Input((3,))
    model = Embedding(inputs, keras.layers.Dense(4)(inputs))
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model, Pairs()


def test_metric_learnings_batches_are_refused_under_mirrored(clean_tf_config, cpu_replicas):
    with tfaccel.scope(strategy="mirrored"):
        model, pairs = _anchor_positive_model()
    before = [w.numpy().copy() for w in model.weights]
    with pytest.raises(ConfigError, match=r"fit: Embedding has its own train_step, and under 2 replicas every batch is "
                                          r"split along axis 0 \(one replica's share here: \(1, 4, 3\)\).*Fix: give "
                                          r"every input its examples on axis 0.*strategy=\"default\"\)$"):
        tfaccel.fit(model, pairs, epochs=1, verbose=0)
    assert all(np.array_equal(a, w.numpy()) for a, w in zip(before, model.weights))  # nothing trained


def test_one_replica_is_not_refused(clean_tf_config):
    import tensorflow as tf

    with tfaccel.scope(strategy="default"):
        model, pairs = _anchor_positive_model()
    assert split_batch_refusal(model, tf.distribute.get_strategy(), np.ones((2, 4, 3)), ValueError("x")) is None
    result = tfaccel.fit(model, pairs, epochs=1, verbose=0)
    assert len(result.history["loss"]) == 1
