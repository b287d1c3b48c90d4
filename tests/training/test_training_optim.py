"""The user's optimizer, adapted in place (tfaccel.train.optim): accumulation and clipping give the same result
on 1 device and on 2 replicas, while Keras 3.15's own versions fail or differ (the reason the adaptation
exists); learning-rate scaling is opt-in and wraps the rate or schedule; the optimizer is never rebuilt."""

import numpy as np
import pytest

import tfaccel
from tfaccel.errors import ConfigError
from tfaccel.train.optim import (adapt_optimizer, restore_optimizer_class, scale_factor, scale_learning_rate,
                                 scaled_schedule)


def _mirrored():
    import tensorflow as tf

    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"], cross_device_ops=tf.distribute.ReductionToOneDevice())


def _xy():
    rng = np.random.RandomState(0)
    x = rng.randn(64, 4).astype("float32")
    return x, (x @ np.array([1.0, -2.0, 3.0, 0.5], dtype="float32"))[:, None]


def _model(strategy, optimizer, constraint=None):
    import keras

    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, kernel_constraint=constraint)])
        model.compile(optimizer(), "mse")
    return model


def _train(strategy, *, batch, accumulation=1, global_clipnorm=None, keras_optimizer=None, adapt=True,
           constraint=None):
    import keras

    model = _model(strategy, keras_optimizer or (lambda: keras.optimizers.SGD(0.1, global_clipnorm=global_clipnorm)),
                   constraint)
    opt = model.optimizer
    if adapt:
        adapt_optimizer(model, replicas=strategy.num_replicas_in_sync, accumulation_steps=accumulation)
    x, y = _xy()
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    assert model.optimizer is opt  # adapted in place, never replaced
    return model.get_weights()[0].ravel(), int(keras.ops.convert_to_numpy(opt.iterations))


