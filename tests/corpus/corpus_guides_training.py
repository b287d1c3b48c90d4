"""keras-io guides on training with the built-in loop (transfer learning, losses, metrics, callbacks, saving,
precision) as corpus cases: see corpus_registry."""

from typing import Any, List

import numpy as np

from corpus_registry import SEED, Runner, case, classes, images, rng, seed_weights

BUILT_IN = "guides/training_with_built_in_methods.py"
CALLBACKS = "guides/writing_your_own_callbacks.py"
TRANSFER = "guides/transfer_learning.py"


@case("transfer learning: frozen base, then fine-tuning after a recompile", TRANSFER,
      "a frozen base called with training=False (BatchNorm in inference mode), seeded augmentation layers, then "
      "base.trainable = True and a second compile inside the scope: both fits train as fit does")
def transfer_learning(run: Runner) -> Any:
    """"An end-to-end example: fine-tuning an image classification model on a cats vs. dogs dataset".
    Adaptation: a 2-block conv base with BatchNormalization stands in for ImageNet Xception (weights from the
    seeded generator, nothing downloaded); 64 generated 32x32x3 images in [0, 255) and 32 for validation
    (Datasets of batch 16, not cats vs dogs); RandomFlip / RandomRotation(0.1) seeded, in the model (the guide
    maps them over the dataset); 2 epochs, then 1 epoch of fine-tuning."""
    import keras
    import tensorflow as tf
    from keras import layers

    x, y = images(96, 32, 3, 2)
    x, y = x * 255.0, y.astype("float32")[:, None]
    train_ds = tf.data.Dataset.from_tensor_slices((x[:64], y[:64])).batch(16)
    validation_ds = tf.data.Dataset.from_tensor_slices((x[64:], y[64:])).batch(16)
    with run.scope():
        base_model = keras.Sequential([
            keras.Input((32, 32, 3)), layers.Conv2D(8, 3, strides=2), layers.BatchNormalization(),
            layers.Activation("relu"), layers.Conv2D(16, 3, strides=2), layers.BatchNormalization(),
            layers.Activation("relu")], name="base")
        seed_weights(base_model)  # its "pretrained" weights
        base_model.trainable = False
        data_augmentation = keras.Sequential([layers.RandomFlip("horizontal", seed=SEED),
                                              layers.RandomRotation(0.1, seed=SEED)])
        inputs = keras.Input(shape=(32, 32, 3))
        h = layers.Rescaling(scale=1 / 127.5, offset=-1)(data_augmentation(inputs))
        h = base_model(h, training=False)
        h = layers.Dropout(0.2, seed=SEED)(layers.GlobalAveragePooling2D()(h))
        model = keras.Model(inputs, layers.Dense(1)(h))
        model.compile(optimizer=keras.optimizers.Adam(), loss=keras.losses.BinaryCrossentropy(from_logits=True),
                      metrics=[keras.metrics.BinaryAccuracy()])
    run.fit(model, train_ds, epochs=2, validation_data=validation_ds)
    with run.scope():
        base_model.trainable = True
        model.compile(optimizer=keras.optimizers.Adam(1e-5), loss=keras.losses.BinaryCrossentropy(from_logits=True),
                      metrics=[keras.metrics.BinaryAccuracy()])
    run.fit(model, train_ds, epochs=1, validation_data=validation_ds)
    return model


@case("multi-input multi-output with loss, metric and loss-weight dicts", BUILT_IN,
      "an image and a timeseries input, two outputs with a loss, metrics and a loss weight each (dicts by output "
      "name), trained from dicts of arrays")
def built_in_multi_io(run: Runner) -> Any:
    """"Passing data to multi-input, multi-output models". Adaptation: 64 generated examples (32x32x3 images,
    20x10 series), 2 epochs of batch 16 (the guide: 1 epoch of batch 32)."""
    import keras
    from keras import layers

    g = rng()
    img_data, ts_data = g.random((64, 32, 32, 3)).astype("float32"), g.random((64, 20, 10)).astype("float32")
    score_targets, class_targets = g.random((64, 1)).astype("float32"), g.random((64, 5)).astype("float32")
    with run.scope():
        image_input = keras.Input(shape=(32, 32, 3), name="img_input")
        timeseries_input = keras.Input(shape=(None, 10), name="ts_input")
        x1 = layers.GlobalMaxPooling2D()(layers.Conv2D(3, 3)(image_input))
        x2 = layers.GlobalMaxPooling1D()(layers.Conv1D(3, 3)(timeseries_input))
        h = layers.concatenate([x1, x2])
        model = keras.Model(inputs=[image_input, timeseries_input],
                            outputs=[layers.Dense(1, name="score_output")(h),
                                     layers.Dense(5, name="class_output")(h)])
        model.compile(optimizer=keras.optimizers.RMSprop(1e-3),
                      loss={"score_output": keras.losses.MeanSquaredError(),
                            "class_output": keras.losses.CategoricalCrossentropy()},
                      metrics={"score_output": [keras.metrics.MeanAbsolutePercentageError(),
                                                keras.metrics.MeanAbsoluteError()],
                               "class_output": [keras.metrics.CategoricalAccuracy()]},
                      loss_weights={"score_output": 2.0, "class_output": 1.0})
    seed_weights(model)
    run.fit(model, {"img_input": img_data, "ts_input": ts_data},
            {"score_output": score_targets, "class_output": class_targets}, batch_size=16, epochs=2)
    return model


