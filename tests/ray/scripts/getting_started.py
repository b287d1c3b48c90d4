"""Ray Train's TensorFlow getting-started flow (docs.ray.io, "Get Started with Distributed Training using
TensorFlow/Keras"), unchanged except for the strategy line and synthetic data instead of the MNIST download.

    python getting_started.py ADDRESS OUT_DIR [flow]

flow "ray_doc" (default): the doc's train_func with `tfaccel.get_strategy("multi_worker")`;
flow "tfaccel": tfaccel.compile_and_fit in the train function (strategy "auto" from Ray's TF_CONFIG), no Ray
code: tfaccel.fit reports to Ray Train itself, so Ray's Result holds the metrics.
Each worker saves its final weights to OUT_DIR/<flow>-<rank>.npz; the driver prints one JSON line.
"""

import json
import sys

import numpy as np
import ray
import tensorflow as tf
from ray.train import RunConfig, ScalingConfig
from ray.train.tensorflow import TensorflowTrainer

import tfaccel

ADDRESS, OUT, FLOW = sys.argv[1], sys.argv[2], (sys.argv[3] if len(sys.argv) > 3 else "ray_doc")


def mnist_dataset(batch_size):
    rng = np.random.default_rng(0)  # stands in for tf.keras.datasets.mnist.load_data() (no download here)
    x_train = rng.integers(0, 255, size=(512, 28, 28)).astype(np.float32) / np.float32(255)
    y_train = rng.integers(0, 10, size=(512,)).astype(np.int64)
    train_dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(512, seed=0).repeat().batch(
        batch_size)
    return train_dataset


def build_cnn_model():
    import keras

    model = keras.Sequential([
        keras.Input(shape=(28, 28)),
        keras.layers.Reshape(target_shape=(28, 28, 1)),
        keras.layers.Conv2D(4, 3, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(10),
    ])
    return model


def train_func(config: dict):
    import keras

    per_worker_batch_size = config.get("batch_size", 64)
    epochs = config.get("epochs", 3)
    steps_per_epoch = config.get("steps_per_epoch", 70)

    num_workers = ray.train.get_context().get_world_size()

    strategy = tfaccel.get_strategy("multi_worker")  # was: tf.distribute.MultiWorkerMirroredStrategy()

    global_batch_size = per_worker_batch_size * num_workers
    multi_worker_dataset = mnist_dataset(global_batch_size)

    with strategy.scope():
        # Model building/compiling need to be within `strategy.scope()`.
        multi_worker_model = build_cnn_model()
        learning_rate = config.get("lr", 0.001)
        multi_worker_model.compile(
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            optimizer=keras.optimizers.SGD(learning_rate=learning_rate),
            metrics=["accuracy"],
        )

    history = multi_worker_model.fit(multi_worker_dataset, epochs=epochs, steps_per_epoch=steps_per_epoch,
                                     verbose=0)
    rank = ray.train.get_context().get_world_rank()
    np.savez(f"{config['out']}/ray_doc-{rank}.npz", *multi_worker_model.get_weights())
    return history.history


def tfaccel_func(config: dict):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)

    def build():
        import keras

        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])

    # No Ray code: tfaccel.fit reports every epoch to Ray Train by itself (report_callbacks, after the checkpoint).
    result = tfaccel.compile_and_fit(build, (x, y), epochs=2, global_batch_size=32, loss="mse", seed=1, verbose=0)
    rank = ray.train.get_context().get_world_rank()
    np.savez(f"{config['out']}/tfaccel-{rank}.npz", *result.model.get_weights())
    assert result.plan.strategy == "multi_worker", result.plan.strategy


def train_tensorflow_mnist(num_workers=2, use_gpu=False, epochs=2):
    func = train_func if FLOW == "ray_doc" else tfaccel_func
    config = {"lr": 1e-3, "batch_size": 32, "epochs": epochs, "steps_per_epoch": 8, "out": OUT}
    scaling_config = ScalingConfig(num_workers=num_workers, use_gpu=use_gpu)
    trainer = TensorflowTrainer(train_loop_per_worker=func, train_loop_config=config, scaling_config=scaling_config,
                                run_config=RunConfig(storage_path=f"{OUT}/storage", name=FLOW))
    results = trainer.fit()
    return results


if __name__ == "__main__":
    ray.init(address=ADDRESS)
    result = train_tensorflow_mnist()
    print(json.dumps({"flow": FLOW, "metrics": result.metrics, "error": str(result.error) if result.error else None,
                      "checkpoint": result.checkpoint.path if result.checkpoint else None}), flush=True)
    ray.shutdown()
