"""The parameter-server loop (tfaccel/train/loops/coordinator.py) trains the user's compiled model as Keras fit would.

Parity runs a real chief + 1 worker + 1 ps on 127.0.0.1 (tests/training/scripts/ps_parity_job.py): with one worker
the closures run one after the other, so the coordinator loop must give ``model.fit``'s history and weights.
What the loop cannot train exactly is refused before anything runs; those message paths run here without a
cluster, the backend swapped for a parameter_server-shaped one over the default strategy.
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import harness
import tfaccel
from tfaccel.errors import ConfigError
from tfaccel.train.optim import scaled_schedule

PARITY_JOB = Path(__file__).parent / "scripts" / "ps_parity_job.py"


@pytest.mark.parametrize("api", ["fit", "compile_and_fit", "dataset_fn"])
def test_parameter_server_trains_like_keras_fit(api, tmp_path):
    """kernel_regularizer + activity_regularizer (add_loss) + sample_weight + metrics ["accuracy", "mae"] +
    validation_data, 100 examples in batches of 16 (a partial last batch), SGD with momentum, 3 epochs."""
    cluster = harness.loopback_cluster(1, ps=1, chief=True)
    tasks = harness.tf_configs_for(cluster, roles=("ps", "worker", "chief"))
    results = harness.run_tasks(PARITY_JOB, tasks=tasks, timeout=170,
                                env={"PS_TEST_DONE": str(tmp_path / "done"), "PARITY_API": api})
    harness.assert_all_ok(results)
    out = harness.last_json_line([r for r in results if r.task_type == "chief"][0].stdout)
    got, expected = out["history"], out["expected"]
    diffs = {k: max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(got[k], expected[k])) for k in expected}
    print(f"measured ({api}): max relative history difference per key {json.dumps(diffs)}; "
          f"max weight difference {out['max_weight_diff']}")
    assert out["strategy"] == "parameter_server" and out["loop"].startswith("parameter_server")
    assert sorted(got) == sorted(expected) == ["accuracy", "loss", "mae", "val_accuracy", "val_loss", "val_mae"]
    for key in expected:
        np.testing.assert_allclose(got[key], expected[key], rtol=1e-5, err_msg=key)
    assert out["max_weight_diff"] <= 1e-5
    assert out["steps"] == out["optimizer_iterations"] == 3 * 7  # 6 whole batches + the partial one, per epoch
    # The model stays the user's: compiled, with its loss, metrics and optimizer.
    assert out["compiled"] and out["loss"] == "categorical_crossentropy" and out["optimizer"] == "SGD"
    assert out["metrics_names"] == ["loss", "compile_metrics"]
    accounting = out["ps_accounting"]  # one worker, nothing lost: exactly what was scheduled
    assert accounting["updates_scheduled"] == accounting["updates_applied"] == 21
    assert accounting["updates_counted_per_worker"] == {"worker:0": 21} and accounting["updates_not_counted"] == 0
    assert accounting["examples_seen"] == {"worker:0": 300} and accounting["closures_rerun"] == 0
    # Keras' own evaluate on the trained model gives the coordinator's validation metrics of the last epoch.
    assert sorted(out["evaluated"]) == ["accuracy", "loss", "mae"]
    for key, value in out["evaluated"].items():
        np.testing.assert_allclose(value, got[f"val_{key}"][-1], rtol=1e-6, err_msg=key)
    # The .keras file loads in plain Keras, in a process that never imports tfaccel, and predicts the same.
    loaded = subprocess.run([sys.executable, "-c", PLAIN_KERAS_LOAD, out["saved"]], capture_output=True, text=True,
                            timeout=120)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    plain = harness.last_json_line(loaded.stdout)
    assert plain["tfaccel_imported"] is False
    np.testing.assert_allclose(plain["predicted_sum"], out["predicted_sum"], rtol=1e-5)


PLAIN_KERAS_LOAD = """
import json, sys
import keras, numpy as np
model = keras.models.load_model(sys.argv[1])
x = np.load(sys.argv[1] + ".val_x.npy")
print(json.dumps({"predicted_sum": float(np.sum(model.predict(x, batch_size=16, verbose=0))),
                  "tfaccel_imported": "tfaccel" in sys.modules}))
