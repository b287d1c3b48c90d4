"""An explicit ``model.compile(jit_compile=...)`` stands: tfaccel's XLA decision applies only to ``"auto"``.

Before, ``tfaccel.fit`` replaced the model's explicit ``jit_compile=True`` with its own ``"auto"`` decision (XLA off
to start on one CPU), so Keras' own ``swap_ema_weights_test`` saw ``evaluate`` run without XLA after ``fit``.
"""

import logging
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "strategies"))

from strategies_logs import tfaccel_records  # noqa: E402

import tfaccel  # noqa: E402
from tfaccel.compat.keras_compile_args import compile_jit_request  # noqa: E402
from tfaccel.errors import ConfigError  # noqa: E402
from tfaccel.xla import CPU_PER_JOB_NOTE  # noqa: E402

X = np.random.default_rng(0).standard_normal((32, 3)).astype("float32")
Y = X.sum(axis=1, keepdims=True)


def _fit(strategy="default", scope_jit="auto", **compile_kwargs):
    import keras

    with tfaccel.scope(strategy=strategy, jit_compile=scope_jit):
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse", **compile_kwargs)
    return model, tfaccel.fit(model, X, Y, batch_size=8, epochs=1, verbose=0)


@pytest.mark.parametrize("value", [True, False])
def test_an_explicit_compile_choice_stands_and_the_plan_says_so(clean_tf_config, value):
    model, result = _fit(jit_compile=value)
    assert bool(model.jit_compile) is value
    assert result.plan.jit_compile is value
    assert result.plan.jit_reason == f"jit_compile={value} set at compile, kept"


def test_auto_at_compile_is_tfaccels_to_decide(clean_tf_config):
    model, result = _fit()
    assert compile_jit_request(model) == "auto"
    assert result.plan.jit_reason != "jit_compile=True set at compile, kept"
    assert "decided per job" in CPU_PER_JOB_NOTE  # the note the per-job decision starts from


def test_a_conflict_with_scope_is_an_error(clean_tf_config):
    with pytest.raises(ConfigError, match=r"model.compile\(jit_compile=True\) conflicts with "
                                          r"tfaccel.scope\(jit_compile=False\); pass the same value to both"):
        _fit(scope_jit=False, jit_compile=True)


def test_an_explicit_true_that_cannot_work_falls_back_with_a_warning(clean_tf_config, cpu_replicas):
    with tfaccel_records() as records:
        model, result = _fit(strategy="mirrored", jit_compile=True)
    assert result.plan.jit_compile is False and not model.jit_compile
    assert result.plan.jit_reason.startswith("jit_compile=True set at compile: requested on, fell back to off: "
                                             "jit_compile=True fails under MirroredStrategy")
    assert any(r.levelno == logging.WARNING and "falling back to jit_compile=False" in r.getMessage()
               for r in records)


def test_the_recorded_argument_positional_and_through_a_subclass(clean_tf_config):
    import keras

    class Own(keras.Model):
        def compile(self, optimizer):  # keras-io's GAN form: its own compile calling super().compile
            super().compile(optimizer=optimizer)

    with tfaccel.scope(strategy="default"):
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse", None, None, None, False, 1, True)
        own = Own()
        own.compile("sgd")
    assert compile_jit_request(model) is True and compile_jit_request(own) == "auto"
    assert compile_jit_request(object()) == "auto"
