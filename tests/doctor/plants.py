"""Tiny models with one planted cause of replica divergence each, for the doctor's tests and scripts."""

from typing import Any, Callable, Dict

import keras
import numpy as np
import tensorflow as tf


def data(n: int = 64) -> tuple:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 4)).astype("float32")
    return x, x.sum(axis=1, keepdims=True)


def dataset_fn(shard: bool, per_replica: bool = True, shuffle: bool = False) -> Callable[[Any], tf.data.Dataset]:
    """A ``dataset_fn(input_context)`` over :func:`data` in global batches of 16, sharded or not (the planted
    cause: every input pipeline then reads the same examples), batched per replica or (planted) by the global
    batch in every replica, with (planted) an unseeded shuffle or none."""
    x, y = data()

    def make(context: tf.distribute.InputContext) -> tf.data.Dataset:
        dataset = tf.data.Dataset.from_tensor_slices((x, y))
        if shard:
            dataset = dataset.shard(context.num_input_pipelines, context.input_pipeline_id)
        if shuffle:
            dataset = dataset.shuffle(64)  # no seed: each pipeline (each run) draws its own order
        return dataset.batch(context.get_per_replica_batch_size(16) if per_replica else 16)

    return make


def long_epoch(repeats: int = 300_000) -> tf.data.Dataset:
    """:func:`data` in batches of 16, repeated: an epoch of 4 * ``repeats`` steps, whose float32 metric counts pass
    2**24 examples within the epoch (a click log's day of examples)."""
    return tf.data.Dataset.from_tensor_slices(data()).batch(16).repeat(repeats)


def _mlp(*middle: Any, optimizer: Any = "sgd") -> keras.Model:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), *middle,
                              keras.layers.Dense(1)])
    model.compile(optimizer=optimizer, loss="mse", metrics=["mae"])
    return model


class Blowup(keras.layers.Layer):
    """Infinite outputs when the batch holds more than 8 examples: non-finite gradients on one path only."""

    def call(self, x: Any) -> Any:
        return x * tf.where(tf.shape(x)[0] > 8, float("inf"), 1.0)


class ScaledMetric(keras.Model):
    """keras-io's GAN pattern: a custom train_step feeds a Mean metric the value of a Keras Loss object."""

    def __init__(self) -> None:
        super().__init__()
        self.dense = keras.layers.Dense(1)
        self.loss_fn = keras.losses.MeanSquaredError()
        self.tracker = keras.metrics.Mean(name="loss")

    def call(self, x: Any) -> Any:
        return self.dense(x)

    @property
    def metrics(self) -> list:
        return [self.tracker]

    def train_step(self, batch: Any) -> Dict[str, Any]:
        x, y = batch
        with tf.GradientTape() as tape:
            loss = self.loss_fn(y, self(x, training=True))
        self.optimizer.apply_gradients(zip(tape.gradient(loss, self.trainable_variables), self.trainable_variables))
        self.tracker.update_state(loss)
        return {"loss": self.tracker.result()}


class PerReplicaMean(ScaledMetric):
    """A custom train_step whose loss is the mean over the replica's own batch, not the global batch."""

    def train_step(self, batch: Any) -> Dict[str, Any]:
        x, y = batch
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(y - self(x, training=True)))
        self.optimizer.apply_gradients(zip(tape.gradient(loss, self.trainable_variables), self.trainable_variables))
        self.tracker.update_state(loss)
        return {"loss": self.tracker.result()}


def _custom(cls: type) -> keras.Model:
    model = cls()
    model.compile(optimizer="sgd")
    return model


BUILDERS: Dict[str, Callable[[], keras.Model]] = {
    "none": _mlp,
    "batchnorm": lambda: _mlp(keras.layers.BatchNormalization()),
    "batchnorm_synchronized": lambda: _mlp(keras.layers.BatchNormalization(synchronized=True)),
    "dropout": lambda: _mlp(keras.layers.Dropout(0.3)),
    "loss_scale": lambda: _mlp(Blowup(), optimizer=keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD())),
    "scaled_metric": lambda: _custom(ScaledMetric),
    "per_replica_mean": lambda: _custom(PerReplicaMean),
}
