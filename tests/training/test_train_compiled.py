"""The compiled loop trains exactly like Keras ``model.fit`` (differential tests), and says when it cannot.

Every case builds the same model twice from the same seed, trains one copy with plain ``model.fit`` and the other
with ``run_compiled`` (shuffle off, 100 examples, batch 32: a partial last batch of 4), and compares the history
(same keys, values rel. 1e-5) and the final weights (abs. 1e-5).
"""

import contextlib
import csv
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfaccel.train.loops.compiled import compiled_blockers, run_compiled

N, BATCH = 100, 32


def _features(n: int = N, d: int = 8, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, d)).astype("float32")


def _labels(x: np.ndarray) -> np.ndarray:
    return (x[:, 0] > 0).astype("int64") + (x[:, 1] > 0.5).astype("int64")


def _mlp(inputs: int = 8, outputs: int = 3, activation: Optional[str] = None) -> keras.Model:
    return keras.Sequential([keras.Input((inputs,)), keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dense(outputs, activation=activation)])


def _sparse_ce() -> Dict[str, Any]:
    return {"optimizer": keras.optimizers.Adam(1e-2),
            "loss": keras.losses.SparseCategoricalCrossentropy(from_logits=True), "metrics": ["accuracy"]}


def _run_both(build: Callable[[], keras.Model], compile_kw: Callable[[], Dict[str, Any]], *, x: Any, y: Any,
              sample_weight: Any = None, jit: bool = False, epochs: int = 2, validation: Any = None,
              validation_freq: Any = 1, validation_batch_size: Optional[int] = None, initial_epoch: int = 0,
              callbacks: Callable[[str], List[Any]] = lambda tag: [],
              scope: Callable[[], Any] = contextlib.nullcontext) -> Dict[str, Any]:
    """Trains two copies of one model (Keras fit, compiled loop) and checks they agree; returns both."""
    runs = {}
    for tag in ("keras", "compiled"):
        keras.utils.set_random_seed(7)
        with scope():
            model = build()
            model.compile(**compile_kw(), jit_compile=jit)
        keras.utils.set_random_seed(11)  # the same global RNG state when training starts
        if tag == "keras":
            history = model.fit(x, y, sample_weight=sample_weight, batch_size=BATCH, epochs=epochs, shuffle=False,
                                validation_data=validation, validation_freq=validation_freq,
                                validation_batch_size=validation_batch_size, initial_epoch=initial_epoch,
                                callbacks=callbacks(tag), verbose=0).history
        else:
            result = run_compiled(model, x=x, y=y, sample_weight=sample_weight, batch_size=BATCH, epochs=epochs,
                                  initial_epoch=initial_epoch, shuffle=False, seed=0, validation=validation,
                                  validation_batch_size=validation_batch_size, validation_freq=validation_freq,
                                  jit_compile=jit, callbacks=callbacks(tag), verbose=0)
            history = result.history
            assert result.steps == len(result.epoch_seconds) * -(-N // BATCH)
        runs[tag] = (model, history)
    (fit_model, fit_history), (model, history) = runs["keras"], runs["compiled"]
    assert sorted(history) == sorted(fit_history)
    for key, values in fit_history.items():
        np.testing.assert_allclose(history[key], values, rtol=1e-5, atol=1e-7, err_msg=key)
    assert len(model.get_weights()) == len(fit_model.get_weights())
    for got, want in zip(model.get_weights(), fit_model.get_weights()):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    assert int(model.optimizer.iterations) == int(fit_model.optimizer.iterations)
    return {"keras": fit_history, "compiled": history, "model": model, "fit_model": fit_model}


@pytest.mark.parametrize("jit", [True, False], ids=["xla", "no_xla"])
def test_batchnorm_dropout_partial_batch_and_validation_freq(jit: bool) -> None:
    """Seeded Dropout draws the same masks inside the loop (its SeedGenerator state is a variable the step
    advances), BatchNorm sees the real 4-example last batch, and validation runs on epoch 2 only."""
    def build() -> keras.Model:
        return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                 keras.layers.BatchNormalization(), keras.layers.Dropout(0.3),
                                 keras.layers.Dense(3)])

    x = _features()
    xv = _features(50, seed=1)
    out = _run_both(build, _sparse_ce, x=x, y=_labels(x), jit=jit, epochs=3, validation=(xv, _labels(xv), None),
                    validation_freq=2, validation_batch_size=24)
    assert sorted(out["compiled"]) == ["accuracy", "loss", "val_accuracy", "val_loss"]
    assert len(out["compiled"]["loss"]) == 3 and len(out["compiled"]["val_loss"]) == 1


