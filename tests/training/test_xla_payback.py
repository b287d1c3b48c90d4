"""``jit_compile="auto"`` on one CPU device decides XLA per job from measured figures (tfaccel.train.xla_payback),
switches only between epochs and trains what Keras trains with the corresponding ``jit_compile`` per epoch; the
decision cache is written atomically, read back, and a corrupt file is ignored with a warning. Tiny models only."""

import logging
import math
import os

import keras
import numpy as np
import pytest

import tfaccel
from tfaccel.train import decisions, xla_payback
from tfaccel.train.xla_payback import Figures, XlaAuto, figures_from_epochs, start_choice, try_choice

N, BATCH, EPOCHS = 96, 32, 4  # whole batches: 3 steps per epoch


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(decisions.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache" / "decisions"


def _data():
    x = np.random.default_rng(0).standard_normal((N, 8)).astype("float32")
    return x, (x[:, 0] > 0).astype("int64") + (x[:, 1] > 0.5).astype("int64")


def _build(dropout: float = 0.0) -> keras.Model:
    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dropout(dropout), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_figures_and_the_payback_rules():
    assert figures_from_epochs(1.0, [3.0], 10) is None  # no steady epoch yet
    fig = figures_from_epochs(1.0, [3.0, 1.2, 1.0], 10)
    assert fig.step_s == pytest.approx(0.1) and fig.overhead_s == pytest.approx(3.0)
    off = Figures(overhead_s=2.0, step_s=0.01)
    assert try_choice(off, 100)[0] is False  # a short job never tries XLA
    go, test = try_choice(off, 100_000)
    assert go and test["compile_estimate_s"] == pytest.approx(xla_payback.PRIOR_COMPILE_PER_OVERHEAD * 2.0)
    threshold = xla_payback.steps_to_try(off)
    assert try_choice(off, threshold)[0] and not try_choice(off, threshold - 1)[0]
    assert start_choice(None, 72)[0] is False
    record = {"jit_off": {"overhead_s": 3.7, "step_s": 0.005}, "jit_on": {"overhead_s": 5.9, "step_s": 0.003}}
    on, why = start_choice(record, 72)  # 72 steps: 4.06 s without XLA against 6.12 s with it
    assert not on and "6.1s with XLA" in why and "4.1s without" in why
    assert start_choice(record, 5000)[0]  # a long job of the same model pays the compilation back


def test_a_slow_down_prior_tries_xla_only_where_its_trial_is_a_small_share_of_the_job():
    off, conv = Figures(overhead_s=2.0, step_s=0.01), xla_payback.CONV_CPU_PRIOR
    assert conv.speedup < 1 and "convolutions on CPU" in conv.source
    threshold = xla_payback.steps_to_try(off, prior=conv, steps_per_epoch=10)
    assert try_choice(off, threshold, prior=conv, steps_per_epoch=10)[0]
    assert not try_choice(off, threshold - 1, prior=conv, steps_per_epoch=10)[0]
    # the trial: compile (3 x 2 s) + 2 epochs of 10 steps at the slow-down; at most 5% of the remaining steps' time
    trial = xla_payback.PRIOR_COMPILE_PER_OVERHEAD * 2.0 + 2 * 10 * 0.01 * (1 / conv.speedup - 1)
    assert try_choice(off, threshold, prior=conv, steps_per_epoch=10)[1]["trial_cost_estimate_s"] == pytest.approx(
        trial, abs=1e-3)
    assert threshold == math.ceil(trial / (xla_payback.TRIAL_SHARE * 0.01))
    assert threshold > xla_payback.steps_to_try(off)  # a slow-down prior asks for a longer job than the default
    assert xla_payback.steps_to_try(off, prior=conv, steps_per_epoch=1000) > threshold  # longer trial epochs


def test_xla_is_kept_only_where_its_steps_are_faster():
    auto = XlaAuto(steps_per_epoch=10, epochs=10, start=True, may_switch=True, reason="test")
    for seconds in (5.0, 1.0):
        auto.record(False, seconds)
    for seconds in (9.0, 1.5):  # XLA measured slower per step: back to off for the rest of the job
        auto.record(True, seconds)
    assert auto.setting_for(4) is False and "XLA off again" in auto.events[-1]
    assert auto.cache_record()["jit_on"]["step_s"] == pytest.approx(0.15)


def test_random_layers_never_switch():
    assert xla_payback.random_layers(_build(0.0)) == []
    model = _build(0.5)
    assert xla_payback.random_layers(model) == [model.layers[1].name]


def _keras_two_phases(x, y, switch_epoch: int, build=_build):
    """Keras fit with jit_compile=False for the epochs before ``switch_epoch``, True after."""
    model = build()
    model.jit_compile = False
    history = model.fit(x, y, batch_size=BATCH, epochs=switch_epoch, shuffle=False, verbose=0).history
    model.jit_compile = True
    later = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, initial_epoch=switch_epoch, shuffle=False,
                      verbose=0).history
    return model, {k: history[k] + later[k] for k in history}