def _uncompiled_model() -> Any:
    import keras
    from keras import layers

    inputs = keras.Input(shape=(784,), name="digits")
    h = layers.Dense(64, activation="relu", name="dense_1")(inputs)
    h = layers.Dense(64, activation="relu", name="dense_2")(h)
    return keras.Model(inputs=inputs, outputs=layers.Dense(10, activation="softmax", name="predictions")(h))


@case("custom Loss subclass and custom Metric subclass", BUILT_IN,
      "a keras.losses.Loss subclass with a regularisation factor and a keras.metrics.Metric subclass with its own "
      "state variable train and report as in fit")
def built_in_custom_loss_metric(run: Runner) -> Any:
    """"Custom losses" (CustomMSE) and "Custom metrics" (CategoricalTruePositives, here on the one-hot targets'
    argmax). Adaptation: 96 generated 784-feature examples (not MNIST), 2 epochs of batch 32."""
    import keras
    from keras import ops

    class CustomMSE(keras.losses.Loss):
        def __init__(self, regularization_factor: float = 0.1, name: str = "custom_mse") -> None:
            super().__init__(name=name)
            self.regularization_factor = regularization_factor

        def call(self, y_true: Any, y_pred: Any) -> Any:
            mse = ops.mean(ops.square(y_true - y_pred), axis=-1)
            reg = ops.mean(ops.square(0.5 - y_pred), axis=-1)
            return mse + reg * self.regularization_factor

    class CategoricalTruePositives(keras.metrics.Metric):
        def __init__(self, name: str = "categorical_true_positives", **kwargs: Any) -> None:
            super().__init__(name=name, **kwargs)
            self.true_positives = self.add_variable(shape=(), name="ctp", initializer="zeros")

        def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
            y_pred = ops.reshape(ops.argmax(y_pred, axis=1), (-1, 1))
            values = ops.cast(ops.reshape(ops.argmax(y_true, axis=1), (-1, 1)) == y_pred, "float32")
            if sample_weight is not None:
                values = ops.multiply(values, ops.cast(sample_weight, "float32"))
            self.true_positives.assign_add(ops.sum(values))

        def result(self) -> Any:
            return self.true_positives

        def reset_state(self) -> None:
            self.true_positives.assign(0.0)

    x, y = classes(96, 784, 10)
    with run.scope():
        model = _uncompiled_model()
        model.compile(optimizer=keras.optimizers.Adam(), loss=CustomMSE(), metrics=[CategoricalTruePositives()])
    seed_weights(model)
    run.fit(model, x, np.eye(10, dtype="float32")[y], batch_size=32, epochs=2)
    return model


@case("class_weight", BUILT_IN, "class_weight weighs the loss and the metrics per class as in fit")
def built_in_class_weight(run: Runner) -> Any:
    """"Class weights": class 5 weighs 2.0. Adaptation: 96 generated 784-feature examples (not MNIST), 2 epochs
    of batch 32 (the guide: 1 epoch of batch 64)."""
    import keras

    x, y = classes(96, 784, 10)
    with run.scope():
        model = _uncompiled_model()
        model.compile(optimizer=keras.optimizers.RMSprop(learning_rate=1e-3),
                      loss="sparse_categorical_crossentropy", metrics=["sparse_categorical_accuracy"])
    seed_weights(model)
    class_weight = {i: (2.0 if i == 5 else 1.0) for i in range(10)}
    run.fit(model, x, y, class_weight=class_weight, batch_size=32, epochs=2)
    return model


@case("EarlyStopping, ModelCheckpoint(save_best_only), ExponentialDecay", BUILT_IN,
      "Keras' callbacks stop and write the same epochs' files, with an LR schedule, and a validation_split")
