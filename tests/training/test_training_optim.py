"""Optimizer wrappers: accumulation and clipping give the same result on 1 device and on 2 replicas,
while Keras 3.15's own versions fail or differ (the reason these wrappers exist)."""

import numpy as np
import pytest

from tfaccel.errors import ConfigError
from tfaccel.train.optim import make_optimizer, scaled_learning_rate


def _mirrored():
    import tensorflow as tf

    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"], cross_device_ops=tf.distribute.ReductionToOneDevice())


def _train(strategy, *, batch, accumulation=1, global_clipnorm=None, keras_optimizer=None):
    import keras

    keras.utils.set_random_seed(1)
    rng = np.random.RandomState(0)
    x = rng.randn(64, 4).astype("float32")
    y = (x @ np.array([1.0, -2.0, 3.0, 0.5], dtype="float32"))[:, None]
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        if keras_optimizer is not None:
            opt = keras_optimizer()
        else:
            opt, _ = make_optimizer("sgd", learning_rate=0.1, replicas=1, scale_learning_rate="none",
                                    gradient_accumulation_steps=accumulation, global_clipnorm=global_clipnorm)
        model.compile(opt, "mse")
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    return model.get_weights()[0].ravel(), int(keras.ops.convert_to_numpy(opt.iterations))


def test_accumulation_equals_large_batch_on_one_device_and_two_replicas(cpu_replicas):
    import tensorflow as tf

    reference, ref_iters = _train(tf.distribute.get_strategy(), batch=16)
    acc_default, iters_default = _train(tf.distribute.get_strategy(), batch=8, accumulation=2)
    acc_mirrored, iters_mirrored = _train(_mirrored(), batch=8, accumulation=2)
    np.testing.assert_allclose(acc_default, reference, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(acc_mirrored, reference, rtol=1e-5, atol=1e-6)
    assert ref_iters == iters_default == iters_mirrored == 4  # iterations count updates, not micro-batches


def test_keras_own_accumulation_fails_under_mirrored(cpu_replicas):
    """Upstream: Keras 3.15 gradient_accumulation_steps + MirroredStrategy -> merge_call error.

    When this stops failing, tfaccel's accumulation can be retired."""
    import keras

    with pytest.raises(RuntimeError, match="merge_call` called while defining a new graph"):
        _train(_mirrored(), batch=8,
               keras_optimizer=lambda: keras.optimizers.SGD(0.1, gradient_accumulation_steps=2))


def test_clipping_applies_to_aggregated_gradients(cpu_replicas):
    import keras
    import tensorflow as tf

    one, _ = _train(tf.distribute.get_strategy(), batch=16, global_clipnorm=0.1)
    two, _ = _train(_mirrored(), batch=16, global_clipnorm=0.1)
    np.testing.assert_allclose(two, one, rtol=1e-5, atol=1e-6)
    # Keras' own clipping clips each replica's partial gradient before the all-reduce: a different result.
    keras_two, _ = _train(_mirrored(), batch=16, keras_optimizer=lambda: keras.optimizers.SGD(0.1, global_clipnorm=0.1))
    assert not np.allclose(keras_two, one, rtol=1e-3)


@pytest.mark.parametrize("rule,expected", [("linear", 0.4), ("sqrt", 0.2), ("none", 0.1), (None, 0.1)])
def test_learning_rate_scaling(rule, expected):
    assert scaled_learning_rate(0.1, 4, rule)[0] == pytest.approx(expected)


def test_bad_scaling_rule_lists_valid():
    with pytest.raises(ConfigError, match=r"scale_learning_rate: unknown value 'cubic'; valid values are: 'linear'"):
        scaled_learning_rate(0.1, 2, "cubic")


def test_warmup_schedule_ramps_then_holds():
    import keras

    opt, info = make_optimizer("sgd", learning_rate=0.1, replicas=4, scale_learning_rate="linear", warmup_steps=10)
    lr = opt.learning_rate  # evaluated at iterations=0
    sched = opt._learning_rate
    assert float(keras.ops.convert_to_numpy(sched(0))) == pytest.approx(0.1)
    assert float(keras.ops.convert_to_numpy(sched(5))) == pytest.approx(0.25)
    assert float(keras.ops.convert_to_numpy(sched(10))) == pytest.approx(0.4)
    assert float(keras.ops.convert_to_numpy(sched(100))) == pytest.approx(0.4)
    assert "warmup over 10 steps" in info["learning_rate_note"] and lr is not None


@pytest.mark.parametrize("kwargs,message", [
    ({"optimizer": "adamx"}, r"optimizer: unknown value 'adamx'; valid values are: 'adam'"),
    ({"optimizer": 3}, r"optimizer must be a name"),
    ({"clipnorm": 1.0, "global_clipnorm": 1.0}, r"give clipnorm or global_clipnorm, not both"),
    ({"clipnorm": -1.0}, r"clipnorm must be a positive number; received -1.0"),
    ({"learning_rate": 0}, r"learning_rate must be a positive number; received 0"),
])
def test_optimizer_errors(kwargs, message):
    args = {"optimizer": "adam", "learning_rate": None, "replicas": 1, "scale_learning_rate": "linear"}
    args.update(kwargs)
    with pytest.raises(ConfigError, match=message):
        make_optimizer(args.pop("optimizer"), **args)


def test_keras_accumulation_on_the_optimizer_is_refused():
    import keras

    with pytest.raises(ConfigError, match="pass gradient_accumulation_steps to compile_and_fit"):
        make_optimizer(keras.optimizers.SGD(gradient_accumulation_steps=2), learning_rate=None, replicas=1,
                       scale_learning_rate="none")


def test_optimizer_instance_config_is_reused():
    import keras

    opt, info = make_optimizer(keras.optimizers.Adam(learning_rate=0.005, beta_1=0.8), learning_rate=None,
                               replicas=2, scale_learning_rate="linear")
    assert isinstance(opt, keras.optimizers.Adam) and opt.beta_1 == 0.8
    assert info["learning_rate"] == pytest.approx(0.01)