"""


# ------------------------------------------------------------------------------------------ refusals, no cluster
@pytest.fixture
def ps_shaped(monkeypatch, clean_tf_config):
    """scope()/fit() get a parameter_server backend over the default strategy, without a ClusterCoordinator."""
    import tensorflow as tf

    import tfaccel.plan
    import tfaccel.train.scope
    from tfaccel.strategies.base import Backend

    real_resolve = tfaccel.plan.resolve_plan

    def resolve(**kwargs):
        plan, _ = real_resolve(strategy="default")
        return plan, Backend(name="parameter_server", strategy=tf.distribute.get_strategy(), uses_keras_fit=False)

    monkeypatch.setattr(tfaccel.train.scope, "resolve_plan", resolve)  # where scope() looks it up
    yield
    monkeypatch.undo()
    with tfaccel.scope(strategy="default"):  # the default strategy's plan is the real one again for later tests
        pass


def _model(metrics=("accuracy",), model_class=None, optimizer="adam"):
    import keras

    with tfaccel.scope(strategy="parameter_server"):
        layers = [keras.Input((4,)), keras.layers.Dense(3, activation="softmax")]
        model = (model_class or keras.Sequential)(layers)
        model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=list(metrics))
    return model


def _data(n=40):
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, 4)).astype("float32"), rng.integers(0, 3, n)


def test_custom_train_step_is_refused(ps_shaped):
    import keras

    class OwnStep(keras.Sequential):
        def train_step(self, data):
            return super().train_step(data)

    model = _model(model_class=OwnStep)
    with pytest.raises(ConfigError, match=r"model OwnStep overrides train_step, which strategy parameter_server "
                                          r"cannot run: .*keras-team/keras#18624.* Override compute_loss / "
                                          r"compute_metrics instead \(both are honoured\)"):
        tfaccel.fit(model, *_data(), batch_size=8)
    assert int(model.optimizer.iterations.numpy()) == 0


@pytest.mark.parametrize("metric, name", [("auc", "AUC"), ("f1", "F1Score")])
def test_metrics_that_are_not_means_are_refused(ps_shaped, metric, name):
    import keras

    made = keras.metrics.AUC(name="auc") if metric == "auc" else keras.metrics.F1Score(name="f1")
    model = _model()
    with tfaccel.scope(strategy="parameter_server"):
        model.compile(optimizer="adam", loss="categorical_crossentropy", metrics=["accuracy", made])
    x, y = _data()
    y = np.eye(3, dtype="float32")[y]
    with pytest.raises(ConfigError, match=rf"metrics: {name} \(name '{metric}'\) cannot be computed under strategy "
                                          r"parameter_server: Keras metric objects miscount .* mean metrics "
                                          r"\(accuracy variants, mae, mse"):
        tfaccel.fit(model, x, y, batch_size=8)


@pytest.mark.parametrize("what", ["schedule", "use_ema", "scaled schedule", "loss scaling"])
def test_accumulation_with_what_keras_does_per_micro_batch_is_refused(ps_shaped, what):
    """Keras' own accumulation reads a schedule, updates use_ema's averages and skips an overflowing loss-scaled
    gradient at every micro-batch; the coordinator loop's closures apply one update per 2 micro-batches, so it
    refuses instead of training something else. A constant rate, scaled by tfaccel (a ScaledSchedule around a
    number), is no schedule of the user's."""
    import keras

    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=2, decay_rate=0.5)
    optimizer = {"schedule": lambda: keras.optimizers.SGD(schedule),
                 "use_ema": lambda: keras.optimizers.SGD(0.1, use_ema=True),
                 "scaled schedule": lambda: keras.optimizers.SGD(scaled_schedule(schedule, 2.0)),
                 "loss scaling": lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))}[what]()
    model = _model(optimizer=optimizer)
    x, y = _data()
    kept = {"use_ema": "use_ema", "loss scaling": "loss scaling"}.get(what, "a learning-rate schedule")
    name = "LossScaleOptimizer" if what == "loss scaling" else "SGD"
    with pytest.raises(ConfigError, match=rf"strategy parameter_server: gradient_accumulation_steps=2 with {kept} "
                                          rf"\({name}\): Keras' own accumulation reads the schedule, updates the "
                                          r"moving averages and skips an overflowing loss-scaled gradient at every "
                                          r"micro-batch.* Use gradient_accumulation_steps=1 with a 2x batch, or "
                                          r"strategy 'multi_worker'"):
        tfaccel.fit(model, x[:32], y[:32], batch_size=8, gradient_accumulation_steps=2)
    assert int(model.optimizer.iterations.numpy()) == 0
    constant = _model(optimizer=keras.optimizers.SGD(scaled_schedule(0.1, 2.0)))
    with pytest.raises(ConfigError, match=r"no ClusterCoordinator"):  # past the check: nothing to refuse
        tfaccel.fit(constant, x[:32], y[:32], batch_size=8, gradient_accumulation_steps=2)


