"""The Keras-parity cases: each builds+compiles a tiny model and names the fit arguments of one behaviour.

A case is trained by plain ``model.fit`` (the reference) and by ``tfaccel.fit`` on each path, from the same
initial weights (set from a NumPy seed, identical in every process) and the same seed; parity_program.py
runs them and parity tests compare. ``multi_replica_reference``: what a multi-replica path is compared with
under tf.distribute (``"keras"``: plain Keras fit with as many replicas; ``"one_device"``: one device at the same
global batch, for the cases where Keras' own multi-replica behaviour is the bug tfaccel fixes). Horovod ranks are
single-replica processes whose gradients and metric states are summed: they train what one device trains at the
global batch, except where each replica sees only its part of the batch (``per_replica_statistics``).
"""

import dataclasses
import os
from typing import Any, Callable, Dict, List

import numpy as np

N, BATCH, EPOCHS, SEED = 72, 16, 3, 1234  # 72 = 4 full batches + a partial batch of 8 (even over 2 replicas)


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[], Any]
    fit_kwargs: Callable[[str], Dict[str, Any]]  # (output dir) -> model.fit keyword arguments
    multi_replica_reference: str = "keras"
    per_replica_statistics: bool = False  # BatchNormalization: each replica normalises its own part of the batch


def _rng() -> np.random.Generator:
    return np.random.default_rng(7)


def classification(n: int = N, one_hot: bool = False) -> tuple:
    rng = _rng()
    x = rng.normal(size=(n, 6)).astype("float32")
    y = (np.argmax(x[:, :3] + 0.3 * rng.normal(size=(n, 3)), axis=1)).astype("int32")
    return x, (np.eye(3, dtype="float32")[y] if one_hot else y)


def regression(n: int = N) -> tuple:
    rng = _rng()
    x = rng.normal(size=(n, 6)).astype("float32")
    return x, (x @ rng.normal(size=(6, 1)) + 0.1 * rng.normal(size=(n, 1))).astype("float32")


def set_initial_weights(model: Any) -> Any:
    """Deterministic weights from NumPy, the same in every process and under every strategy."""
    rng = np.random.default_rng(99)
    values = []
    for w in model.weights:
        path = getattr(w, "path", w.name)
        if "moving_variance" in path:
            values.append(np.ones(w.shape, "float32"))
        elif "moving_mean" in path or w.dtype not in ("float32", "float16"):
            values.append(np.zeros(w.shape, w.dtype))
        else:
            values.append((0.3 * rng.normal(size=w.shape)).astype("float32"))
    model.set_weights(values)
    return model


def _mlp(out: int = 3, activation: str = "softmax", **dense: Any) -> Any:
    import keras

    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu", **dense),
                             keras.layers.Dense(out, activation=activation)])


def _compile(model: Any, *, optimizer: Any = None, loss: str = "sparse_categorical_crossentropy",
             metrics: Any = ("accuracy",)) -> Any:
    import keras

    model.compile(optimizer=optimizer or keras.optimizers.SGD(0.1), loss=loss, metrics=list(metrics))
    return set_initial_weights(model)


def _plain(extra: Callable[[], Dict[str, Any]] = dict, data: Callable[[], tuple] = classification) -> Callable:
    def kwargs(out: str) -> Dict[str, Any]:
        x, y = data()
        return {**dict(x=x, y=y, batch_size=BATCH, epochs=EPOCHS, shuffle=False), **extra()}
    return kwargs


# ------------------------------------------------------------------------------------------------ models
def _custom_train_step_model() -> Any:
    import keras
    import tensorflow as tf

    class HalfLossModel(keras.Model):
        """keras-io "Customizing what happens in fit()": a train_step of its own (here: half the loss)."""

        def train_step(self, data: Any) -> Dict[str, Any]:
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = 0.5 * self.compute_loss(y=y, y_pred=y_pred)
            self.optimizer.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss)
                else:
                    metric.update_state(y, y_pred)
            return {m.name: m.result() for m in self.metrics}

    inputs = keras.Input((6,))
    outputs = keras.layers.Dense(3, activation="softmax")(keras.layers.Dense(8, activation="relu")(inputs))
    return _compile(HalfLossModel(inputs, outputs))