def test_one_device_strategy() -> None:
    """A model built under OneDeviceStrategy (what tfaccel.scope() gives on one device) trains the same."""
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    x = _features()
    _run_both(lambda: keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                        keras.layers.Dropout(0.2), keras.layers.Dense(3)]),
              _sparse_ce, x=x, y=_labels(x), validation=(x, _labels(x), None), scope=strategy.scope)


class ExtraTermModel(keras.Model):
    """A custom ``train_step`` that adds a term to the loss and reports its own keys."""

    def __init__(self) -> None:
        super().__init__(name="extra_term")
        self.hidden, self.head = keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)
        self.extra = keras.metrics.Mean(name="extra")

    def call(self, x: Any) -> Any:
        return self.head(self.hidden(x))

    def train_step(self, data: Any) -> Dict[str, Any]:
        x, y = data
        with tf.GradientTape() as tape:
            pred = self(x, training=True)
            extra = 0.1 * tf.reduce_mean(tf.square(pred))
            loss = self.compute_loss(x=x, y=y, y_pred=pred) + extra
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        self.extra.update_state(extra)
        return {"extra": self.extra.result(), "last_loss": loss}


def test_custom_train_step() -> None:
    def build() -> keras.Model:
        model = ExtraTermModel()
        model(tf.zeros((1, 8)))  # builds the layers from the seeded initialisers
        return model

    x = _features()
    out = _run_both(build, lambda: {"optimizer": keras.optimizers.SGD(0.05), "loss": "mse"}, x=x, y=x[:, :1] * 2,
                    jit=True)
    assert sorted(out["compiled"]) == ["extra", "last_loss"]  # the step's own keys, last batch as in fit


class PenalisedLoss(keras.Model):
    def compute_loss(self, x: Any = None, y: Any = None, y_pred: Any = None, sample_weight: Any = None,
                     training: bool = True) -> Any:
        loss = super().compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training)
        return loss + 0.05 * tf.reduce_mean(tf.abs(y_pred))


def test_custom_compute_loss() -> None:
    def build() -> keras.Model:
        inputs = keras.Input((8,))
        return PenalisedLoss(inputs, _mlp()(inputs))

    x = _features()
    _run_both(build, _sparse_ce, x=x, y=_labels(x))


class ActivityPenalty(keras.layers.Layer):
    def call(self, inputs: Any) -> Any:
        self.add_loss(0.01 * tf.reduce_mean(tf.square(inputs)))
        return inputs


def test_add_loss_and_kernel_regularizer() -> None:
    def build() -> keras.Model:
        return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu",
                                                                       kernel_regularizer=keras.regularizers.L2(0.01)),
                                 ActivityPenalty(), keras.layers.Dense(3)])

    x = _features()
    _run_both(build, _sparse_ce, x=x, y=_labels(x))


def test_sample_weight() -> None:
    x = _features()
    weights = np.random.default_rng(2).uniform(0.1, 3.0, size=N).astype("float64")  # cast to floatx like Keras
    _run_both(_mlp, _sparse_ce, x=x, y=_labels(x), sample_weight=weights)


@pytest.mark.parametrize("make_optimizer", [
    lambda: keras.optimizers.SGD(keras.optimizers.schedules.ExponentialDecay(0.1, 2, 0.5), momentum=0.9,
                                 clipvalue=0.05),
    lambda: keras.optimizers.Adam(keras.optimizers.schedules.ExponentialDecay(0.02, 3, 0.7), clipnorm=0.1),
    lambda: keras.optimizers.RMSprop(1e-2, global_clipnorm=0.1),
], ids=["schedule_clipvalue", "schedule_clipnorm", "global_clipnorm"])
def test_optimizer_schedule_and_clipping(make_optimizer: Callable[[], Any]) -> None:
    x = _features()
    _run_both(_mlp, lambda: {**_sparse_ce(), "optimizer": make_optimizer()}, x=x, y=_labels(x))


