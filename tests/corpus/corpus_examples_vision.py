"""keras-io examples on images and keras-io recipes (github.com/keras-team/keras-io, ``examples/*/*.py``) as
corpus cases: see corpus_registry."""

from typing import Any

import numpy as np

from corpus_registry import SEED, Runner, case, classes, images, rng, seed_weights


@case("image classification with augmentation layers, SeparableConv2D residual blocks",
      "examples/vision/image_classification_from_scratch.py",
      "seeded RandomFlip / RandomRotation in the model (\"Option 1\"), Rescaling, residual SeparableConv2D blocks "
      "with BatchNorm, Dropout, a checkpoint file per epoch")
def image_classification(run: Runner) -> Any:
    """Cats vs dogs from scratch (a small Xception). Adaptation: 64 generated 32x32x3 images in [0, 255) (not the
    downloaded Kaggle images), block sizes [16, 32] (not [256, 512, 728]), entry filters 16, batch 16, 2 epochs
    (the example: 25); the augmentation layers seeded and in the model (the example's "Option 1")."""
    import keras
    from keras import layers

    x, y = images(64, 32, 3, 2)
    with run.scope():
        data_augmentation = keras.Sequential([layers.RandomFlip("horizontal", seed=SEED),
                                              layers.RandomRotation(0.1, seed=SEED)])
        inputs = keras.Input(shape=(32, 32, 3))
        h = layers.Rescaling(1.0 / 255)(data_augmentation(inputs))
        h = layers.Activation("relu")(layers.BatchNormalization()(layers.Conv2D(16, 3, strides=2, padding="same")(h)))
        previous_block_activation = h
        for size in [16, 32]:
            h = layers.Activation("relu")(h)
            h = layers.BatchNormalization()(layers.SeparableConv2D(size, 3, padding="same")(h))
            h = layers.Activation("relu")(h)
            h = layers.BatchNormalization()(layers.SeparableConv2D(size, 3, padding="same")(h))
            h = layers.MaxPooling2D(3, strides=2, padding="same")(h)
            residual = layers.Conv2D(size, 1, strides=2, padding="same")(previous_block_activation)
            h = previous_block_activation = layers.add([h, residual])
        h = layers.Activation("relu")(layers.BatchNormalization()(layers.SeparableConv2D(32, 3, padding="same")(h)))
        h = layers.Dropout(0.25, seed=SEED)(layers.GlobalAveragePooling2D()(h))
        model = keras.Model(inputs, layers.Dense(1, activation=None)(h))
        model.compile(optimizer=keras.optimizers.Adam(3e-4), loss=keras.losses.BinaryCrossentropy(from_logits=True),
                      metrics=[keras.metrics.BinaryAccuracy(name="acc")])
    seed_weights(model)
    callbacks = [keras.callbacks.ModelCheckpoint(run.path("save_at_{epoch}.keras"))]
    run.fit(model, x * 255.0, y.astype("float32")[:, None], epochs=2, batch_size=16, callbacks=callbacks)
    return model


@case("MNIST convnet (one-hot targets, Flatten, Dropout)", "examples/vision/mnist_convnet.py",
      "the simple MNIST convnet with categorical_crossentropy on one-hot targets and validation_split")
def mnist_convnet(run: Runner) -> Any:
    """Adaptation: 64 generated 16x16x1 images (not MNIST), filters 8/16 (not 32/64), batch 16, 2 epochs
    (the example: 15 of 128), validation_split 0.25 (not 0.1)."""
    import keras
    from keras import layers

    x, y = images(64, 16, 1, 10)
    with run.scope():
        model = keras.Sequential([
            keras.Input(shape=(16, 16, 1)),
            layers.Conv2D(8, kernel_size=(3, 3), activation="relu"), layers.MaxPooling2D(pool_size=(2, 2)),
            layers.Conv2D(16, kernel_size=(3, 3), activation="relu"), layers.MaxPooling2D(pool_size=(2, 2)),
            layers.Flatten(), layers.Dropout(0.5, seed=SEED), layers.Dense(10, activation="softmax")])
        model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])
    seed_weights(model)
    run.fit(model, x, keras.utils.to_categorical(y, 10), batch_size=16, epochs=2, validation_split=0.25)
    return model


@case("metric learning: EmbeddingModel.train_step on anchor/positive pairs from a PyDataset",
      "examples/vision/metric_learning.py",
      "a train_step that embeds anchors and positives and takes a softmax loss over their similarity matrix, fed "
      "by a keras.utils.PyDataset whose batches are (2, classes, ...) arrays",
      refuses={p: "has its own train_step, and under 2 replicas every batch is split along axis 0"
               for p in ("mirrored", "multi_worker")})  # axis 0 is (anchors, positives): not splittable
