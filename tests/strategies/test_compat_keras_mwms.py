"""The Keras 3 MultiWorkerMirroredStrategy fix: guarded, idempotent, reversible, and still needed upstream."""

import logging
from pathlib import Path

import numpy as np
import pytest

import harness
from strategies_logs import tfaccel_records
from tfaccel.compat import is_disabled, keras_mwms

PROGRAM = Path(__file__).with_name("strategies_fit_program.py")
UPSTREAM_MESSAGE = ("with an unsupported type (<class 'tensorflow.python.distribute.values.PerReplica'>) to a "
                    "Tensor.")


@pytest.fixture
def log_records():
    with tfaccel_records() as records:
        yield records


@pytest.fixture
def fix_removed():
    was = keras_mwms.is_applied()
    keras_mwms.remove()
    yield
    keras_mwms.remove()
    if was:
        keras_mwms.apply(force=True)


def test_apply_is_idempotent_and_reversible(fix_removed, monkeypatch) -> None:
    from keras.src.backend.tensorflow import trainer

    monkeypatch.delenv("TFACCEL_DISABLE_COMPAT", raising=False)
    original_build = trainer.TensorFlowTrainer.__dict__["_maybe_symbolic_build"]
    original_reduce = trainer.reduce_per_replica
    assert keras_mwms.is_needed() and not keras_mwms.is_applied()
    assert keras_mwms.apply() and keras_mwms.apply()  # twice: no double wrapping
    assert trainer.TensorFlowTrainer._maybe_symbolic_build._tfaccel_fix == "keras_mwms"
    assert trainer.reduce_per_replica._tfaccel_fix == "keras_mwms"
    assert trainer.reduce_per_replica.__closure__ is not None
    assert keras_mwms.remove() and not keras_mwms.remove()
    assert trainer.TensorFlowTrainer.__dict__["_maybe_symbolic_build"] is original_build
    assert trainer.reduce_per_replica is original_reduce


def test_outside_the_version_range_it_does_not_patch(fix_removed, monkeypatch, log_records) -> None:
    import keras

    monkeypatch.delenv("TFACCEL_DISABLE_COMPAT", raising=False)
    monkeypatch.setattr(keras, "__version__", "3.16.0")
    assert not keras_mwms.is_needed()
    assert not keras_mwms.apply() and not keras_mwms.is_applied()
    text = "\n".join(r.getMessage() for r in log_records)
    assert "compat fix keras_mwms not applied: Keras 3.16.0 is outside the versions this fix is known to be needed " \
           "on (3.0 up to 3.15.x); not patching" in text
    assert "keras-team/keras#20585" in text


def test_changed_keras_code_is_not_patched(fix_removed, monkeypatch) -> None:
    from keras.src.backend.tensorflow import trainer

    monkeypatch.delattr(trainer, "reduce_per_replica")
    reason = keras_mwms.why_not_needed()
    assert reason is not None and "no longer has reduce_per_replica" in reason and "not patching" in reason


def test_switched_off_by_env(fix_removed, monkeypatch, log_records) -> None:
    monkeypatch.setenv("TFACCEL_DISABLE_COMPAT", "something, keras_mwms")
    assert is_disabled("keras_mwms") and not is_disabled("other")
    assert not keras_mwms.apply()
    assert any("compat fix keras_mwms: switched off by TFACCEL_DISABLE_COMPAT (keras_mwms)"
               in r.getMessage() and r.levelno == logging.WARNING for r in log_records)
    assert keras_mwms.apply(force=True)
    monkeypatch.setenv("TFACCEL_DISABLE_COMPAT", "all")
    assert is_disabled("keras_mwms")


def test_fix_leaves_single_process_strategies_alone(fix_removed, cpu_replicas, monkeypatch) -> None:
    """Under MirroredStrategy (not multi-worker) the patched functions defer to Keras' own."""
    import keras
    import tensorflow as tf

    monkeypatch.delenv("TFACCEL_DISABLE_COMPAT", raising=False)
    assert keras_mwms.apply()
    strategy = tf.distribute.MirroredStrategy(cpu_replicas, cross_device_ops=tf.distribute.ReductionToOneDevice())
    x = np.ones((32, 3), "float32")
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    history = model.fit(tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(8), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0]) and np.isfinite(history.history["mae"][0])


def test_upstream_failure_still_happens_without_the_fix() -> None:
    """When this fails because fit now works, the upstream bug is fixed: narrow AFFECTED_VERSIONS / retire the fix."""
    results = harness.run_tasks(PROGRAM, workers=2, timeout=150, env={"TFACCEL_DISABLE_COMPAT": "keras_mwms"})
    for result in results:
        out = harness.last_json_line(result.stdout)
        assert result.returncode == 3 and not out["ok"], result.describe()
        assert out["type"] == "ValueError"
        assert out["message"].startswith("Attempt to convert a value (PerReplica:{")
        assert out["message"].endswith(UPSTREAM_MESSAGE)
        assert "TFACCEL_DISABLE_COMPAT" in result.stderr


def test_both_halves_of_the_fix_are_needed() -> None:
    """With only the _maybe_symbolic_build half, Keras' reduce_per_replica fails on the scalar metrics."""
    results = harness.run_tasks(PROGRAM, workers=2, timeout=150, args=["--only-build-fix"],
                                env={"TFACCEL_DISABLE_COMPAT": ""})
    for result in results:
        out = harness.last_json_line(result.stdout)
        assert result.returncode == 3 and not out["ok"], result.describe()
        assert out["message"].startswith("Invalid reduction dimension 0 for input with 0 dimensions.")


def test_a_metric_returning_its_variable_trains_under_multi_worker() -> None:
    """keras-io's CategoricalTruePositives returns its state variable from result(): strategy.reduce cannot take a
    variable (before the fix: "Cannot convert `input_tensor` to a `PerReplica` object"); it is synchronized, so it
    is the count over both workers' examples, the same in each."""
    results = harness.run_tasks(PROGRAM, workers=2, timeout=150, args=["--variable-metric", "--epochs", "1"],
                                env={"TFACCEL_DISABLE_COMPAT": ""})
    harness.assert_all_ok(results)
    outs = [harness.last_json_line(r.stdout) for r in results]
    assert outs[0]["below"] == outs[1]["below"] and outs[0]["weights_sha"] == outs[1]["weights_sha"]
    assert outs[0]["below"][0] == int(outs[0]["below"][0]) and 0 < outs[0]["below"][0] <= 128


def test_multi_step_loop_still_fails_under_multi_worker() -> None:
    """Not covered by the fix: Keras' steps_per_execution > 1 loop fails under MWMS (compile_and_fit uses 1 there).

    When this starts passing, compile_and_fit may run several steps per execution on multi_worker too.
    """
    results = harness.run_tasks(PROGRAM, workers=2, timeout=150, args=["--steps-per-execution", "4"],
                                env={"TFACCEL_DISABLE_COMPAT": ""})
    for result in results:
        out = harness.last_json_line(result.stdout)
        assert result.returncode == 3 and not out["ok"], result.describe()
        assert "You must feed a value for placeholder tensor" in out["message"]
        assert "while/cond" in out["message"]