def test_accumulation_equals_large_batch_on_one_device_and_two_replicas(cpu_replicas):
    import tensorflow as tf

    reference, ref_iters = _train(tf.distribute.get_strategy(), batch=16)
    acc_default, iters_default = _train(tf.distribute.get_strategy(), batch=8, accumulation=2)
    acc_mirrored, iters_mirrored = _train(_mirrored(), batch=8, accumulation=2)
    np.testing.assert_allclose(acc_default, reference, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(acc_mirrored, reference, rtol=1e-5, atol=1e-6)
    assert ref_iters == iters_default == iters_mirrored == 4  # iterations count updates, not micro-batches


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_accumulation_applies_weight_decay_as_keras_accumulation_does(optimizer, cpu_replicas):
    """An optimizer's ``weight_decay`` (AdamW's, or any Keras optimizer's own) on every update, as Keras' own
    ``gradient_accumulation_steps`` on one device applies it, the bias excluded by name as there (a bias decayed by
    mistake would change the kernel's later gradients)."""
    import keras
    import tensorflow as tf

    def make(**accumulate):
        if optimizer == "adamw":
            opt = keras.optimizers.AdamW(0.01, weight_decay=0.5, **accumulate)
        else:
            opt = keras.optimizers.SGD(0.1, momentum=0.9, weight_decay=0.5, **accumulate)
        opt.exclude_from_weight_decay(var_names=["bias"])
        return opt

    reference, ref_iters = _train(tf.distribute.get_strategy(), batch=8, adapt=False,
                                  keras_optimizer=lambda: make(gradient_accumulation_steps=2))
    acc_default, iters_default = _train(tf.distribute.get_strategy(), batch=8, accumulation=2, keras_optimizer=make)
    acc_mirrored, iters_mirrored = _train(_mirrored(), batch=8, accumulation=2, keras_optimizer=make)
    undecayed, _ = _train(tf.distribute.get_strategy(), batch=8, adapt=False,
                          keras_optimizer=lambda: (keras.optimizers.AdamW(0.01, weight_decay=0.0,
                                                                          gradient_accumulation_steps=2)
                                                   if optimizer == "adamw" else
                                                   keras.optimizers.SGD(0.1, momentum=0.9,
                                                                        gradient_accumulation_steps=2)))
    assert np.max(np.abs(reference - undecayed)) > 1e-3  # the decay matters here
    np.testing.assert_allclose(acc_default, reference, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(acc_mirrored, reference, rtol=1e-5, atol=1e-6)
    assert ref_iters == iters_default == iters_mirrored == 4


@pytest.mark.parametrize("what", ["kernel_constraint", "loss_scale_factor", "use_ema", "learning_rate_schedule"])
def test_accumulation_keeps_what_keras_apply_does_around_the_update(what, cpu_replicas):
    """What Keras' ``apply`` does around the update: a kernel constraint (MaxNorm 0.5, below the norm the kernel
    trains to, so it clamps) after every call, the gradients divided by ``loss_scale_factor``, the moving averages of
    ``use_ema`` (written to the weights every 3 updates and at the end of ``fit``), a learning-rate schedule read at
    the micro-batches counted so far (halved every step: read at the updates instead, the rates of the 4 updates
    would be 0.05 x 2^-0..3, not Keras' 0.05 x 2^-1,3,5,7); as Keras' own accumulation."""
    import keras
    import tensorflow as tf

    constraint = keras.constraints.MaxNorm(0.5) if what == "kernel_constraint" else None
    scale = {"loss_scale_factor": {"loss_scale_factor": 4.0},
             "use_ema": {"use_ema": True, "ema_momentum": 0.5, "ema_overwrite_frequency": 3}}.get(what, {})
    kind = keras.optimizers.Adam if constraint is not None else keras.optimizers.SGD  # SGD: the scale shows

    def rate():
        if what == "learning_rate_schedule":
            return keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=1, decay_rate=0.5)
        return 0.05

    reference, _ = _train(tf.distribute.get_strategy(), batch=8, adapt=False, constraint=constraint,
                          keras_optimizer=lambda: kind(rate(), gradient_accumulation_steps=2, **scale))
    got = {name: _train(strategy, batch=8, accumulation=2, constraint=constraint,
                        keras_optimizer=lambda: kind(rate(), **scale))[0]
           for name, strategy in (("one device", tf.distribute.get_strategy()), ("mirrored", _mirrored()))}
    if constraint is not None:
        assert abs(np.linalg.norm(reference) - 0.5) < 1e-4  # the constraint clamped the kernel
    for name, weights in got.items():
        np.testing.assert_allclose(weights, reference, rtol=1e-5, atol=1e-6, err_msg=name)


def test_keras_own_accumulation_fails_under_mirrored(cpu_replicas):
    """Upstream: Keras 3.15 gradient_accumulation_steps + MirroredStrategy -> merge_call error.

    When this stops failing, tfaccel's accumulation can be retired."""
    import keras

    with pytest.raises(RuntimeError, match="merge_call` called while defining a new graph"):
        _train(_mirrored(), batch=8, adapt=False,
               keras_optimizer=lambda: keras.optimizers.SGD(0.1, gradient_accumulation_steps=2))


@pytest.mark.parametrize("clipnorm", [None, 0.5])  # 0.5: with tfaccel's clipping class swapped on too
def test_use_ema_overwrite_under_mirrored_trains_as_one_device(clipnorm, cpu_replicas, monkeypatch):
    """use_ema with ema_overwrite_frequency: Keras 3.15 writes the averages to the weights inside a tf.cond in the
    replica context, and under a MirroredStrategy the first step fails (plain Keras as well); with
    tfaccel.compat.keras_ema_overwrite 2 replicas end with one device's weights and the plan says why."""
    import keras
    import tensorflow as tf

    from tfaccel.compat import keras_ema_overwrite

    def optimizer():
        return keras.optimizers.AdamW(0.05, use_ema=True, ema_momentum=0.5, ema_overwrite_frequency=3,
                                      clipnorm=clipnorm)

    reference, iterations = _train(tf.distribute.get_strategy(), batch=8, adapt=False, keras_optimizer=optimizer)
    got, got_iterations = _train(_mirrored(), batch=8, keras_optimizer=optimizer)
    np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-6)
    assert got_iterations == iterations == 8
    model = _model(_mirrored(), optimizer)
    note = adapt_optimizer(model, replicas=2, accumulation_steps=1)
    assert "use_ema's averages written to the weights every 3 steps outside Keras' tf.cond" in note
    assert keras_ema_overwrite.is_applied(model.optimizer)
    restore_optimizer_class(model)
    assert type(model.optimizer) is keras.optimizers.AdamW  # given back whole
    with pytest.raises(RuntimeError, match="merge_call` called while defining a new graph"):
        _train(_mirrored(), batch=8, adapt=False, keras_optimizer=optimizer)  # plain Keras: upstream's failure
    monkeypatch.setenv("TFACCEL_DISABLE_COMPAT", keras_ema_overwrite.NAME)
    with pytest.raises(RuntimeError, match="merge_call` called while defining a new graph"):
        _train(_mirrored(), batch=8, keras_optimizer=optimizer)  # the fix off: tfaccel fails as Keras does


