"""keras-io guides (github.com/keras-team/keras-io, ``guides/*.py``) as corpus cases: see corpus_registry.

Each function is the guide's code with ``with run.scope():`` around build + compile and ``run.fit(model, ...)``
for ``model.fit(...)``; its docstring says what was adapted.
"""

from typing import Any

import numpy as np

from corpus_registry import SEED, Runner, case, classes, images, rng, seed_weights

FUNCTIONAL = "guides/functional_api.py"
CUSTOM_FIT = "guides/custom_train_step_in_tensorflow.py"


@case("functional MLP (from_logits, RMSprop, validation_split)", FUNCTIONAL,
      "a functional model with a logits loss object and an optimizer object trains as fit does, validation_split "
      "included")
def functional_mlp(run: Runner) -> Any:
    """"Training, evaluation, and inference": Dense 64-64-10 on MNIST. Adaptation: 128 generated 784-feature
    examples instead of MNIST, 2 epochs of batch 32."""
    import keras
    from keras import layers

    x, y = classes(128, 784, 10)
    with run.scope():
        inputs = keras.Input(shape=(784,))
        h = layers.Dense(64, activation="relu")(inputs)
        h = layers.Dense(64, activation="relu")(h)
        model = keras.Model(inputs=inputs, outputs=layers.Dense(10)(h), name="mnist_model")
        model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      optimizer=keras.optimizers.RMSprop(), metrics=[keras.metrics.SparseCategoricalAccuracy()])
    seed_weights(model)
    run.fit(model, x, y, batch_size=32, epochs=2, validation_split=0.25)
    return model


@case("functional multi-input multi-output (ticket model, loss_weights)", FUNCTIONAL,
      "three inputs (two token sequences through Embedding + LSTM, tags), two outputs with a loss and a loss "
      "weight each, passed as dicts")
def functional_ticket(run: Runner) -> Any:
    """"Models with multiple inputs and outputs": the ticket-priority / department model. Adaptation: vocabulary
    100 (not 10,000), embedding 8, LSTM 8/4 units, 64 generated tickets of 10/20 tokens, 2 epochs of batch 16."""
    import keras
    from keras import layers

    tags, words, departments, n = 12, 100, 4, 64
    g = rng()
    title, body = g.integers(0, words, (n, 10)), g.integers(0, words, (n, 20))
    tag = g.integers(0, 2, (n, tags)).astype("float32")
    priority, dept = g.random((n, 1)).astype("float32"), g.integers(0, 2, (n, departments)).astype("float32")
    with run.scope():
        title_input = keras.Input(shape=(None,), name="title")
        body_input = keras.Input(shape=(None,), name="body")
        tags_input = keras.Input(shape=(tags,), name="tags")
        title_features = layers.LSTM(8)(layers.Embedding(words, 8)(title_input))
        body_features = layers.LSTM(4)(layers.Embedding(words, 8)(body_input))
        h = layers.concatenate([title_features, body_features, tags_input])
        model = keras.Model(inputs=[title_input, body_input, tags_input],
                            outputs={"priority": layers.Dense(1, name="priority")(h),
                                     "department": layers.Dense(departments, name="department")(h)})
        model.compile(optimizer=keras.optimizers.RMSprop(1e-3),
                      loss={"priority": keras.losses.BinaryCrossentropy(from_logits=True),
                            "department": keras.losses.CategoricalCrossentropy(from_logits=True)},
                      loss_weights={"priority": 1.0, "department": 0.2})
    seed_weights(model)
    run.fit(model, {"title": title, "body": body, "tags": tag}, {"priority": priority, "department": dept},
            epochs=2, batch_size=16)
    return model


@case("functional toy ResNet (residual adds, Dropout)", FUNCTIONAL,
      "a non-linear graph (residual connections) with Conv2D, pooling and Dropout trains as fit does; Dropout's "
      "per-replica streams as Keras' own under a strategy")