@pytest.mark.parametrize("case", ["regression", "sparse", "one_hot"])
def test_string_and_stateful_metrics(case: str) -> None:
    x = _features()
    if case == "regression":
        build, y = (lambda: _mlp(outputs=1)), x[:, :1] - x[:, 1:2]
        compile_kw = {"loss": "mse", "metrics": ["mae", "mse"]}
    elif case == "sparse":
        build, y = (lambda: _mlp(activation="softmax")), _labels(x)
        compile_kw = {"loss": "sparse_categorical_crossentropy", "metrics": ["sparse_categorical_accuracy",
                                                                              "accuracy"]}
    else:
        build, y = (lambda: _mlp(activation="softmax")), np.eye(3, dtype="float32")[_labels(x)]
        compile_kw = {"loss": "categorical_crossentropy",
                      "metrics": ["accuracy", keras.metrics.AUC(), keras.metrics.F1Score(average="macro")]}
    out = _run_both(build, lambda: {"optimizer": keras.optimizers.Adam(1e-2), **compile_kw}, x=x, y=y)
    assert len(out["compiled"]) == len(compile_kw["metrics"]) + 1


def test_multi_input_dict_model_from_initial_epoch() -> None:
    def build() -> keras.Model:
        a, b = keras.Input((5,), name="a"), keras.Input((3,), name="b")
        merged = keras.layers.Concatenate()([keras.layers.Dense(8, activation="relu")(a), b])
        return keras.Model({"a": a, "b": b}, keras.layers.Dense(3)(merged))

    x = _features()
    out = _run_both(build, _sparse_ce, x={"a": x[:, :5], "b": x[:, 5:]}, y=_labels(x), epochs=3, initial_epoch=1)
    assert len(out["compiled"]["loss"]) == 2


class Reconstruction(keras.Model):
    """A model whose loss needs no y (an autoencoder's compute_loss reads x)."""

    def compute_loss(self, x: Any = None, y: Any = None, y_pred: Any = None, sample_weight: Any = None,
                     training: bool = True) -> Any:
        return tf.reduce_mean(tf.square(y_pred - x))


def test_model_without_targets() -> None:
    def build() -> keras.Model:
        inputs = keras.Input((8,))
        return Reconstruction(inputs, keras.layers.Dense(8)(keras.layers.Dense(4, activation="tanh")(inputs)))

    _run_both(build, lambda: {"optimizer": keras.optimizers.Adam(1e-2)}, x=_features(), y=None)


def test_epoch_level_callbacks(tmp_path: Path) -> None:
    """EarlyStopping stops (and restores its best weights), ReduceLROnPlateau puts learning_rate in the history,
    ModelCheckpoint's file loads with plain keras.models.load_model, CSVLogger writes the same rows."""
    def callbacks(tag: str) -> List[Any]:
        return [keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0, min_delta=10),
                keras.callbacks.EarlyStopping(monitor="loss", patience=2, min_delta=10, restore_best_weights=True),
                keras.callbacks.ModelCheckpoint(str(tmp_path / f"{tag}.keras")),
                keras.callbacks.CSVLogger(str(tmp_path / f"{tag}.csv"))]

    x = _features()
    out = _run_both(_mlp, _sparse_ce, x=x, y=_labels(x), epochs=6, callbacks=callbacks)
    assert len(out["compiled"]["loss"]) == 3  # stopped after 2 epochs without improvement
    np.testing.assert_allclose(out["compiled"]["learning_rate"], [0.01, 0.01, 0.005], rtol=1e-6)
    rows = {tag: list(csv.DictReader(open(tmp_path / f"{tag}.csv"))) for tag in ("keras", "compiled")}
    assert [list(r) for r in rows["compiled"]] == [list(r) for r in rows["keras"]]
    for got, want in zip(rows["compiled"], rows["keras"]):
        for key, value in want.items():  # "NA" where an epoch lacks a key (learning_rate before the first reduction)
            assert got[key] == value if value == "NA" else float(got[key]) == pytest.approx(float(value), rel=1e-5)
    loaded = {tag: keras.models.load_model(tmp_path / f"{tag}.keras") for tag in ("keras", "compiled")}
    for got, want in zip(loaded["compiled"].get_weights(), loaded["keras"].get_weights()):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def _compiled_once(model: keras.Model, x: np.ndarray, y: np.ndarray, **options: Any) -> Any:
    kw = dict(sample_weight=None, batch_size=BATCH, epochs=2, initial_epoch=0, shuffle=False, seed=0,
              validation=None, validation_batch_size=None, validation_freq=1, jit_compile=False, callbacks=[],
              verbose=0)
    kw.update(options)
    return run_compiled(model, x=x, y=y, **kw)