def test_a_switch_trains_what_keras_trains_and_the_second_run_reads_the_cache(cache, monkeypatch, clean_tf_config,
                                                                             caplog):
    monkeypatch.setattr(xla_payback, "PRIOR_COMPILE_PER_OVERHEAD", 0.0)  # any remaining steps pay: switch at once
    x, y = _data()
    with tfaccel.scope(strategy="default", jit_compile="auto"):
        model = _build()
    result = tfaccel.fit(model, x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, seed=0, verbose=0)
    auto = result.details["xla_auto"]
    assert auto["events"][0].startswith("epoch 3: XLA tried"), auto
    assert set(auto["measured"]) == {"jit_off", "jit_on"} and os.path.exists(auto["cache"]), auto
    ref, history = _keras_two_phases(x, y, switch_epoch=2)
    assert sorted(result.history) == sorted(history)
    for key, values in history.items():
        np.testing.assert_allclose(result.history[key], values, rtol=1e-5, atol=1e-7, err_msg=key)
    for got, want in zip(model.get_weights(), ref.get_weights()):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)

    with tfaccel.scope(strategy="default", jit_compile="auto"):
        again = _build()
    second = tfaccel.fit(again, x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, seed=0, verbose=0)
    start = second.details["xla_auto"]["start"]
    assert "from cached figures of this model" in start and second.details["xla_auto"]["events"] == [], start
    assert "cached figures" in second.details["jit_compile"]

    path = auto["cache"]
    with open(path, "w") as fh:
        fh.write("{not json")
    with caplog.at_level(logging.WARNING, logger="tfaccel"):
        third = tfaccel.fit(_fresh(), x, y, batch_size=BATCH, epochs=1, shuffle=False, seed=0, verbose=0)
    assert "not a readable record" in caplog.text and path in caplog.text
    assert "no figures measured" in third.details["xla_auto"]["start"]
    assert decisions.clear() == 1 and os.listdir(cache) == []


def _build_conv() -> keras.Model:
    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((8, 1)), keras.layers.Conv1D(4, 3, activation="relu"),
                              keras.layers.Flatten(), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_a_model_with_convolutions_measures_xla_on_itself_when_the_job_can_afford_the_trial(cache, monkeypatch,
                                                                                           clean_tf_config):
    """The slow-down prior is a starting assumption, not a verdict: a job long enough for the trial (here: any
    job, the share made unlimited) tries XLA on the user's convolutional model and trains what Keras trains."""
    x, y = _data()
    x = x[:, :, None]
    with tfaccel.scope(strategy="default", jit_compile="auto"):
        short = _build_conv()
    result = tfaccel.fit(short, x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, seed=0, verbose=0)
    auto = result.details["xla_auto"]
    assert auto["events"] == [] and auto["prior"]["speedup"] < 1 and result.model.jit_compile is False
    assert auto["try_from_steps"] > EPOCHS * 3 and "convolutions on CPU" in result.details["jit_compile"]

    monkeypatch.setattr(xla_payback, "TRIAL_SHARE", 1e9)
    with tfaccel.scope(strategy="default", jit_compile="auto"):
        model = _build_conv()
    result = tfaccel.fit(model, x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, seed=0, verbose=0)
    events = result.details["xla_auto"]["events"]
    assert events[0].startswith("epoch 3: XLA tried") and "trial_cost_estimate_s" in events[0], events
    ref, history = _keras_two_phases(x, y, switch_epoch=2, build=_build_conv)
    for key, values in history.items():
        np.testing.assert_allclose(result.history[key], values, rtol=1e-5, atol=1e-6, err_msg=key)
    for got, want in zip(model.get_weights(), ref.get_weights()):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def _fresh() -> keras.Model:
    with tfaccel.scope(strategy="default", jit_compile="auto"):
        return _build()


def test_a_short_job_never_tries_xla_and_writes_nothing(cache, clean_tf_config):
    x, y = _data()
    result = tfaccel.fit(_fresh(), x, y, batch_size=BATCH, epochs=3, shuffle=False, seed=0, verbose=0)
    auto = result.details["xla_auto"]
    assert auto["events"] == [] and result.model.jit_compile is False
    assert "nothing written" in auto["cache"] and not cache.exists()
    assert "XLA off to start" in result.details["jit_compile"]


def test_a_second_fit_call_on_the_same_model_counts_the_tracing_it_was_spared(cache, clean_tf_config):
    """The second call reuses the loop the first traced (it pays no tracing), but XLA's compile estimate still
    scales with what tracing costs: the short job must not try XLA because its own overhead measured ~0."""
    x, y = _data()
    model = _fresh()
    first = tfaccel.fit(model, x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, seed=0, verbose=0)
    second = tfaccel.fit(model, x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, seed=0, verbose=0)
    for result in (first, second):
        assert result.details["xla_auto"]["events"] == [] and result.model.jit_compile is False
    overheads = [r.details["xla_auto"]["measured"]["jit_off"]["overhead_s"] for r in (first, second)]
    assert overheads[1] >= 0.25 * overheads[0] > 0, overheads


def test_a_model_with_dropout_never_switches(cache, monkeypatch, clean_tf_config):
    monkeypatch.setattr(xla_payback, "PRIOR_COMPILE_PER_OVERHEAD", 0.0)
    x, y = _data()
    with tfaccel.scope(strategy="default", jit_compile="auto"):
        model = _build(0.5)
    result = tfaccel.fit(model, x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, seed=0, verbose=0)
    assert result.details["xla_auto"]["events"] == [] and "draw random numbers" in result.details["jit_compile"]


def test_cli_cache_path_and_clear(cache):
    import subprocess
    import sys

    cache.mkdir(parents=True)
    (cache / "0123.json").write_text("{}")
    run = [sys.executable, "-m", "tfaccel", "cache"]
    proc = subprocess.run(run + ["path"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == str(cache), proc.stderr
    proc = subprocess.run(run + ["clear"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and f"removed 1 decision record(s) from {cache}" in proc.stdout, proc.stderr
    proc = subprocess.run(run + ["wipe"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "invalid choice: 'wipe'" in proc.stderr, proc.stderr