def built_in_callbacks(run: Runner) -> Any:
    """"Using callbacks", "Checkpointing models" and "Using learning rate schedules". Adaptation: 96 generated
    784-feature examples, at most 4 epochs of batch 32 (the guide: 20 of 64), min_delta 0.05, decay_steps 2."""
    import keras

    x, y = classes(96, 784, 10)
    lr_schedule = keras.optimizers.schedules.ExponentialDecay(0.01, decay_steps=2, decay_rate=0.96, staircase=True)
    with run.scope():
        model = _uncompiled_model()
        model.compile(optimizer=keras.optimizers.RMSprop(learning_rate=lr_schedule),
                      loss="sparse_categorical_crossentropy", metrics=["sparse_categorical_accuracy"])
    seed_weights(model)
    callbacks = [keras.callbacks.EarlyStopping(monitor="val_loss", min_delta=5e-2, patience=1, verbose=0),
                 keras.callbacks.ModelCheckpoint(filepath=run.path("mymodel_{epoch}.keras"), save_best_only=True,
                                                 monitor="val_loss", verbose=0)]
    run.fit(model, x, y, epochs=4, batch_size=32, callbacks=callbacks, validation_split=0.25)
    return model


def _logging_callback(lines: List[str]) -> Any:
    import keras

    class LossAndErrorPrintingCallback(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            lines.append(f"batch {batch}: loss {logs['loss']:7.4f}")

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            lines.append(f"epoch {epoch}: loss {logs['loss']:7.4f}, mae {logs['mean_absolute_error']:7.4f}")

    return LossAndErrorPrintingCallback()


def _callback_model(run: Runner) -> Any:
    import keras

    with run.scope():
        model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.RMSprop(learning_rate=0.1), loss="mean_squared_error",
                      metrics=["mean_absolute_error"])
    return seed_weights(model)


def _callback_data() -> tuple:
    x, y = classes(160, 784, 10)
    return x / 4.0, y.astype("float32")


@case("own callbacks: EarlyStoppingAtMinLoss (get/set_weights, stop_training), batch logging, steps_per_epoch",
      CALLBACKS, "a callback that reads and restores the model's weights and stops training, one with per-batch "
      "hooks (their log lines compared), and steps_per_epoch over arrays",
      refuses={"multi_worker": "cannot keep a fixed example order; leave steps_per_epoch unset"})
def callbacks_early_stopping_at_min_loss(run: Runner) -> Any:
    """"Early stopping at minimum loss" with LossAndErrorPrintingCallback. Adaptation: 160 generated 784-feature
    examples (not MNIST) scaled by 1/4, batch 16, steps_per_epoch 5, at most 8 epochs (the guide: 30); the
    callback's print lines are collected and compared."""
    import keras

    class EarlyStoppingAtMinLoss(keras.callbacks.Callback):
        def __init__(self, patience: int = 0) -> None:
            super().__init__()
            self.patience, self.best_weights = patience, None

        def on_train_begin(self, logs: Any = None) -> None:
            self.wait, self.stopped_epoch, self.best = 0, 0, np.inf

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            current = logs.get("loss")
            if np.less(current, self.best):
                self.best, self.wait = current, 0
                self.best_weights = self.model.get_weights()
            else:
                self.wait += 1
                if self.wait >= self.patience:
                    self.stopped_epoch = epoch
                    self.model.stop_training = True
                    self.model.set_weights(self.best_weights)

    lines: List[str] = []
    model = _callback_model(run)
    run.fit(model, *_callback_data(), batch_size=16, steps_per_epoch=5, epochs=8,
            callbacks=[_logging_callback(lines), EarlyStoppingAtMinLoss()])
    run.extras["log_lines"] = lines
    return model


@case("own callback: CustomLearningRateScheduler (sets optimizer.learning_rate)", CALLBACKS,
      "a callback that assigns the optimizer's learning rate at each epoch's start changes training as in fit")
def callbacks_lr_scheduler(run: Runner) -> Any:
    """"Learning rate scheduling". Adaptation: 160 generated 784-feature examples scaled by 1/4, batch 32,
    4 epochs with the schedule's epochs 3/6/9/12 moved to 1/2/3/4 (the guide: 15 epochs)."""
    import keras

    class CustomLearningRateScheduler(keras.callbacks.Callback):
        def __init__(self, schedule: Any) -> None:
            super().__init__()
            self.schedule = schedule

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            lr = self.model.optimizer.learning_rate
            self.model.optimizer.learning_rate = self.schedule(epoch, lr)

    schedule = [(1, 0.05), (2, 0.01), (3, 0.005), (4, 0.001)]

    def lr_schedule(epoch: int, lr: Any) -> Any:
        if epoch < schedule[0][0] or epoch > schedule[-1][0]:
            return lr
        for when, value in schedule:
            if epoch == when:
                return value
        return lr

    model = _callback_model(run)
    run.fit(model, *_callback_data(), batch_size=32, epochs=4, callbacks=[CustomLearningRateScheduler(lr_schedule)])
    return model