def test_shuffle_order_comes_from_seed_and_epoch() -> None:
    x = _features()
    finals = {}
    for name, shuffle, seed in (("a", True, 3), ("b", True, 3), ("c", True, 4)):
        keras.utils.set_random_seed(7)
        model = _mlp()
        model.compile(**_sparse_ce())
        _compiled_once(model, x, _labels(x), shuffle=shuffle, seed=seed)
        finals[name] = model.get_weights()[0]
    np.testing.assert_array_equal(finals["a"], finals["b"])
    assert np.abs(finals["a"] - finals["c"]).max() > 1e-4


def test_progress_bar_at_epoch_level(capsys: pytest.CaptureFixture) -> None:
    x = _features()
    model = _mlp()
    model.compile(**_sparse_ce())
    _compiled_once(model, x, _labels(x), verbose=1, validation=(x, _labels(x)))  # (x, y) is taken too
    out = capsys.readouterr().out
    assert "Epoch 2/2" in out and "4/4" in out and "val_loss" in out


class BatchCounter(keras.callbacks.Callback):
    def on_train_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        pass


@pytest.mark.parametrize("callback,reason", [
    (lambda p: keras.callbacks.LambdaCallback(on_batch_end=lambda b, logs: None),
     "callback LambdaCallback has per-batch hooks (on_batch_end)"),
    (lambda p: keras.callbacks.TerminateOnNaN(), "callback TerminateOnNaN has per-batch hooks (on_batch_end)"),
    (lambda p: BatchCounter(), "callback BatchCounter has per-batch hooks (on_train_batch_end)"),
    (lambda p: keras.callbacks.ModelCheckpoint(str(p / "m.keras"), save_freq=3),
     "callback ModelCheckpoint saves every 3 batches (save_freq=3)"),
    (lambda p: keras.callbacks.BackupAndRestore(str(p / "b"), save_freq=5),
     "callback BackupAndRestore saves every 5 batches (save_freq=5)"),
    (lambda p: keras.callbacks.TensorBoard(str(p / "tb"), update_freq="batch", write_steps_per_second=True,
                                           profile_batch=2),
     "callback TensorBoard writes per batch (update_freq=1, write_steps_per_second=True, profile_batch is set)"),
], ids=["lambda", "terminate_on_nan", "subclass", "checkpoint", "backup", "tensorboard"])
def test_blockers_name_per_batch_callbacks(callback: Callable[[Path], Any], reason: str, tmp_path: Path) -> None:
    assert compiled_blockers(_mlp(), callbacks=[callback(tmp_path)]) == [reason]


def test_epoch_level_callbacks_do_not_block(tmp_path: Path) -> None:
    model = _mlp()
    model.compile(**_sparse_ce())
    cbs = keras.callbacks
    callbacks = [cbs.EarlyStopping(), cbs.ReduceLROnPlateau(), cbs.CSVLogger(str(tmp_path / "l.csv")),
                 cbs.ModelCheckpoint(str(tmp_path / "m.keras")), cbs.BackupAndRestore(str(tmp_path / "b")),
                 cbs.TensorBoard(str(tmp_path / "tb")), cbs.ProgbarLogger(), cbs.History(),
                 cbs.LearningRateScheduler(lambda epoch, lr: lr),
                 cbs.LambdaCallback(on_epoch_end=lambda epoch, logs: None, on_batch_end=None)]
    assert compiled_blockers(model, callbacks=callbacks) == []


def test_blockers_for_the_model_and_steps_per_execution(cpu_replicas: List[str]) -> None:
    model = _mlp()
    model.compile(optimizer="sgd", loss="mse", run_eagerly=True)
    assert compiled_blockers(model, callbacks=[], steps_per_execution_given=True) == [
        "the model was compiled with run_eagerly=True",
        "steps_per_execution was given (the compiled loop runs whole epochs)"]
    with tf.distribute.MirroredStrategy(cpu_replicas).scope():
        mirrored = _mlp()
    assert compiled_blockers(mirrored, callbacks=[]) == ["the model's strategy has 2 replicas (needs one)"]


def test_errors_name_the_problem() -> None:
    x = _features()
    with pytest.raises(ValueError, match="the model is not compiled; call model.compile"):
        _compiled_once(_mlp(), x, _labels(x))
    model = _mlp()
    model.compile(**_sparse_ce())
    with pytest.raises(ValueError, match="the data has 0 examples"):
        _compiled_once(model, x[:0], _labels(x)[:0])
    with pytest.raises(ValueError, match=r"validation_freq must be an int .* received validation_freq='2' of "
                                         r"type str"):
        _compiled_once(model, x, _labels(x), validation=(x, _labels(x), None), validation_freq="2")


