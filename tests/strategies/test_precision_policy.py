"""precision: auto rules from injected GPUs/TPU, warnings for poor explicit choices, loss scaling, output dtype."""

import logging
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from strategies_logs import tfaccel_records  # noqa: E402

from tfaccel.devices import DeviceInfo, GpuInfo  # noqa: E402
from tfaccel.errors import ConfigError  # noqa: E402
from tfaccel.precision import (PRECISION_NAMES, check_output_dtype, resolve_precision, set_precision,  # noqa: E402
                               wrap_loss_scale)


def _gpus(*caps):
    return DeviceInfo(gpus=tuple(GpuInfo(i, f"GPU{i}", cap) for i, cap in enumerate(caps)))


@pytest.fixture
def keep_policy():
    import keras

    before = keras.mixed_precision.global_policy().name
    yield
    keras.mixed_precision.set_global_policy(before)


@pytest.mark.parametrize("devices, policy, words", [
    (DeviceInfo(tpu_address="local"), "mixed_bfloat16", "TPU"),
    (_gpus((8, 0), (9, 0)), "mixed_bfloat16", ">= 8.0"),
    (_gpus((7, 5)), "mixed_float16", "7.x"),
    (_gpus((8, 6), (7, 0)), "mixed_float16", "7.x"),  # the slowest GPU decides
    (_gpus((6, 1)), "float32", "older than compute capability 7.0"),
    (_gpus(None), "float32", "unknown"),
    (DeviceInfo(num_cpu_devices=2), "float32", "CPU only"),
])
def test_auto(devices, policy, words) -> None:
    got, reason = resolve_precision("auto", devices=devices)
    assert got == policy and words in reason


def test_names_and_errors() -> None:
    assert PRECISION_NAMES == ("auto", "float32", "mixed_float16", "mixed_bfloat16")
    with pytest.raises(ConfigError, match=r"precision: unknown value 'fp16'; valid values are: 'auto', 'float32', "
                                          r"'mixed_float16', 'mixed_bfloat16'\. 'auto' picks"):
        resolve_precision("fp16", devices=DeviceInfo())
    with pytest.raises(ConfigError, match=r"unknown value 'bf16'"):
        set_precision("bf16", devices=DeviceInfo())


def test_explicit_mixed_on_cpu_works_but_warns(keep_policy) -> None:
    import keras

    with tfaccel_records() as records:
        assert set_precision("mixed_bfloat16", devices=DeviceInfo()) == "mixed_bfloat16"
    assert keras.mixed_precision.global_policy().name == "mixed_bfloat16"
    warnings = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    assert warnings == ["precision: mixed_bfloat16 on a CPU works but is slower than float32 there; use "
                        "precision='auto' to let tfaccel pick"]
    policy, reason = resolve_precision("mixed_float16", devices=DeviceInfo())
    assert policy == "mixed_float16" and reason == ("requested explicitly (mixed_float16 on a CPU works but is slower "
                                                    "than float32 there)")


@pytest.mark.parametrize("policy, caps, message", [
    ("mixed_float16", (6, 0), "compute capability 6.0 (< 7.0, no tensor cores) is not faster"),
    ("mixed_bfloat16", (7, 5), "compute capability 7.5 (< 8.0) has no native bfloat16 support"),
])
def test_explicit_mixed_on_old_gpus_warns(keep_policy, policy, caps, message) -> None:
    with tfaccel_records() as records:
        set_precision(policy, devices=_gpus(caps))
    assert any(message in r.getMessage() and r.levelno == logging.WARNING for r in records)


def test_auto_sets_float32_here_without_warning(keep_policy) -> None:
    with tfaccel_records() as records:
        assert set_precision("auto", devices=DeviceInfo()) == "float32"
    assert not [r for r in records if r.levelno >= logging.WARNING]


def test_wrap_loss_scale(keep_policy) -> None:
    import keras

    opt = keras.optimizers.SGD(0.1)
    assert wrap_loss_scale(opt, "float32") is opt
    assert wrap_loss_scale(opt, "mixed_bfloat16") is opt  # bfloat16 has float32's range: no scaling needed
    wrapped = wrap_loss_scale(opt, "mixed_float16")
    assert isinstance(wrapped, keras.optimizers.LossScaleOptimizer) and wrapped.inner_optimizer is opt
    assert wrap_loss_scale(wrapped, "mixed_float16") is wrapped  # never twice
    keras.mixed_precision.set_global_policy("mixed_float16")
    assert isinstance(wrap_loss_scale(opt), keras.optimizers.LossScaleOptimizer)  # global policy by default


def test_loss_scaled_custom_step_trains(keep_policy) -> None:
    """A custom loop with wrap_loss_scale under mixed_float16 (what tfaccel's own loops do) updates the weights."""
    import keras
    import numpy as np
    import tensorflow as tf

    keras.mixed_precision.set_global_policy("mixed_float16")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, dtype="float32")])
    opt = wrap_loss_scale(keras.optimizers.SGD(0.1))
    x, y = np.ones((4, 3), "float32"), np.zeros((4, 1), "float32")
    before = model.get_weights()[0].copy()
    with tf.GradientTape() as tape:
        loss = keras.losses.mean_squared_error(y, model(x) + 1.0)
        scaled = opt.scale_loss(tf.reduce_mean(loss))
    opt.apply(tape.gradient(scaled, model.trainable_variables), model.trainable_variables)
    assert not np.allclose(before, model.get_weights()[0])


def test_check_output_dtype(keep_policy) -> None:
    import keras

    keras.mixed_precision.set_global_policy("mixed_float16")
    bad = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="softmax")], name="bad")
    good = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2),
                             keras.layers.Activation("softmax", dtype="float32")], name="good")
    with tfaccel_records() as records:
        assert check_output_dtype(good) == []
        assert len(check_output_dtype(bad)) == 1
    messages = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    assert len(messages) == 1
    assert messages[0].startswith("model 'bad': output(s) ")
    assert "come out in float16; compute the last layer in float32" in messages[0]
    assert "keras.layers.Activation('softmax', dtype='float32')" in messages[0]