def test_clipping_applies_to_aggregated_gradients(cpu_replicas):
    import tensorflow as tf

    one, _ = _train(tf.distribute.get_strategy(), batch=16, global_clipnorm=0.1)
    two, _ = _train(_mirrored(), batch=16, global_clipnorm=0.1)
    np.testing.assert_allclose(two, one, rtol=1e-5, atol=1e-6)
    # Keras' own clipping clips each replica's partial gradient before the all-reduce: a different result.
    keras_two, _ = _train(_mirrored(), batch=16, global_clipnorm=0.1, adapt=False)
    assert not np.allclose(keras_two, one, rtol=1e-3)


def test_adaptation_only_where_needed_and_the_class_is_restored(cpu_replicas):
    import keras
    import tensorflow as tf

    plain = _model(_mirrored(), lambda: keras.optimizers.SGD(0.1))
    assert adapt_optimizer(plain, replicas=2, accumulation_steps=1) is None  # nothing to change: untouched
    assert type(plain.optimizer) is keras.optimizers.SGD
    clipped = _model(_mirrored(), lambda: keras.optimizers.SGD(0.1, clipvalue=0.5))
    note = adapt_optimizer(clipped, replicas=2, accumulation_steps=1)
    assert note == ("optimizer SGD: gradients clipped after the all-reduce (Keras 3.15 clips each replica's partial "
                    "gradient)")
    assert type(clipped.optimizer) is not keras.optimizers.SGD and type(clipped.optimizer).__name__ == "SGD"
    restore_optimizer_class(clipped)
    assert type(clipped.optimizer) is keras.optimizers.SGD and clipped.optimizer.clipvalue == 0.5
    one = _model(tf.distribute.get_strategy(), lambda: keras.optimizers.SGD(0.1, clipvalue=0.5))
    assert adapt_optimizer(one, replicas=1, accumulation_steps=1) is None  # one replica: Keras' clipping is right
    accumulated = _model(tf.distribute.get_strategy(), lambda: keras.optimizers.SGD(0.1))
    assert adapt_optimizer(accumulated, replicas=1, accumulation_steps=3) == (
        "optimizer SGD: gradients accumulated over 3 micro-batches per update")


def test_keras_accumulation_on_the_optimizer_is_refused(cpu_replicas):
    import keras

    model = _model(_mirrored(), lambda: keras.optimizers.SGD(0.1, gradient_accumulation_steps=2))
    with pytest.raises(ConfigError, match=r"optimizer SGD\(gradient_accumulation_steps=2\): Keras' own accumulation "
                                          r"fails under MirroredStrategy .* pass gradient_accumulation_steps= to "
                                          r"tfaccel.fit"):
        adapt_optimizer(model, replicas=2, accumulation_steps=1)