def functional_toy_resnet(run: Runner) -> Any:
    """"A toy ResNet model" for CIFAR10. Adaptation: 64 generated 16x16x3 images (not CIFAR10), filters 8/16,
    Dense 32, 2 epochs of batch 16, validation_split 0.25."""
    import keras
    from keras import layers

    x, y = images(64, 16, 3, 10)
    with run.scope():
        inputs = keras.Input(shape=(16, 16, 3), name="img")
        h = layers.Conv2D(8, 3, activation="relu")(inputs)
        h = layers.Conv2D(16, 3, activation="relu")(h)
        block_1_output = layers.MaxPooling2D(3)(h)
        h = layers.Conv2D(16, 3, activation="relu", padding="same")(block_1_output)
        h = layers.Conv2D(16, 3, activation="relu", padding="same")(h)
        block_2_output = layers.add([h, block_1_output])
        h = layers.Conv2D(16, 3, activation="relu", padding="same")(block_2_output)
        h = layers.GlobalAveragePooling2D()(h)
        h = layers.Dropout(0.5, seed=SEED)(layers.Dense(32, activation="relu")(h))
        model = keras.Model(inputs, layers.Dense(10)(h), name="toy_resnet")
        model.compile(optimizer=keras.optimizers.RMSprop(1e-3),
                      loss=keras.losses.CategoricalCrossentropy(from_logits=True), metrics=["acc"])
    seed_weights(model)
    run.fit(model, x, np.eye(10, dtype="float32")[y], batch_size=16, epochs=2, validation_split=0.25)
    return model


@case("subclassed VAE (custom layers, add_loss, SeedGenerator)",
      "guides/making_new_layers_and_models_via_subclassing.py",
      "a subclassed Model of subclassed Layers, a KL term through add_loss and sampling from a SeedGenerator "
      "train as fit does")
def subclassing_vae(run: Runner) -> Any:
    """"Putting it all together: an end-to-end example": the VAE. Adaptation: 64 generated 784-feature examples
    in [0, 1), intermediate 16 and latent 4 (not 64 / 32), 2 epochs of batch 16."""
    import keras
    from keras import layers, ops

    class Sampling(layers.Layer):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.seed_generator = keras.random.SeedGenerator(1337)

        def call(self, inputs: Any) -> Any:
            z_mean, z_log_var = inputs
            epsilon = keras.random.normal(shape=ops.shape(z_mean), seed=self.seed_generator)
            return z_mean + ops.exp(0.5 * z_log_var) * epsilon

    class Encoder(layers.Layer):
        def __init__(self, latent_dim: int = 4, intermediate_dim: int = 16, **kwargs: Any) -> None:
            super().__init__(name="encoder", **kwargs)
            self.dense_proj = layers.Dense(intermediate_dim, activation="relu")
            self.dense_mean = layers.Dense(latent_dim)
            self.dense_log_var = layers.Dense(latent_dim)
            self.sampling = Sampling()

        def call(self, inputs: Any) -> Any:
            h = self.dense_proj(inputs)
            z_mean, z_log_var = self.dense_mean(h), self.dense_log_var(h)
            return z_mean, z_log_var, self.sampling((z_mean, z_log_var))

    class Decoder(layers.Layer):
        def __init__(self, original_dim: int, intermediate_dim: int = 16, **kwargs: Any) -> None:
            super().__init__(name="decoder", **kwargs)
            self.dense_proj = layers.Dense(intermediate_dim, activation="relu")
            self.dense_output = layers.Dense(original_dim, activation="sigmoid")

        def call(self, inputs: Any) -> Any:
            return self.dense_output(self.dense_proj(inputs))

    class VariationalAutoEncoder(keras.Model):
        def __init__(self, original_dim: int, **kwargs: Any) -> None:
            super().__init__(name="autoencoder", **kwargs)
            self.encoder = Encoder()
            self.decoder = Decoder(original_dim)

        def call(self, inputs: Any) -> Any:
            z_mean, z_log_var, z = self.encoder(inputs)
            reconstructed = self.decoder(z)
            kl_loss = -0.5 * ops.mean(z_log_var - ops.square(z_mean) - ops.exp(z_log_var) + 1)
            self.add_loss(kl_loss)
            return reconstructed

    x = rng().random((64, 784)).astype("float32")
    with run.scope():
        vae = VariationalAutoEncoder(784)
        vae.compile(keras.optimizers.Adam(learning_rate=1e-3), loss=keras.losses.MeanSquaredError())
        vae(x[:1])
    seed_weights(vae)
    run.fit(vae, x, x, epochs=2, batch_size=16)
    return vae


def _custom_model_inputs(run: Runner, model_class: Any, **compile_kwargs: Any) -> Any:
    import keras

    with run.scope():
        inputs = keras.Input(shape=(32,))
        model = model_class(inputs, keras.layers.Dense(1)(inputs))
        model.compile(**compile_kwargs)
    return seed_weights(model)


def _regression(n: int = 64) -> tuple:
    g = rng()
    return g.random((n, 32)).astype("float32"), g.random((n, 1)).astype("float32")


@case("custom train_step with compute_loss", CUSTOM_FIT,
      "a train_step of the user's own that calls self.compute_loss and updates self.metrics trains as fit does")
