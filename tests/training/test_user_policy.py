"""A dtype policy the user chose stands: ``precision="auto"`` keeps it, a different explicit one is a conflict.

The recipe every TensorFlow mixed-precision guide gives (``keras.mixed_precision.set_global_policy("mixed_float16")``,
then build and compile under a ``MirroredStrategy`` scope, then ``model.fit``) converted with the README's 3-line change
must train what plain Keras trains: float16 layers, Keras' ``LossScaleOptimizer``, the same history and weights.
Before, ``tfaccel.scope()`` replaced the user's policy with its own choice (float32 on a CPU) without a word.
"""

import logging
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "strategies"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "parity"))

from parity_cases import set_initial_weights  # noqa: E402
from parity_compare import ABS, REL  # noqa: E402
from strategies_logs import tfaccel_records  # noqa: E402

import tfaccel  # noqa: E402
from tfaccel.errors import ConfigError  # noqa: E402

CPU_NOTE = "mixed_float16 on a CPU works but is slower than float32 there"


@pytest.fixture(autouse=True)
def restore_policy():
    import keras

    before = keras.config.dtype_policy()
    yield
    keras.config.set_dtype_policy(before)


def _data(n=64):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((n, 6)).astype("float32")
    return x, ((x[:, 0] > 0).astype("int32") + (x[:, 1] > 0).astype("int32"))


def _build_and_compile():
    import keras

    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(3), keras.layers.Activation("softmax", dtype="float32")])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return set_initial_weights(model)


def test_the_mixed_float16_recipe_under_mirrored_trains_as_plain_keras(clean_tf_config, cpu_replicas):
    import keras

    keras.mixed_precision.set_global_policy("mixed_float16")
    x, y = _data()
    fit_args = dict(batch_size=16, epochs=3, verbose=0, shuffle=False)
    strategy = tfaccel.get_strategy("mirrored")  # the MirroredStrategy of this process (one per process)
    with strategy.scope():                       # the recipe as users write it, trained by plain Keras
        plain = _build_and_compile()
    plain_history = plain.fit(x, y, **fit_args).history

    with tfaccel_records() as records:
        with tfaccel.scope() as plan:            # the 3-line change
            model = _build_and_compile()
        history = tfaccel.fit(model, x, y, **fit_args).history
    assert plan.strategy == "mirrored" and plan.num_replicas == 2
    assert plan.precision == "mixed_float16"
    assert plan.precision_reason == f"the global dtype policy you set ('mixed_float16'), kept ({CPU_NOTE})"
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert model.layers[0].compute_dtype == "float16" and model.outputs[0].dtype == "float32"
    warnings = [r.getMessage() for r in records if r.levelno >= logging.WARNING]
    assert any("the global dtype policy you set ('mixed_float16'), kept" in w and CPU_NOTE in w for w in warnings)
    assert keras.config.dtype_policy().name == "mixed_float16"  # still the user's after the block
    assert sorted(history) == sorted(plain_history)
    for key, values in plain_history.items():
        np.testing.assert_allclose(history[key], values, rtol=REL, atol=1e-6, err_msg=key)
    for got, ref in zip(model.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(got, ref, atol=ABS)
    assert int(model.optimizer.step_counter.numpy()) == int(plain.optimizer.step_counter.numpy()) == 12


def test_a_policy_set_before_scope_is_kept_on_one_device(clean_tf_config):
    import keras

    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    with tfaccel.scope(strategy="default") as plan:
        model = _build_and_compile()
    assert plan.precision == "mixed_bfloat16" and plan.precision_reason.startswith("the global dtype policy you set")
    assert model.layers[0].compute_dtype == "bfloat16"
    assert not isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)


def test_floatx_float64_is_the_users_choice_too(clean_tf_config):
    import keras

    before = keras.config.floatx()
    keras.config.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    try:
        with tfaccel.scope(strategy="default") as plan:
            model = _build_and_compile()
    finally:
        keras.config.set_floatx(before)
    assert plan.precision == "float64" and model.layers[0].compute_dtype == "float64"


def test_an_explicit_precision_that_differs_is_a_conflict(clean_tf_config):
    import keras

    keras.mixed_precision.set_global_policy("mixed_float16")
    with pytest.raises(ConfigError, match=r"precision='float32' conflicts with the global dtype policy "
                                          r"'mixed_float16' set before tfaccel.scope\(\)"):
        with tfaccel.scope(strategy="default", precision="float32"):
            pass
    with tfaccel.scope(strategy="default", precision="mixed_float16") as plan:  # the same choice twice: fine
        pass
    assert plan.precision == "mixed_float16"


def test_auto_decides_when_the_user_chose_nothing_and_a_layer_dtype_stands(clean_tf_config):
    import keras

    with tfaccel.scope(strategy="default") as plan:
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, dtype="mixed_float16"),
                                  keras.layers.Dense(2, dtype="float64")])
    assert plan.precision == "float32" and plan.precision_reason.startswith("CPU only")
    assert [layer.dtype_policy.name for layer in model.layers] == ["mixed_float16", "float64"]
