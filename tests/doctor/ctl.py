"""A custom training loop in TensorFlow's tutorial's shape, for tfaccel doctor's test: `python ctl.py scaled` (the
loss divided by the global batch: tf.nn.compute_average_loss) or `python ctl.py unscaled` (planted: the mean over
each replica's own part of the batch). The strategy is the one the script runs under."""

import sys

import keras
import plants
import tensorflow as tf

GLOBAL_BATCH = 16
scaled = (sys.argv[1] if len(sys.argv) > 1 else "scaled") == "scaled"
strategy = tf.distribute.get_strategy()
x, y = plants.data()
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    optimizer = keras.optimizers.SGD(0.01)
loss_object = keras.losses.MeanSquaredError(reduction=None)


def step(batch):
    features, labels = batch
    with tf.GradientTape() as tape:
        per_example = loss_object(labels, model(features, training=True))
        loss = (tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH) if scaled
                else tf.reduce_mean(per_example))
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return loss


@tf.function
def train(batch):
    return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step, args=(batch,)), axis=None)


dataset = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH))
for batch in dataset:
    train(batch)