@case("save to .keras, load_model inside the scope, resume training", "guides/serialization_and_saving.py",
      "a model with a registered custom layer, saved after one fit and loaded with its compiled optimizer state "
      "inside the scope, resumes training as it does in plain Keras")
def save_and_load(run: Runner) -> Any:
    """"Saving" (model.save / keras.models.load_model, "the reconstructed model is already compiled and has
    retained the optimizer state") with a custom layer registered by register_keras_serializable. Adaptation:
    64 generated 32-feature examples, 1 epoch of batch 16 before saving and 1 after loading."""
    import keras

    @keras.saving.register_keras_serializable(package="corpus")
    class CustomLayer(keras.layers.Layer):
        def __init__(self, factor: float, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.factor = factor

        def call(self, x: Any) -> Any:
            return x * self.factor

        def get_config(self) -> dict:
            return {**super().get_config(), "factor": self.factor}

    g = rng()
    test_input, test_target = g.random((64, 32)).astype("float32"), g.random((64, 1)).astype("float32")
    with run.scope():
        inputs = keras.Input(shape=(32,))
        model = keras.Model(inputs, keras.layers.Dense(1)(CustomLayer(0.5)(inputs)))
        model.compile(optimizer=keras.optimizers.Adam(), loss="mean_squared_error")
    seed_weights(model)
    run.fit(model, test_input, test_target, batch_size=16)
    model.save(run.path("my_model.keras"))
    with run.scope():
        reconstructed_model = keras.models.load_model(run.path("my_model.keras"))
    run.fit(reconstructed_model, test_input, test_target, batch_size=16)
    return reconstructed_model


@case("mixed precision: set_global_policy('mixed_float16') before the scope", "templates/api/mixed_precision/index.md",
      "the user's global dtype policy stands: float16 compute, float32 variables, a LossScaleOptimizer, as in fit")
def mixed_precision(run: Runner) -> Any:
    """Keras' mixed precision API page: keras.mixed_precision.set_global_policy("mixed_float16"), the output
    layer's softmax in float32 (dtype="float32"). Adaptation: an MLP 784-64-10 on 96 generated examples,
    2 epochs of batch 32; the global policy is set back to float32 after the case."""
    import keras
    from keras import layers

    x, y = classes(96, 784, 10)
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        with run.scope():
            inputs = keras.Input(shape=(784,))
            h = layers.Dense(64, activation="relu")(inputs)
            outputs = layers.Activation("softmax", dtype="float32")(layers.Dense(10)(h))
            model = keras.Model(inputs, outputs)
            model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy",
                          metrics=["accuracy"])
        seed_weights(model)
        run.extras["compute_dtype"] = model.layers[1].compute_dtype
        run.extras["optimizer"] = type(model.optimizer).__name__
        run.fit(model, x, y, batch_size=32, epochs=2)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return model


@case("convnet with ModelCheckpoint per epoch and EarlyStopping", "guides/intro_to_keras_for_engineers.py",
      "a Sequential convnet with Dropout, a checkpoint file per epoch and early stopping on val_loss")
def intro_convnet(run: Runner) -> Any:
    """"Training the model": the MNIST convnet. Adaptation: 64 generated 16x16x1 images (not MNIST), filters
    8/8/16/16 (not 64/64/128/128), 2 epochs of batch 16, validation_split 0.25 (the guide: 0.15)."""
    import keras
    from keras import layers

    x, y = images(64, 16, 1, 10)
    with run.scope():
        model = keras.Sequential([
            layers.Input(shape=(16, 16, 1)),
            layers.Conv2D(8, kernel_size=(3, 3), activation="relu"),
            layers.Conv2D(8, kernel_size=(3, 3), activation="relu"),
            layers.MaxPooling2D(pool_size=(2, 2)),
            layers.Conv2D(16, kernel_size=(3, 3), activation="relu"),
            layers.Conv2D(16, kernel_size=(3, 3), activation="relu"),
            layers.GlobalAveragePooling2D(),
            layers.Dropout(0.5, seed=SEED),
            layers.Dense(10, activation="softmax")])
        model.compile(loss=keras.losses.SparseCategoricalCrossentropy(),
                      optimizer=keras.optimizers.Adam(learning_rate=1e-3),
                      metrics=[keras.metrics.SparseCategoricalAccuracy(name="acc")])
    seed_weights(model)
    callbacks = [keras.callbacks.ModelCheckpoint(filepath=run.path("model_at_epoch_{epoch}.keras")),
                 keras.callbacks.EarlyStopping(monitor="val_loss", patience=2)]
    run.fit(model, x, y, batch_size=16, epochs=2, validation_split=0.25, callbacks=callbacks)
    return model