def _custom_compute_loss_model() -> Any:
    import keras

    class PenalisedModel(keras.Model):
        def compute_loss(self, x: Any = None, y: Any = None, y_pred: Any = None, sample_weight: Any = None,
                         training: bool = True) -> Any:
            base = super().compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training)
            return base + 0.1 * keras.ops.mean(keras.ops.square(y_pred))

    inputs = keras.Input((6,))
    outputs = keras.layers.Dense(3, activation="softmax")(keras.layers.Dense(8, activation="relu")(inputs))
    return _compile(PenalisedModel(inputs, outputs))


def _add_loss_model() -> Any:
    import keras

    class ActivityPenalty(keras.layers.Layer):
        def call(self, inputs: Any) -> Any:
            self.add_loss(0.01 * keras.ops.mean(keras.ops.square(inputs)))
            return inputs

    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu", kernel_regularizer="l2"),
                              ActivityPenalty(), keras.layers.Dense(3, activation="softmax")])
    return _compile(model)


def _bn_dropout_model() -> Any:
    import keras

    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8), keras.layers.BatchNormalization(),
                              keras.layers.Activation("relu"), keras.layers.Dropout(0.3, seed=5),
                              keras.layers.Dense(3, activation="softmax")])
    return _compile(model)


def _dict_model() -> Any:
    import keras

    a, b = keras.Input((4,), name="a"), keras.Input((2,), name="b")
    h = keras.layers.Concatenate()([keras.layers.Dense(4, activation="relu")(a), b])
    model = keras.Model({"a": a, "b": b}, keras.layers.Dense(3, activation="softmax")(h))
    return _compile(model)


def _dict_data() -> tuple:
    x, y = classification()
    return {"a": x[:, :4], "b": x[:, 4:]}, y


def _sample_weights() -> np.ndarray:
    return np.linspace(0.2, 2.0, N).astype("float32")


def _dataset_kwargs(out: str) -> Dict[str, Any]:
    import tensorflow as tf

    x, y = classification()
    return dict(x=tf.data.Dataset.from_tensor_slices((x, y, _sample_weights())).batch(BATCH), epochs=EPOCHS)


def _nan_data() -> tuple:
    x, y = regression()
    y[69] = np.nan  # in the 5th batch (rows 64-71): TerminateOnNaN stops after exactly 5 steps. (A NaN in x is
    # not portable: TF's non-XLA relu kernel maps NaN to 0, XLA's keeps it.)
    return x, y


CALLS: List[str] = []


def _lambda_kwargs(out: str) -> Dict[str, Any]:
    import keras

    CALLS.clear()
    x, y = classification()
    cb = keras.callbacks.LambdaCallback(on_batch_end=lambda batch, logs: CALLS.append(f"train_batch_{batch}"))
    return dict(x=x, y=y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, callbacks=[cb])


def _checkpoint_kwargs(out: str) -> Dict[str, Any]:
    import keras

    x, y = classification()
    return dict(x=x, y=y, batch_size=BATCH, epochs=EPOCHS, shuffle=False,
                callbacks=[keras.callbacks.ModelCheckpoint(os.path.join(out, "model.keras"))])


def _csv_kwargs(out: str) -> Dict[str, Any]:
    import keras

    x, y = classification()
    return dict(x=x, y=y, batch_size=BATCH, epochs=EPOCHS, shuffle=False,
                callbacks=[keras.callbacks.CSVLogger(os.path.join(out, "log.csv"))])


def _opt(**kw: Any) -> Callable[[], Any]:
    def build() -> Any:
        import keras

        return _compile(_mlp(), optimizer=keras.optimizers.SGD(0.3, **kw))
    return build


