"""The loop tfaccel.fit picks, seen through compile_and_fit: the compiled loop trains exactly like Keras fit,
"auto" says why it used Keras fit, "compiled" is refused where it cannot be exact, steps_per_execution and XLA
are chosen with their reason. (Case-by-case parity of the compiled loop with model.fit: test_train_compiled.py.)"""

import logging
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "strategies"))

from strategies_logs import tfaccel_records  # noqa: E402

import tfaccel  # noqa: E402
from tfaccel.errors import ConfigError  # noqa: E402


def _build():
    import keras

    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"),
                             keras.layers.Dense(3, activation="softmax")])


def _data(n=70):  # 70 = 4 full batches of 16 + a partial batch of 6
    rng = np.random.default_rng(3)
    x = rng.standard_normal((n, 6)).astype("float32")
    return x, (x[:, 0] > 0).astype("int32") + (x[:, 1] > 0).astype("int32")


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_compiled_loop_matches_keras_fit(optimizer, clean_tf_config):
    x, y = _data()
    runs = {}
    for loop in ("keras", "compiled"):
        result = tfaccel.compile_and_fit(_build, (x, y), validation_data=(x[:20], y[:20]), epochs=3,
                                         global_batch_size=16, strategy="default", optimizer=optimizer,
                                         learning_rate=0.05, loss="sparse_categorical_crossentropy",
                                         metrics=["accuracy"], seed=5, shuffle=False, loop=loop, verbose=0)
        assert result.details["loop"].startswith("compiled" if loop == "compiled" else "Keras fit (asked for)")
        assert result.steps == 3 * 5  # the partial batch is a step of its own
        runs[loop] = result
    assert set(runs["keras"].history) == set(runs["compiled"].history) == {"loss", "accuracy", "val_loss",
                                                                            "val_accuracy"}
    for a, b in zip(runs["keras"].model.get_weights(), runs["compiled"].model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    for key in runs["keras"].history:
        np.testing.assert_allclose(runs["keras"].history[key], runs["compiled"].history[key], rtol=1e-5, atol=1e-6)


def test_auto_picks_the_compiled_loop_for_one_device_arrays(clean_tf_config):
    x, y = _data()
    result = tfaccel.compile_and_fit(_build, (x, y), epochs=1, global_batch_size=16, strategy="default",
                                     loss="sparse_categorical_crossentropy", verbose=0, seed=0)
    assert result.details["loop"] == ("compiled whole-epoch loop running the model's train_step (one replica, "
                                      "array data)")
    assert "steps_per_execution" not in result.details  # a Keras fit setting: the compiled loop runs whole epochs
    phases = result.details["phases"]  # each phase of the call, the compiled loop's own ones among them
    assert list(phases) == ["plan_s", "data_s", "loop_choice_s", "example_order_s", "model_changes_s", "resume_s",
                            "callbacks_s", "to_device_s", "trace_s", "first_call_s", "epochs_s", "loop_other_s",
                            "result_s"], phases
    assert phases["trace_s"] > 0 and phases["first_call_s"] > 0 and all(v >= 0 for v in phases.values())
    loop = sum(phases[k] for k in ("to_device_s", "trace_s", "first_call_s", "epochs_s", "loop_other_s"))
    assert loop == pytest.approx(result.seconds, abs=0.01)


def test_auto_uses_keras_fit_with_the_reason_when_blocked(clean_tf_config):
    import keras

    class PerBatch(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def on_train_batch_end(self, batch, logs=None):
            self.calls += 1

    x, y = _data()
    counter = PerBatch()
    result = tfaccel.compile_and_fit(_build, (x, y), epochs=2, global_batch_size=16, strategy="default",
                                     loss="sparse_categorical_crossentropy", callbacks=[counter], verbose=0)
    assert result.details["loop"] == "Keras fit (callback PerBatch has per-batch hooks (on_train_batch_end))"
    # Every batch seen once: steps_per_execution stays 1 for a per-batch callback.
    assert result.details["steps_per_execution"] == "1 (1: per-batch callbacks must see every batch)"
    assert counter.calls == 2 * 5
    phases = result.details["phases"]  # Keras fit measures no phases of its own: its epochs and the rest
    assert {"plan_s", "data_s", "epochs_s", "loop_other_s", "result_s"} <= set(phases) and "trace_s" not in phases
    assert phases["epochs_s"] + phases["loop_other_s"] == pytest.approx(result.seconds, abs=0.01)


def test_compiled_loop_refused_where_it_cannot_run(clean_tf_config, cpu_replicas):
    import tensorflow as tf

    x, y = _data()
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    with pytest.raises(ConfigError, match=r"loop='compiled' cannot train this job exactly like Keras fit under "
                                          r"mirrored: data is a tf.data.Dataset, not in-memory arrays. Use "
                                          r"loop='auto' \(Keras fit then trains it\)"):
        tfaccel.compile_and_fit(_build, ds, strategy="mirrored", loss="sparse_categorical_crossentropy",
                                loop="compiled", verbose=0)


def test_unknown_loop(clean_tf_config):
    x, y = _data()
    with pytest.raises(ConfigError, match=r"loop: unknown value 'fast'; valid values are: 'auto', 'keras', 'compiled'"):
        tfaccel.compile_and_fit(_build, (x, y), loss="mse", loop="fast")


def _multi_worker_shaped(monkeypatch):
    """The message path only: the backend is swapped for a multi_worker-shaped one in this single process (the real
    two-process run is test_training_fit.py::test_multi_worker_two_processes_identical_weights_and_history)."""
    import tensorflow as tf

    import tfaccel.plan
    import tfaccel.train.scope
    from tfaccel.strategies.base import Backend

    real_resolve = tfaccel.plan.resolve_plan

    def multi_worker_shaped(**kwargs):
        plan, _ = real_resolve(strategy="default")
        return plan, Backend(name="multi_worker", strategy=tf.distribute.get_strategy())

    monkeypatch.setattr(tfaccel.train.scope, "resolve_plan", multi_worker_shaped)  # where scope() looks it up


def test_multi_worker_steps_per_execution_falls_back_with_a_warning(monkeypatch, clean_tf_config):
    _multi_worker_shaped(monkeypatch)
    x, y = _data()
    with tfaccel_records() as records:
        result = tfaccel.compile_and_fit(_build, (x, y), epochs=1, global_batch_size=16, steps_per_execution=8,
                                         loss="sparse_categorical_crossentropy", verbose=0, seed=0, loop="keras")
    assert result.details["steps_per_execution"] == ("1 (multi_worker: Keras 3.15's multi-step loop fails under "
                                                     "MultiWorkerMirroredStrategy)")
    assert result.model.steps_per_execution == 1
    assert ("steps_per_execution=8 cannot work under multi_worker (Keras 3.15's multi-step loop fails under "
            "MultiWorkerMirroredStrategy); using 1") in [r.getMessage() for r in records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("n,kwargs,expected", [
    (100 * 16, {}, "64 (auto: min(steps/epoch=100, 64))"),
    (12 * 16, {}, "12 (auto: min(steps/epoch=12, 64))"),
    (12 * 16, {"steps_per_execution": 5}, "5 (given)"),
    (12 * 16, {"backup_freq": 4}, "1 (1: per-batch callbacks must see every batch)"),  # a backup every 4 steps
])
def test_auto_steps_per_execution_on_keras_fit(n, kwargs, expected, clean_tf_config, tmp_path):
    x, y = _data(n)
    if "backup_freq" in kwargs:
        kwargs = {**kwargs, "backup_dir": str(tmp_path / "backup")}
    result = tfaccel.compile_and_fit(_build, (x, y), epochs=1, global_batch_size=16, strategy="default", loop="keras",
                                     loss="sparse_categorical_crossentropy", verbose=0, seed=0, **kwargs)
    assert result.details["steps_per_execution"] == expected
    assert result.model.steps_per_execution == int(expected.split()[0])


@pytest.mark.parametrize("conv,requested,expected", [(True, "auto", False), (False, "auto", False),
                                                     (True, True, True), (True, False, False)])
def test_auto_xla_assumes_a_slow_down_for_convolutions_on_cpu(conv, requested, expected, clean_tf_config):
    import keras

    from tfaccel.train.xla_payback import CONV_CPU_PRIOR

    def build():
        layers = [keras.Input((8, 8, 1))]
        layers += [keras.layers.Conv2D(4, 3)] if conv else []
        layers += [keras.layers.Flatten(), keras.layers.Dense(3, activation="softmax")]
        return keras.Sequential(layers)

    x = np.random.default_rng(0).random((32, 8, 8, 1), dtype=np.float32)
    y = np.arange(32) % 3
    result = tfaccel.compile_and_fit(build, (x, y), global_batch_size=16, strategy="default", jit_compile=requested,
                                     loss="sparse_categorical_crossentropy", verbose=0)
    assert result.model.jit_compile is expected and result.plan.jit_compile is expected  # what the loop ran
    if requested == "auto":  # decided once the model existed, on its layers: the prior is stated
        prior = result.details["xla_auto"]["prior"]
        assert (prior["speedup"] < 1) is conv and (CONV_CPU_PRIOR.source in result.plan.jit_reason) is conv
        assert (CONV_CPU_PRIOR.source in result.details["jit_compile"]) is conv, result.details
    else:
        assert CONV_CPU_PRIOR.source not in result.details.get("jit_compile", "")
