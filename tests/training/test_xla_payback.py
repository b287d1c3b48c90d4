"""``jit_compile="auto"`` on one CPU device decides XLA per job from measured figures (tfaccel.train.xla_payback),
switches only between epochs and trains what Keras trains with the corresponding ``jit_compile`` per epoch; the
decision cache is written atomically, read back, and a corrupt file is ignored with a warning. Tiny models only."""

import logging
import math
import os
import re

import keras
import numpy as np
import pytest

import tfaccel
from tfaccel.train import decisions, xla_payback
from tfaccel.train.xla_payback import Figures, XlaAuto, figures_from_chunks, start_choice, try_choice

N, BATCH, EPOCHS = 96, 32, 4  # whole batches: 3 steps per epoch


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(decisions.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache" / "decisions"


def _data(n: int = N):
    x = np.random.default_rng(0).standard_normal((n, 8)).astype("float32")
    return x, (x[:, 0] > 0).astype("int64") + (x[:, 1] > 0.5).astype("int64")


def _build(dropout: float = 0.0) -> keras.Model:
    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dropout(dropout), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_figures_and_the_payback_rules():
    assert figures_from_chunks(1.0, []) is None and figures_from_chunks(1.0, [(0.5, 0)]) is None  # no step yet
    fig = figures_from_chunks(1.0, [(0.3, 2), (0.9, 10)])  # the passes were warmed: every run is clean
    assert fig.step_s == pytest.approx(0.1) and fig.overhead_s == pytest.approx(1.0)
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
    threshold = xla_payback.steps_to_try(off, prior=conv, trial_steps=10)
    assert try_choice(off, threshold, prior=conv, trial_steps=10)[0]
    assert not try_choice(off, threshold - 1, prior=conv, trial_steps=10)[0]
    # the trial: compile (3 x 2 s) + 10 measuring steps at the slow-down; at most 5% of the remaining steps' time
    trial = xla_payback.PRIOR_COMPILE_PER_OVERHEAD * 2.0 + 10 * 0.01 * (1 / conv.speedup - 1)
    assert try_choice(off, threshold, prior=conv, trial_steps=10)[1]["trial_cost_estimate_s"] == pytest.approx(
        trial, abs=1e-3)
    assert threshold == math.ceil(trial / (xla_payback.TRIAL_SHARE * 0.01))
    assert threshold > xla_payback.steps_to_try(off)  # a slow-down prior asks for a longer job than the default
    assert xla_payback.steps_to_try(off, prior=conv, trial_steps=1000) > threshold  # a longer trial


def test_xla_is_kept_only_where_its_steps_are_faster():
    auto = XlaAuto(steps_per_epoch=10, epochs=10, start=True, may_switch=True, reason="test")
    assert auto.measure_steps == xla_payback.MEASURE_MIN_STEPS
    auto.record(False, 0.1, 10, setup_s=5.0)  # a whole epoch: measured, however short
    assert auto.figures(False).step_s == pytest.approx(0.01)
    assert auto.next_chunk(3, 0, 10) == (True, 8)  # XLA not measured yet: a measuring chunk of 8 steps
    auto.record(True, 0.12, 8, setup_s=9.0, costs={"trace_s": 1.0, "first_call_s": 8.0})  # 8 steps in 0.12 s
    assert auto.figures(True) is None and auto.next_chunk(3, 8, 10) == (True, 10)  # too short: measure on
    auto.record(True, 0.03, 2)  # slower per step than without XLA
    assert auto.next_chunk(4, 0, 10) == (False, 10) and "XLA off again" in auto.events[-1], auto.events
    assert auto.cache_record()["jit_on"] == {"overhead_s": 9.0, "step_s": 0.015}
    assert auto.details()["measured"]["jit_on"]["first_call_s"] == 8.0


def _simulate(off: Figures, on: Figures, prior: xla_payback.Prior, steps_per_epoch: int, epochs: int):
    """The job's seconds and final setting as the decision plays out, each setting costing ``off`` / ``on``."""
    auto = XlaAuto(steps_per_epoch=steps_per_epoch, epochs=epochs, start=False, may_switch=True, reason="",
                   prior=prior)
    seconds, built = 0.0, set()
    for epoch in range(epochs):
        done = 0
        while done < steps_per_epoch:
            jit, stop = auto.next_chunk(epoch, done, steps_per_epoch)
            figures, setup = (on if jit else off), 0.0
            if jit not in built:
                built.add(jit)
                setup = figures.overhead_s
            seconds += setup + (stop - done) * figures.step_s
            auto.record(jit, (stop - done) * figures.step_s, stop - done, setup)
            done = stop
    return seconds, auto.jit, auto.cache_record()


# Model families as the decision sees them (no-XLA overhead s, ms/step, prior): the bench MLP, a KerasHub BERT, the
# bench CNN; XLA's overhead is the compile estimate and its step the prior's (what the arithmetic assumes).
FAMILIES = {"dense MLP": (1.0, 0.78, xla_payback.DENSE_PRIOR), "BERT": (3.7, 50.0, xla_payback.DENSE_PRIOR),
            "CNN (convolutions)": (1.0, 2.6, xla_payback.CONV_CPU_PRIOR)}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_auto_is_never_more_than_5_percent_slower_than_its_other_choice(family):
    """First run: at most 5% slower than the job with the other XLA choice, besides what measuring the no-XLA
    setting paid (its tracing and first call: a job that ends with XLA would not have built it). Second run, with
    the figures the first cached: never slower than the faster choice."""
    overhead, ms, prior = FAMILIES[family]
    off = Figures(overhead, ms / 1e3)
    on = Figures(xla_payback.PRIOR_COMPILE_PER_OVERHEAD * overhead, off.step_s / prior.speedup)
    for steps_per_epoch in (1, 3, 10, 30, 100, 192, 1000, 3000):
        for epochs in (1, 2, 3, 5, 8, 13, 21, 34, 60, 100, 300, 1000):
            steps = steps_per_epoch * epochs
            seconds, jit, record = _simulate(off, on, prior, steps_per_epoch, epochs)
            other = off.seconds(steps) if jit else on.seconds(steps)
            assert seconds - (0.0 if jit else off.overhead_s) <= 1.05 * other, (steps_per_epoch, epochs, jit)
            if record:
                cached = (on if start_choice(record, steps)[0] else off).seconds(steps)
                assert cached <= min(on.seconds(steps), off.seconds(steps)) * (1 + 1e-3), (steps_per_epoch, epochs)


def test_random_layers_never_switch():
    assert xla_payback.random_layers(_build(0.0)) == []
    model = _build(0.5)
    assert xla_payback.random_layers(model) == [model.layers[1].name]


def _switches(events, steps: int):
    """(0-based job step, XLA on?) of each switch auto's events name (``steps``: batches per epoch)."""
    found = []
    for event in events:
        m = re.match(r"epoch (\d+), step (\d+): XLA (tried|kept|off again)", event)
        if m and m.group(3) != "kept":
            found.append(((int(m.group(1)) - 1) * steps + int(m.group(2)) - 1, m.group(3) == "tried"))
    return found


def _keras_reference(x, y, events, build=_build, epochs: int = EPOCHS):
    """Keras fit (no shuffling), each run of batches with the ``jit_compile`` auto's events switched to (a partial
    last batch with the epoch's last setting); returns the model and the last fit's history (the last epoch's,
    where it had no switch)."""
    steps = -(-len(x) // BATCH)
    model, switches = build(), _switches(events, steps)
    setting = [([False] + [jit for at, jit in switches if at <= step])[-1] for step in range(epochs * steps)]
    history = None
    for epoch in range(epochs):
        first = 0
        for step in range(1, steps + 1):
            if step == steps or setting[epoch * steps + step] != setting[epoch * steps + first]:
                model.jit_compile, model.train_function = setting[epoch * steps + first], None
                part = slice(first * BATCH, min(len(x), step * BATCH))
                history = model.fit(x[part], y[part], batch_size=BATCH, epochs=1, shuffle=False, verbose=0).history
                first = step
    return model, history


def _check_like_keras(result, model, reference, history):
    assert sorted(result.history) == sorted(history)
    for key, values in history.items():
        np.testing.assert_allclose(result.history[key][-1:], values, rtol=1e-5, atol=1e-6, err_msg=key)
    for got, want in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_a_switch_inside_the_first_epoch_trains_what_keras_trains_and_the_second_run_reads_the_cache(
        cache, monkeypatch, clean_tf_config, caplog):
    """One no-XLA step measures the step, XLA's real compile (a call of 0 steps: it trains nothing) is timed, one
    XLA step measures it: the weights are Keras' with the same settings step by step (3 whole batches and a
    partial one per epoch, which runs with the epoch's last setting)."""
    monkeypatch.setattr(xla_payback, "PRIOR_COMPILE_PER_OVERHEAD", 0.0)  # any remaining steps pay: try at once
    monkeypatch.setattr(xla_payback, "MEASURE_MIN_STEPS", 1)
    monkeypatch.setattr(xla_payback, "MEASURE_MIN_SECONDS", 0.0)
    x, y = _data(N + 4)
    with tfaccel.scope(strategy="default", jit_compile="auto"):
        model = _build()
    result = tfaccel.fit(model, x, y, batch_size=BATCH, epochs=2, shuffle=False, seed=0, verbose=0)
    auto = result.details["xla_auto"]
    assert auto["events"][0].startswith("epoch 1, step 2: XLA tried"), auto
    assert auto["events"][1].startswith("epoch 1, step 3: XLA "), auto
    assert set(auto["measured"]) == {"jit_off", "jit_on"} and os.path.exists(auto["cache"]), auto
    assert auto["measured"]["jit_on"]["first_call_s"] > 0 and auto["measured"]["jit_on"]["trace_s"] > 0, auto
    reference, history = _keras_reference(x, y, auto["events"], epochs=2)
    _check_like_keras(result, model, reference, history)

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
    assert events[0].startswith("epoch 2, step 1: XLA tried") and "trial_cost_estimate_s" in events[0], events
    reference, history = _keras_reference(x, y, events, build=_build_conv)
    _check_like_keras(result, model, reference, history)


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