def _schedule_model() -> Any:
    import keras

    return _compile(_mlp(), optimizer=keras.optimizers.Adam(keras.optimizers.schedules.ExponentialDecay(0.05, 2, 0.5)))


def _metrics(loss: str, metrics: tuple, *, out: int = 3, activation: str = "softmax") -> Callable[[], Any]:
    return lambda: _compile(_mlp(out, activation), loss=loss, metrics=metrics)


def _stateful_metrics_model() -> Any:
    import keras

    return _compile(_mlp(), loss="categorical_crossentropy",
                    metrics=(keras.metrics.AUC(name="auc"), keras.metrics.F1Score(average="macro")))


def _callbacks(*make: Callable[[], Any]) -> Callable[[], Dict[str, Any]]:
    return lambda: dict(callbacks=[m() for m in make], epochs=5)


def _keras_cb(name: str, **kw: Any) -> Callable[[], Any]:
    def make() -> Any:
        import keras

        return getattr(keras.callbacks, name)(**kw)
    return make


CASES: Dict[str, Case] = {c.name: c for c in [
    Case("custom train_step", _custom_train_step_model, _plain()),
    Case("custom compute_loss", _custom_compute_loss_model, _plain()),
    Case("add_loss + kernel_regularizer", _add_loss_model, _plain(lambda: dict(validation_data=classification(24)))),
    Case("BatchNorm + Dropout, partial last batch", _bn_dropout_model, _plain(), per_replica_statistics=True),
    Case("sample_weight (arrays)", lambda: _compile(_mlp()), _plain(lambda: dict(sample_weight=_sample_weights()))),
    Case("sample_weight (dataset)", lambda: _compile(_mlp()), _dataset_kwargs),
    Case("class_weight", lambda: _compile(_mlp()), _plain(lambda: dict(class_weight={0: 0.5, 1: 2.0, 2: 1.0}))),
    Case("validation_split", lambda: _compile(_mlp()), _plain(lambda: dict(validation_split=0.25))),
    Case("LR schedule (ExponentialDecay)", _schedule_model, _plain()),
    Case("clipvalue", _opt(clipvalue=0.05), _plain(), "one_device"),
    Case("clipnorm", _opt(clipnorm=0.1), _plain(), "one_device"),
    Case("global_clipnorm", _opt(global_clipnorm=0.1), _plain(), "one_device"),
    Case("metrics mae, mse", _metrics("mse", ("mae", "mse"), out=1, activation="linear"), _plain(data=regression)),
    Case("metrics sparse_categorical_accuracy, accuracy (sparse)",
         _metrics("sparse_categorical_crossentropy", ("sparse_categorical_accuracy", "accuracy")), _plain()),
    Case("metric accuracy (one-hot)", _metrics("categorical_crossentropy", ("accuracy",)),
         _plain(data=lambda: classification(one_hot=True))),
    Case("stateful metrics AUC, F1Score", _stateful_metrics_model, _plain(data=lambda: classification(one_hot=True))),
    Case("multi-input dict model", _dict_model, _plain(data=_dict_data)),
    Case("EarlyStopping", lambda: _compile(_mlp()), _plain(_callbacks(_keras_cb(
        "EarlyStopping", monitor="loss", min_delta=10.0, patience=1)))),
    Case("ReduceLROnPlateau", lambda: _compile(_mlp()), _plain(_callbacks(_keras_cb(
        "ReduceLROnPlateau", monitor="loss", factor=0.5, patience=0, min_delta=10.0)))),
    Case("ModelCheckpoint", lambda: _compile(_mlp()), _checkpoint_kwargs),
    Case("CSVLogger", lambda: _compile(_mlp()), _csv_kwargs),
    Case("TerminateOnNaN", _metrics("mse", ("mae",), out=1, activation="linear"),
         _plain(_callbacks(_keras_cb("TerminateOnNaN")), data=_nan_data)),
    Case("LambdaCallback batch hooks", lambda: _compile(_mlp()), _lambda_kwargs),
]}