def metric_learning(run: Runner) -> Any:
    """Adaptation: 4 classes of generated 16x16x3 images (not CIFAR-10's 10), the PyDataset's random pairs drawn
    from a seeded generator, 8 batches per epoch (not 1,000), filters 8/16/16, 2 epochs (the example: 20)."""
    import keras
    import tensorflow as tf
    from keras import layers

    num_classes = 4
    x, y = images(64, 16, 3, num_classes)
    class_idx_to_train_idxs = {c: np.flatnonzero(y == c) for c in range(num_classes)}

    class AnchorPositivePairs(keras.utils.PyDataset):
        def __init__(self, num_batchs: int) -> None:
            super().__init__()
            self.num_batchs = num_batchs
            g = rng(5)
            self.pairs = [[g.choice(class_idx_to_train_idxs[c], 2, replace=False) for c in range(num_classes)]
                          for _ in range(num_batchs)]

        def __len__(self) -> int:
            return self.num_batchs

        def __getitem__(self, idx: int) -> Any:
            batch = np.zeros((2, num_classes, 16, 16, 3), dtype=np.float32)
            for class_idx, (anchor_idx, positive_idx) in enumerate(self.pairs[idx]):
                batch[0, class_idx], batch[1, class_idx] = x[anchor_idx], x[positive_idx]
            return batch

    class EmbeddingModel(keras.Model):
        def train_step(self, data: Any) -> Any:
            if isinstance(data, tuple):
                data = data[0]
            anchors, positives = data[0], data[1]
            with tf.GradientTape() as tape:
                anchor_embeddings = self(anchors, training=True)
                positive_embeddings = self(positives, training=True)
                similarities = keras.ops.einsum("ae,pe->ap", anchor_embeddings, positive_embeddings)
                similarities /= 0.2
                sparse_labels = keras.ops.arange(num_classes)
                loss = self.compute_loss(y=sparse_labels, y_pred=similarities)
            gradients = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss)
                else:
                    metric.update_state(sparse_labels, similarities)
            return {m.name: m.result() for m in self.metrics}

    with run.scope():
        inputs = layers.Input(shape=(16, 16, 3))
        h = layers.Conv2D(filters=8, kernel_size=3, strides=2, activation="relu")(inputs)
        h = layers.Conv2D(filters=16, kernel_size=3, strides=2, activation="relu")(h)
        h = layers.GlobalAveragePooling2D()(layers.Conv2D(filters=16, kernel_size=3, strides=1, activation="relu")(h))
        embeddings = layers.UnitNormalization()(layers.Dense(units=8, activation=None)(h))
        model = EmbeddingModel(inputs, embeddings)
        model.compile(optimizer=keras.optimizers.Adam(learning_rate=1e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    seed_weights(model)
    run.fit(model, AnchorPositivePairs(num_batchs=8), epochs=2)
    return model


@case("knowledge distillation: compute_loss override, custom compile(), call() delegating to the student",
      "examples/vision/knowledge_distillation.py",
      "a Distiller whose compile() takes two losses, alpha and temperature, whose compute_loss(x, y, y_pred, "
      "sample_weight, allow_empty) adds the teacher's soft targets, after training the teacher with fit")
def knowledge_distillation(run: Runner) -> Any:
    """Adaptation: 64 generated 16x16x1 images (not MNIST), teacher filters 16/32 (not 256/512), student 4/8
    (not 16/32), batch 16, teacher 1 epoch (not 5), distillation 2 epochs (not 3)."""
    import keras
    from keras import layers, ops

    class Distiller(keras.Model):
        def __init__(self, student: Any, teacher: Any) -> None:
            super().__init__()
            self.teacher, self.student = teacher, student

        def compile(self, optimizer: Any, metrics: Any, student_loss_fn: Any, distillation_loss_fn: Any,
                    alpha: float = 0.1, temperature: float = 3) -> None:
            super().compile(optimizer=optimizer, metrics=metrics)
            self.student_loss_fn, self.distillation_loss_fn = student_loss_fn, distillation_loss_fn
            self.alpha, self.temperature = alpha, temperature

        def compute_loss(self, x: Any = None, y: Any = None, y_pred: Any = None, sample_weight: Any = None,
                         allow_empty: bool = False) -> Any:
            teacher_pred = self.teacher(x, training=False)
            student_loss = self.student_loss_fn(y, y_pred)
            distillation_loss = self.distillation_loss_fn(
                ops.softmax(teacher_pred / self.temperature, axis=1),
                ops.softmax(y_pred / self.temperature, axis=1)) * (self.temperature**2)
            return self.alpha * student_loss + (1 - self.alpha) * distillation_loss

        def call(self, x: Any) -> Any:
            return self.student(x)

    def convnet(filters: tuple, name: str) -> Any:
        return keras.Sequential([
            keras.Input(shape=(16, 16, 1)),
            layers.Conv2D(filters[0], (3, 3), strides=(2, 2), padding="same"), layers.LeakyReLU(negative_slope=0.2),
            layers.MaxPooling2D(pool_size=(2, 2), strides=(1, 1), padding="same"),
            layers.Conv2D(filters[1], (3, 3), strides=(2, 2), padding="same"), layers.Flatten(),
            layers.Dense(10)], name=name)

    x, y = images(64, 16, 1, 10)
    with run.scope():
        teacher, student = convnet((16, 32), "teacher"), convnet((4, 8), "student")
        teacher.compile(optimizer=keras.optimizers.Adam(),
                        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                        metrics=[keras.metrics.SparseCategoricalAccuracy()])
    seed_weights(teacher)
    seed_weights(student)
    run.fit(teacher, x, y, epochs=1, batch_size=16)
    with run.scope():
        distiller = Distiller(student=student, teacher=teacher)
        distiller.compile(optimizer=keras.optimizers.Adam(), metrics=[keras.metrics.SparseCategoricalAccuracy()],
                          student_loss_fn=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          distillation_loss_fn=keras.losses.KLDivergence(), alpha=0.1, temperature=10)
    run.fit(distiller, x, y, epochs=2, batch_size=16)
    return distiller


@case("trainer pattern: a Model wrapping a model, own loss and metric, two optimizers' runs",
      "examples/keras_recipes/trainer_pattern.py",
      "a trainer Model whose train_step/test_step use their own loss object and metric around an inner model, "
      "with validation_data; two trainers (SGD, Adam) trained one after the other")
def trainer_pattern(run: Runner) -> Any:
    """Adaptation: 96 generated 784-feature examples (not MNIST; 32 for validation), Dense 32 (not 256),
    batch 16, 2 epochs (the example: 5 of 64)."""
    import keras
    import tensorflow as tf

    class MyTrainer(keras.Model):
        def __init__(self, model: Any) -> None:
            super().__init__()
            self.model = model
            self.loss_fn = keras.losses.SparseCategoricalCrossentropy()
            self.accuracy_metric = keras.metrics.SparseCategoricalAccuracy()

        @property
        def metrics(self) -> list:
            return [self.accuracy_metric]

        def train_step(self, data: Any) -> Any:
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self.model(x, training=True)
                loss = self.loss_fn(y, y_pred)
            trainable_vars = self.trainable_variables
            self.optimizer.apply_gradients(zip(tape.gradient(loss, trainable_vars), trainable_vars))
            for metric in self.metrics:
                metric.update_state(y, y_pred)
            return {m.name: m.result() for m in self.metrics}

        def test_step(self, data: Any) -> Any:
            x, y = data
            y_pred = self.model(x, training=False)
            for metric in self.metrics:
                metric.update_state(y, y_pred)
            return {m.name: m.result() for m in self.metrics}

        def call(self, x: Any) -> Any:
            return self.model(x)

    x, y = classes(96, 784, 10)
    with run.scope():
        inputs = keras.layers.Input(shape=(784,))
        h = keras.layers.Dense(32, activation="relu")(keras.layers.Flatten()(inputs))
        model_a = keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(h))
        model_b = keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(
            keras.layers.Dense(32, activation="relu")(inputs)))
        trainer_1, trainer_2 = MyTrainer(model_a), MyTrainer(model_b)
        trainer_1.compile(optimizer=keras.optimizers.SGD())
        trainer_2.compile(optimizer=keras.optimizers.Adam())
    seed_weights(model_a)
    seed_weights(model_b)
    run.fit(trainer_1, x[:64], y[:64], epochs=2, batch_size=16, validation_data=(x[64:], y[64:]))
    run.fit(trainer_2, x[:64], y[:64], epochs=2, batch_size=16, validation_data=(x[64:], y[64:]))
    return trainer_2