def test_accumulation_on_a_built_optimizer_is_refused():
    import keras
    import tensorflow as tf

    model = _model(tf.distribute.get_strategy(), lambda: keras.optimizers.SGD(0.1))
    model.optimizer.build(model.trainable_variables)
    with pytest.raises(ConfigError, match=r"gradient_accumulation_steps needs an optimizer that is not built yet"):
        adapt_optimizer(model, replicas=1, accumulation_steps=2)


# ------------------------------------------------------------------------------------------ learning rate

@pytest.mark.parametrize("rule,expected,reason", [
    ("linear", 4.0, "linear: x4 (global batch 128 / base batch 32)"),
    ("sqrt", 2.0, "sqrt: x2 (sqrt of 128 / 32)"),
    ("none", 1.0, "not scaled"),
    (None, 1.0, "not scaled"),
])
def test_scale_factor(rule, expected, reason):
    assert scale_factor(rule, global_batch=128, base_batch=32) == (pytest.approx(expected), reason)


def test_bad_scaling_rule_lists_valid():
    with pytest.raises(ConfigError, match=r"scale_learning_rate: unknown value 'cubic'; valid values are: 'linear'"):
        scale_factor("cubic", global_batch=2, base_batch=1)


def _lr(schedule, step):
    import keras

    return float(keras.ops.convert_to_numpy(schedule(step)))


def test_warmup_schedule_ramps_then_holds():
    sched = scaled_schedule(0.1, 4.0, warmup_steps=10)
    assert [_lr(sched, s) for s in (0, 5, 10, 100)] == pytest.approx([0.1, 0.25, 0.4, 0.4])


def test_scaling_wraps_the_users_schedule_and_serialises():
    import keras

    decay = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5)
    sched = scaled_schedule(decay, 2.0)
    assert [_lr(sched, s) for s in (0, 10, 20)] == pytest.approx([0.2, 0.1, 0.05])  # the decay is kept, scaled
    config = keras.optimizers.schedules.serialize(sched)
    assert config["class_name"] == "ScaledSchedule" and config["registered_name"] == "tfaccel>ScaledSchedule"
    again = keras.optimizers.schedules.deserialize(config)
    assert [_lr(again, s) for s in (0, 10, 20)] == pytest.approx([0.2, 0.1, 0.05])


def test_scale_learning_rate_on_the_model():
    import keras
    import tensorflow as tf

    model = _model(tf.distribute.get_strategy(), lambda: keras.optimizers.SGD(0.1))
    assert scale_learning_rate(model, None, global_batch=64, base_batch=32, warmup_steps=0) == \
        "learning rate as compiled"
    assert model.optimizer._learning_rate is not None and _lr(lambda s: model.optimizer.learning_rate, 0) == \
        pytest.approx(0.1)
    note = scale_learning_rate(model, "linear", global_batch=64, base_batch=32, warmup_steps=5)
    assert note == "linear: x2 (global batch 64 / base batch 32), warmup over 5 updates"
    assert _lr(model.optimizer._learning_rate, 5) == pytest.approx(0.2)
    with pytest.raises(ConfigError, match=r"scale_learning_rate='linear' needs the global batch size and "
                                          r"base_batch_size .* received global batch None"):
        scale_learning_rate(model, "linear", global_batch=None, base_batch=32, warmup_steps=0)
    model.optimizer.build(model.trainable_variables)
    with pytest.raises(ConfigError, match=r"scale_learning_rate needs an optimizer that is not built yet"):
        scale_learning_rate(model, "sqrt", global_batch=64, base_batch=32, warmup_steps=0)


def test_warmup_under_accumulation_lasts_the_updates_it_announces():
    """The accumulating optimizer reads its schedule at micro-batches (as Keras' own accumulation does): a warmup of
    5 updates of 2 micro-batches ends at micro-batch 10, not 5."""
    import keras
    import tensorflow as tf

    model = _model(tf.distribute.get_strategy(), lambda: keras.optimizers.SGD(0.1))
    note = scale_learning_rate(model, "linear", global_batch=64, base_batch=32, warmup_steps=5, steps_per_update=2)
    assert note == "linear: x2 (global batch 64 / base batch 32), warmup over 5 updates"
    schedule = model.optimizer._learning_rate
    assert [_lr(schedule, s) for s in (0, 5, 10, 20)] == pytest.approx([0.1, 0.15, 0.2, 0.2])