# ------------------------------------------------------------------------------------ later fit calls (the cache)

class CountingModel(keras.Model):
    """A model whose train_step counts its traces (Python runs only while TensorFlow traces)."""

    traces = 0

    def train_step(self, data: Any) -> Any:
        type(self).traces += 1
        return super().train_step(data)


def _two_calls(tag: str, model: keras.Model, calls: List[tuple]) -> List[Dict[str, List[float]]]:
    histories = []
    for x, y in calls:
        if tag == "keras":
            histories.append(model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0).history)
        else:
            histories.append(run_compiled(model, x=x, y=y, sample_weight=None, batch_size=BATCH, epochs=2,
                                          initial_epoch=0, shuffle=False, seed=0, validation=None,
                                          validation_batch_size=None, validation_freq=1, jit_compile=False,
                                          callbacks=[], verbose=0).history)
    return histories


@pytest.mark.parametrize("n", [96, 100], ids=["whole_batches", "partial_last_batch"])
def test_later_fit_calls_reuse_the_traced_loop_on_their_own_data(n: int) -> None:
    """Three calls (the second on other arrays of the same shapes): each trains on its own data exactly like three
    Keras fit calls, and only the first call traces, as Keras traces its train function once."""
    calls = [(_features(n, seed=s), _labels(_features(n, seed=s))) for s in (0, 1, 0)]
    runs = {}
    for tag in ("keras", "compiled"):
        keras.utils.set_random_seed(7)
        inputs = keras.Input((8,))
        model = CountingModel(inputs, keras.layers.Dense(3)(keras.layers.Dense(16, activation="relu")(inputs)))
        model.compile(**_sparse_ce())
        CountingModel.traces = 0
        histories = _two_calls(tag, model, calls[:1])
        first = CountingModel.traces
        histories += _two_calls(tag, model, calls[1:])
        runs[tag] = (model, histories, first, CountingModel.traces)
    (fit_model, fit_histories, _, _), (model, histories, first, total) = runs["keras"], runs["compiled"]
    for got, want in zip(histories, fit_histories):
        for key in want:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-7, err_msg=key)
    for got, want in zip(model.get_weights(), fit_model.get_weights()):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    assert first >= 1 and total == first, f"traced {first} times in the first call, {total - first} after"


def test_a_new_compile_traces_again_and_trains_what_keras_trains() -> None:
    """A recompiled model (another loss and learning rate) must not run the loop traced for the old compile."""
    x = _features()
    y = _labels(x)

    def train(tag: str) -> keras.Model:
        keras.utils.set_random_seed(7)
        model = _mlp()
        model.compile(**_sparse_ce())
        _two_calls(tag, model, [(x, y)])
        model.compile(optimizer=keras.optimizers.SGD(0.3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        _two_calls(tag, model, [(x, y)])
        return model

    fit_model, model = train("keras"), train("compiled")
    for got, want in zip(model.get_weights(), fit_model.get_weights()):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_a_cached_pass_keeps_no_data_after_the_call() -> None:
    from tfaccel.train.loops.compiled import cached_pass

    model = _mlp()
    model.compile(**_sparse_ce())
    x = _features()
    _two_calls("compiled", model, [(x, _labels(x))])
    data = (tf.constant(x), tf.constant(_labels(x)))
    again = cached_pass(model, "train_step", data, batch_size=BATCH, jit=False)
    assert again is cached_pass(model, "train_step", data, batch_size=BATCH, jit=False)  # the one cached pass
    again.release()
    assert all(one._data is None for _, one in model.__dict__["_tfaccel_compiled_passes"].values())


def test_a_custom_train_step_is_traced_twice_as_in_keras_fit(clean_tf_config) -> None:
    """Keras' own test_retracing: a custom ``train_step`` was traced 3 times here (the step's first trace created the
    optimizer's slots, so tf.function traced it again, then the epoch loop); Keras ``fit`` traces it at most twice."""
    import tfaccel

    count = [0]

    class Counting(keras.Model):
        def train_step(self, *args):
            count[0] += 1
            return super().train_step(*args)

    with tfaccel.scope(strategy="default"):
        inputs = keras.Input([4])
        model = Counting(inputs, keras.layers.Dense(1)(inputs))
        model.compile(loss="mse", optimizer="adam", metrics=["mae"], steps_per_execution=20)
    result = tfaccel.fit(model, np.ones((100, 4)), np.ones((100, 1)), batch_size=1, epochs=1, verbose=0)
    assert result.details["loop_name"] == "compiled" and count[0] == 2