@case("endpoint layer pattern: the loss inside a layer, targets as model inputs",
      "examples/keras_recipes/endpoint_layer_pattern.py",
      "a layer that adds the loss (add_loss) from targets and sample weights that are model inputs; compile(optimizer) "
      "only, data as one dict")
def endpoint_layer(run: Runner) -> Any:
    """Adaptation: 64 generated examples of 32 features (not 1,000 of 764), batch 16, 2 epochs; the accuracy
    metric the example also updates inside the layer is left out."""
    import keras
    from keras import ops

    class LogisticEndpoint(keras.layers.Layer):
        def __init__(self, name: Any = None) -> None:
            super().__init__(name=name)
            self.loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)

        def call(self, logits: Any, targets: Any = None, sample_weights: Any = None) -> Any:
            if targets is not None:
                self.add_loss(self.loss_fn(targets, logits, sample_weights))
            return ops.softmax(logits)

    g = rng()
    data = {"inputs": g.random((64, 32)).astype("float32"), "targets": g.random((64, 1)).astype("float32"),
            "sample_weight": g.random((64, 1)).astype("float32")}
    with run.scope():
        inputs = keras.Input((32,), name="inputs")
        logits = keras.layers.Dense(1)(inputs)
        targets, sample_weight = keras.Input((1,), name="targets"), keras.Input((1,), name="sample_weight")
        model = keras.Model([inputs, targets, sample_weight], LogisticEndpoint()(logits, targets, sample_weight))
        model.compile(keras.optimizers.Adam(1e-3))
    seed_weights(model)
    run.fit(model, data, epochs=2, batch_size=16)
    return model