def test_mean_metrics_pass_the_check_and_the_missing_coordinator_is_named(ps_shaped):
    model = _model(metrics=["accuracy", "sparse_categorical_accuracy", "sparse_top_k_categorical_accuracy"])
    with pytest.raises(ConfigError, match=r"parameter_server backend has no ClusterCoordinator; is this process "
                                          r"the chief\?"):
        tfaccel.fit(model, *_data(), batch_size=8)
    assert model.optimizer.built  # built inside the scope before the first step


def test_data_and_callbacks_it_cannot_honour_are_refused(ps_shaped):
    import keras
    import tensorflow as tf

    model = _model()
    x, y = _data()
    with pytest.raises(ConfigError, match=r"strategy parameter_server: x is a tf.data.Dataset; every worker builds "
                                          r"its own input pipeline, so pass arrays .* or a dataset_fn"):
        tfaccel.fit(model, tf.data.Dataset.from_tensor_slices((x, y)).batch(8))
    with pytest.raises(ConfigError, match=r"strategy parameter_server: steps_per_epoch=2 with arrays of 40 examples "
                                          r"and batch 8 \(5 batches\) cannot keep Keras' one pass"):
        tfaccel.fit(model, x, y, batch_size=8, steps_per_epoch=2)
    with pytest.raises(ConfigError, match=r"gradient_accumulation_steps=2 does not divide the 5 steps of an epoch"):
        tfaccel.fit(model, x, y, batch_size=8, gradient_accumulation_steps=2)
    with pytest.raises(ConfigError, match=r"strategy parameter_server: callback LambdaCallback has per-batch hooks "
                                          r"\(on_batch_end\)\. The coordinator loop runs batches in closures"):
        tfaccel.fit(model, x, y, batch_size=8, callbacks=[keras.callbacks.LambdaCallback(on_batch_end=print)])
    with pytest.raises(ConfigError, match=r"validation_freq must be an int \(every N epochs\) or a list of 1-based "
                                          r"epochs; received validation_freq='every'"):
        tfaccel.fit(model, x, y, batch_size=8, validation_data=(x, y), validation_freq="every")
    with pytest.raises(ConfigError, match=r"loop='compiled': strategy parameter_server trains with tfaccel's "
                                          r"ClusterCoordinator loop only"):
        tfaccel.fit(model, x, y, batch_size=8, loop="compiled")
    with pytest.raises(ConfigError, match=r"steps_per_execution=4: strategy parameter_server runs its steps in "
                                          r"closures scheduled on the workers"):
        tfaccel.fit(model, x, y, batch_size=8, steps_per_execution=4)
    assert int(model.optimizer.iterations.numpy()) == 0