def custom_train_step(run: Runner) -> Any:
    """"A first simple example". Adaptation: 64 generated examples (not 1,000), 2 epochs of batch 16."""
    import keras
    import tensorflow as tf

    class CustomModel(keras.Model):
        def train_step(self, data: Any) -> Any:
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(y=y, y_pred=y_pred)
            trainable_vars = self.trainable_variables
            self.optimizer.apply(tape.gradient(loss, trainable_vars), trainable_vars)
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss)
                else:
                    metric.update_state(y, y_pred)
            return {m.name: m.result() for m in self.metrics}

    model = _custom_model_inputs(run, CustomModel, optimizer="adam", loss="mse", metrics=["mae"])
    run.fit(model, *_regression(), batch_size=16, epochs=2)
    return model


@case("custom train_step, own loss and metric objects", CUSTOM_FIT,
      "compile(optimizer) only; a loss object and Mean/MAE trackers of the model's own, listed in the metrics "
      "property, reset each epoch as in fit")
def custom_train_step_low_level(run: Runner) -> Any:
    """"Going lower-level". Adaptation: 64 generated examples (not 1,000), 2 epochs of batch 16."""
    import keras
    import tensorflow as tf

    class CustomModel(keras.Model):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.loss_tracker = keras.metrics.Mean(name="loss")
            self.mae_metric = keras.metrics.MeanAbsoluteError(name="mae")
            self.loss_fn = keras.losses.MeanSquaredError()

        def train_step(self, data: Any) -> Any:
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.loss_fn(y, y_pred)
            trainable_vars = self.trainable_variables
            self.optimizer.apply(tape.gradient(loss, trainable_vars), trainable_vars)
            self.loss_tracker.update_state(loss)
            self.mae_metric.update_state(y, y_pred)
            return {"loss": self.loss_tracker.result(), "mae": self.mae_metric.result()}

        @property
        def metrics(self) -> list:
            return [self.loss_tracker, self.mae_metric]

    model = _custom_model_inputs(run, CustomModel, optimizer="adam")
    run.fit(model, *_regression(), batch_size=16, epochs=2)
    return model


@case("custom train_step with sample_weight", CUSTOM_FIT,
      "a train_step that unpacks (x, y, sample_weight) and passes it to compute_loss and the metrics")
def custom_train_step_sample_weight(run: Runner) -> Any:
    """"Supporting sample_weight & class_weight". Adaptation: 64 generated examples and weights (not 1,000),
    2 epochs of batch 16."""
    import keras
    import tensorflow as tf

    class CustomModel(keras.Model):
        def train_step(self, data: Any) -> Any:
            if len(data) == 3:
                x, y, sample_weight = data
            else:
                sample_weight = None
                x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(y=y, y_pred=y_pred, sample_weight=sample_weight)
            trainable_vars = self.trainable_variables
            self.optimizer.apply(tape.gradient(loss, trainable_vars), trainable_vars)
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss)
                else:
                    metric.update_state(y, y_pred, sample_weight=sample_weight)
            return {m.name: m.result() for m in self.metrics}

    model = _custom_model_inputs(run, CustomModel, optimizer="adam", loss="mse", metrics=["mae"])
    x, y = _regression()
    run.fit(model, x, y, sample_weight=rng(3).random((64, 1)).astype("float32"), batch_size=16, epochs=2)
    return model


@case("custom test_step (validation)", CUSTOM_FIT,
      "a test_step of the user's own runs for validation_data as in fit (the guide calls evaluate; here fit's "
      "validation pass runs it)")
def custom_test_step(run: Runner) -> Any:
    """"Providing your own evaluation step". Adaptation: the guide's model.evaluate(x, y) is fit's validation
    pass here (fit(..., validation_data=(x, y)); tfaccel replaces fit, not evaluate), an optimizer added to
    compile for that; 64 + 32 generated examples, 2 epochs of batch 16."""
    import keras

    class CustomModel(keras.Model):
        def test_step(self, data: Any) -> Any:
            x, y = data
            y_pred = self(x, training=False)
            loss = self.compute_loss(y=y, y_pred=y_pred)
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss)
                else:
                    metric.update_state(y, y_pred)
            return {m.name: m.result() for m in self.metrics}

    model = _custom_model_inputs(run, CustomModel, optimizer="adam", loss="mse", metrics=["mae"])
    x, y = _regression(96)
    run.fit(model, x[:64], y[:64], validation_data=(x[64:], y[64:]), batch_size=16, epochs=2)
    return model