@case("custom layer with build() and add_weight (Antirectifier)", "examples/keras_recipes/antirectifier.py",
      "a Layer subclass that creates its kernel in build() from the input shape, between Dense layers, with Dropout")
def antirectifier(run: Runner) -> Any:
    """Adaptation: 96 generated 784-feature examples (not MNIST), Dense 32 (not 256), batch 16, 2 epochs (the
    example: 20 of 128), validation_split 0.25 (not 0.15)."""
    import keras
    from keras import layers, ops

    class Antirectifier(layers.Layer):
        def __init__(self, initializer: str = "he_normal", **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.initializer = keras.initializers.get(initializer)

        def build(self, input_shape: Any) -> None:
            output_dim = input_shape[-1]
            self.kernel = self.add_weight(shape=(output_dim * 2, output_dim), initializer=self.initializer,
                                          name="kernel", trainable=True)

        def call(self, inputs: Any) -> Any:
            inputs -= ops.mean(inputs, axis=-1, keepdims=True)
            concatenated = ops.concatenate([ops.relu(inputs), ops.relu(-inputs)], axis=-1)
            return ops.matmul(concatenated, self.kernel)

    x, y = classes(96, 784, 10)
    with run.scope():
        model = keras.Sequential([keras.Input(shape=(784,)), layers.Dense(32), Antirectifier(), layers.Dense(32),
                                  Antirectifier(), layers.Dropout(0.5, seed=SEED), layers.Dense(10)])
        model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      optimizer=keras.optimizers.RMSprop(), metrics=[keras.metrics.SparseCategoricalAccuracy()])
    seed_weights(model)
    run.fit(model, x, y, batch_size=16, epochs=2, validation_split=0.25)
    return model


@case("subclassed Conv2D: call() override and convolution_op override",
      "examples/keras_recipes/subclassing_conv_layers.py",
      "two weight-standardised Conv2D subclasses (one overriding call, one convolution_op) train as fit does")
def subclassing_conv_layers(run: Runner) -> Any:
    """Adaptation: 64 generated 16x16x1 images (not MNIST), filters 4/8 (not 32/64), batch 16, 2 epochs (the
    example: 5 of 256), validation_split 0.25 (not 0.1)."""
    import keras
    from keras import layers, ops

    class StandardizedConv2DWithCall(layers.Conv2D):
        def call(self, inputs: Any) -> Any:
            mean, var = ops.moments(self.kernel, axes=[0, 1, 2], keepdims=True)
            result = ops.conv(inputs, (self.kernel - mean) / ops.sqrt(var + 1e-10), padding="valid",
                              strides=list(self.strides), dilation_rate=list(self.dilation_rate))
            if self.use_bias:
                result = result + self.bias
            return self.activation(result)

    class StandardizedConv2DWithOverride(layers.Conv2D):
        def convolution_op(self, inputs: Any, kernel: Any) -> Any:
            mean, var = ops.moments(kernel, axes=[0, 1, 2], keepdims=True)
            return ops.conv(inputs, (kernel - mean) / ops.sqrt(var + 1e-10), padding="valid",
                            strides=list(self.strides), dilation_rate=list(self.dilation_rate))

    x, y = images(64, 16, 1, 10)
    with run.scope():
        model = keras.Sequential([
            keras.Input(shape=(16, 16, 1)),
            StandardizedConv2DWithCall(4, kernel_size=(3, 3), activation="relu"), layers.MaxPooling2D(pool_size=(2, 2)),
            StandardizedConv2DWithOverride(8, kernel_size=(3, 3), activation="relu"),
            layers.MaxPooling2D(pool_size=(2, 2)), layers.Flatten(), layers.Dropout(0.5, seed=SEED),
            layers.Dense(10, activation="softmax")])
        model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])
    seed_weights(model)
    run.fit(model, x, keras.utils.to_categorical(y, 10), batch_size=16, epochs=2, validation_split=0.25)
    return model