# --------------------------------------------------------------- through compile_and_fit / tfaccel.fit

def _digits_like(n=64):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 4)).astype("float32")
    return x, (x[:, 0] > 0).astype("int64")


def _build():
    import keras

    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])


def test_optimizer_instance_is_used_as_given(clean_tf_config, cpu_replicas):
    import keras

    holder = {}

    def optimizer():
        holder["opt"] = keras.optimizers.Adam(learning_rate=0.005, beta_1=0.8, clipnorm=1.0)
        return holder["opt"]

    result = tfaccel.compile_and_fit(_build, _digits_like(), optimizer=optimizer, strategy="mirrored",
                                     global_batch_size=16, loss="sparse_categorical_crossentropy", verbose=0, seed=0)
    opt = result.model.optimizer
    assert opt is holder["opt"] and type(opt) is keras.optimizers.Adam  # the same object, its own class back
    assert opt.beta_1 == 0.8 and opt.clipnorm == 1.0  # nothing rebuilt from config, nothing dropped
    assert float(keras.ops.convert_to_numpy(opt.learning_rate)) == pytest.approx(0.005)  # not scaled by replicas
    assert result.details["learning_rate"] == "learning rate as compiled"
    assert result.details["optimizer"].startswith("optimizer Adam: gradients clipped after the all-reduce")
    assert int(keras.ops.convert_to_numpy(opt.iterations)) == 4


def test_opt_in_linear_scaling_through_fit(clean_tf_config, cpu_replicas):
    import keras

    with tfaccel.scope(strategy="mirrored"):
        model = _build()
        schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=4, decay_rate=0.5)
        model.compile(optimizer=keras.optimizers.SGD(schedule), loss="sparse_categorical_crossentropy")
    x, y = _digits_like()
    result = tfaccel.fit(model, x, y, batch_size=16, epochs=1, verbose=0, seed=0, scale_learning_rate="linear")
    assert result.details["learning_rate"] == "linear: x2 (global batch 16 / base batch 8)"  # base: per replica
    wrapped = model.optimizer._learning_rate
    assert type(wrapped).__name__ == "ScaledSchedule" and wrapped.inner is schedule
    assert _lr(wrapped, 0) == pytest.approx(0.2) and _lr(wrapped, 4) == pytest.approx(0.1)  # the decay still runs


@pytest.mark.parametrize("kwargs,message", [
    ({"optimizer": "adamx"}, r"optimizer: unknown value 'adamx'; valid values are: 'adam'"),
    ({"optimizer": 3}, r"optimizer must be a name .* received int"),
    ({"clipnorm": 1.0, "global_clipnorm": 1.0}, r"give clipnorm or global_clipnorm, not both"),
    ({"clipnorm": -1.0}, r"clipnorm must be a positive number; received -1.0"),
    ({"learning_rate": 0}, r"learning_rate must be a positive number; received 0"),
    ({"optimizer": "SGD_OBJECT", "learning_rate": 0.1},
     r"learning_rate: set these on your optimizer object \(SGD\); tfaccel uses the optimizer you pass as given"),
    ({"scale_learning_rate": "cubic"}, r"scale_learning_rate: unknown value 'cubic'"),
])
def test_optimizer_errors(kwargs, message, clean_tf_config):
    import keras

    if kwargs.get("optimizer") == "SGD_OBJECT":
        kwargs = {**kwargs, "optimizer": keras.optimizers.SGD()}
    built = []
    with pytest.raises(ConfigError, match=message):
        tfaccel.compile_and_fit(lambda: built.append(1) or _build(), _digits_like(), strategy="default",
                                loss="sparse_categorical_crossentropy", verbose=0, **kwargs)
    if "scale_learning_rate" not in kwargs:
        assert built == []  # refused before the model was built