@case("GAN: Model subclass with compile(d_optimizer, g_optimizer, loss_fn), no call()", CUSTOM_FIT,
      "two optimizers and a loss of the model's own compile(), a train_step that trains two sub-models, and no "
      "call()", reference="one_device",
      open_difference={p: "trains (tfaccel.compat.keras_callless) to one device's weights, but its d_loss/g_loss "
                          "history is half of one device's: the guide feeds its Mean metrics the value of a Keras "
                          "loss object, which Keras divides by the replicas inside a replica (scale_loss_for_"
                          "distribution), as plain Keras would under any strategy" for p in ("mirrored", "multi_worker")})
def gan(run: Runner) -> Any:
    """"Wrapping up: an end-to-end GAN example". Adaptation: 64 generated 28x28x1 images (not MNIST), filters
    8/16 (not 64/128), latent 16, 2 epochs of batch 16 over an unshuffled Dataset; the random latent vectors and
    label noise the guide draws in train_step come with the data as its `y` (a seeded NumPy generator, the same
    draws per example on every path and replica); plain Keras cannot run the model under MirroredStrategy, so the
    multi-replica paths are compared with one device."""
    import keras
    import tensorflow as tf
    from keras import layers

    latent_dim, n = 16, 64

    class GAN(keras.Model):
        def __init__(self, discriminator: Any, generator: Any, latent_dim: int) -> None:
            super().__init__()
            self.discriminator, self.generator, self.latent_dim = discriminator, generator, latent_dim
            self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
            self.g_loss_tracker = keras.metrics.Mean(name="g_loss")

        @property
        def metrics(self) -> list:
            return [self.d_loss_tracker, self.g_loss_tracker]

        def compile(self, d_optimizer: Any, g_optimizer: Any, loss_fn: Any) -> None:
            super().compile()
            self.d_optimizer, self.g_optimizer, self.loss_fn = d_optimizer, g_optimizer, loss_fn

        def train_step(self, data: Any) -> Any:
            real_images, (random_latent_vectors, second_latent_vectors, label_noise) = data
            batch_size = tf.shape(real_images)[0]
            generated_images = self.generator(random_latent_vectors)
            combined_images = tf.concat([generated_images, real_images], axis=0)
            labels = tf.concat([tf.ones((batch_size, 1)), tf.zeros((batch_size, 1))], axis=0)
            labels += 0.05 * tf.concat([label_noise[:, :1], label_noise[:, 1:]], axis=0)
            with tf.GradientTape() as tape:
                d_loss = self.loss_fn(labels, self.discriminator(combined_images))
            grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
            self.d_optimizer.apply(grads, self.discriminator.trainable_weights)
            misleading_labels = tf.zeros((batch_size, 1))
            with tf.GradientTape() as tape:
                g_loss = self.loss_fn(misleading_labels, self.discriminator(self.generator(second_latent_vectors)))
            grads = tape.gradient(g_loss, self.generator.trainable_weights)
            self.g_optimizer.apply(grads, self.generator.trainable_weights)
            self.d_loss_tracker.update_state(d_loss)
            self.g_loss_tracker.update_state(g_loss)
            return {"d_loss": self.d_loss_tracker.result(), "g_loss": self.g_loss_tracker.result()}

    g = rng()
    noise = (g.normal(size=(n, latent_dim)).astype("float32"), g.normal(size=(n, latent_dim)).astype("float32"),
             g.random((n, 2)).astype("float32"))
    data = (images(n, 28, 1, 4)[0], noise)
    dataset = tf.data.Dataset.from_tensor_slices(data).batch(16)
    with run.scope():
        discriminator = keras.Sequential([
            keras.Input(shape=(28, 28, 1)),
            layers.Conv2D(8, (3, 3), strides=(2, 2), padding="same"), layers.LeakyReLU(negative_slope=0.2),
            layers.Conv2D(16, (3, 3), strides=(2, 2), padding="same"), layers.LeakyReLU(negative_slope=0.2),
            layers.GlobalMaxPooling2D(), layers.Dense(1)], name="discriminator")
        generator = keras.Sequential([
            keras.Input(shape=(latent_dim,)), layers.Dense(7 * 7 * 16), layers.LeakyReLU(negative_slope=0.2),
            layers.Reshape((7, 7, 16)),
            layers.Conv2DTranspose(16, (4, 4), strides=(2, 2), padding="same"), layers.LeakyReLU(negative_slope=0.2),
            layers.Conv2DTranspose(16, (4, 4), strides=(2, 2), padding="same"), layers.LeakyReLU(negative_slope=0.2),
            layers.Conv2D(1, (7, 7), padding="same", activation="sigmoid")], name="generator")
        model = GAN(discriminator=discriminator, generator=generator, latent_dim=latent_dim)
        model.compile(d_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
                      g_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
                      loss_fn=keras.losses.BinaryCrossentropy(from_logits=True))
    seed_weights(model)
    run.fit(model, dataset, epochs=2)
    return model
