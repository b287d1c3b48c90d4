"""A model with two outputs reports Keras fit's per-output losses (``cls_loss``, ``reg_loss``) on tfaccel's own
loops, a partial last batch included (differential tests against plain ``model.fit``, same seed).

Keras 3.15 weights each batch's per-output loss by ``y_pred.shape[0]``, the *static* batch size, which its fit
never knows (its batches of arrays have shape ``(None, ...)``), so every batch counts the same. tfaccel's compiled,
multi-step and parameter-server loops gathered batches of a known size: the per-output losses were averaged by
example instead (``cls_loss`` 1.280 against Keras' 1.358 here), while ``loss``, the metrics and the weights agreed.
Found by random ``fit`` arguments against plain ``model.fit``.
"""

from pathlib import Path
from typing import Any, Dict, List

import keras
import numpy as np
import pytest
import tensorflow as tf

import harness
import tfaccel

PS_JOB = Path(__file__).parent / "scripts" / "ps_two_outputs_job.py"
R = np.random.default_rng(0)
X = R.normal(size=(41, 4)).astype("float32")  # batch 16: 16, 16 and a partial 9
Y = {"cls": R.integers(0, 3, size=(41,)).astype("int32"), "reg": R.normal(size=(41, 1)).astype("float32")}
SAMPLE_WEIGHT = R.uniform(0.2, 2.0, size=(41,)).astype("float32")


def _model() -> keras.Model:
    keras.utils.set_random_seed(7)
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    model = keras.Model(inputs, {"cls": keras.layers.Dense(3, activation="softmax", name="cls")(hidden),
                                 "reg": keras.layers.Dense(1, name="reg")(hidden)})
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss={"cls": "sparse_categorical_crossentropy", "reg": "mse"},
                  loss_weights={"cls": 1.0, "reg": 0.5}, metrics={"cls": ["accuracy"], "reg": ["mae"]})
    return model


def _check(history: Dict[str, List[float]], result: tfaccel.FitResult, loop: str) -> None:
    assert result.details["loop_name"] == loop, result.details["loops_rejected"]
    assert sorted(result.history) == sorted(history)
    assert {"cls_loss", "reg_loss"} <= set(history)
    for key, values in history.items():
        np.testing.assert_allclose(result.history[key], values, rtol=1e-5, atol=1e-7, err_msg=key)


@pytest.mark.parametrize("sample_weight", [None, SAMPLE_WEIGHT], ids=["unweighted", "sample_weight"])
def test_the_compiled_loop_reports_kerass_per_output_losses(sample_weight: Any) -> None:
    kwargs = dict(x=X, y=Y, sample_weight=sample_weight, batch_size=16, epochs=2, shuffle=False, verbose=0)
    history = _model().fit(**kwargs).history
    with tfaccel.scope(strategy="default", jit_compile=False):
        model = _model()
    _check(history, tfaccel.fit(model, **kwargs), "compiled")


def test_the_multi_step_loop_reports_kerass_per_output_losses(cpu_replicas: List[str]) -> None:
    kwargs = dict(x=X, y=Y, sample_weight=SAMPLE_WEIGHT, batch_size=16, epochs=2, shuffle=False, verbose=0)
    # Reduction through one device, not collectives: a collective another test of this process aborted would fail
    # this reference (for 2 replicas the sum is the same)
    with tf.distribute.MirroredStrategy(cpu_replicas, cross_device_ops=tf.distribute.ReductionToOneDevice()).scope():
        reference = _model()
    history = reference.fit(**kwargs).history
    with tfaccel.scope(strategy="mirrored", jit_compile=False):
        model = _model()
    _check(history, tfaccel.fit(model, **kwargs), "multi_step")


def test_the_parameter_server_loop_reports_kerass_per_output_losses(tmp_path: Path) -> None:
    """A chief + 1 worker + 1 ps on loopback (one worker: the closures run in order, as fit's steps)."""
    out = harness.run_small_ps_cluster(PS_JOB, tmp_path, timeout=170)
    assert out["loop"].startswith("parameter_server"), out["loop"]
    assert sorted(out["history"]) == sorted(out["expected"]) == ["cls_loss", "loss", "reg_loss"]
    for key, values in out["expected"].items():
        np.testing.assert_allclose(out["history"][key], values, rtol=1e-5, err_msg=key)
    assert out["max_weight_diff"] <= 1e-5
