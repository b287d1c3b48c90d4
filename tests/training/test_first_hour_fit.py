"""What `tfaccel.fit` tells a new user (issue 33), in one process: one XLA decision in scope()'s plan, the result's
plan and `tfaccel env`; one short INFO line per job with its throughput labelled; no seed line at verbose=0; a
WARNING where an uneven global batch leaves the multi-step loop; a non-chief's ModelCheckpoint copy said to be
scratch."""

import dataclasses
import logging
import re
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "strategies"))

from strategies_logs import tfaccel_records  # noqa: E402

import tfaccel  # noqa: E402
from tfaccel.devices import detect_devices  # noqa: E402
from tfaccel.strategies import get_backend  # noqa: E402
from tfaccel.strategies.entries import sketch_backend  # noqa: E402
from tfaccel.resilience import keras_callbacks  # noqa: E402
from tfaccel.train.data import prepare_data  # noqa: E402
from tfaccel.train.loops.multi_step import uneven_batch_warning  # noqa: E402
from tfaccel.xla import resolve_jit  # noqa: E402

X = np.random.default_rng(0).normal(size=(63, 4)).astype("float32")
Y = (X[:, 0] > 0).astype("int32")


def _model() -> keras.Model:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def _messages(records, level=logging.INFO):
    return [r.getMessage() for r in records if r.levelno == level]


def test_scope_result_and_env_show_one_xla_decision(clean_tf_config, tmp_path, monkeypatch):
    monkeypatch.setenv("TFACCEL_CACHE_DIR", str(tmp_path))  # no figures of an earlier run
    with tfaccel.scope(strategy="default") as plan:
        model = _model()
    with tfaccel_records() as records:
        result = tfaccel.fit(model, X, Y, batch_size=21, epochs=3, verbose=2, seed=0)
    assert plan.jit_compile is False and result.plan.jit_compile is False and model.jit_compile is False
    assert "decided per job by tfaccel.fit: off to start" in plan.jit_reason  # where it may still change, and why
    assert result.plan.jit_reason.startswith("auto: XLA off to start")
    # `tfaccel env` on a one-CPU machine: describe_auto's XLA line for the strategy it sketches there
    devices = detect_devices(initialise=False)
    assert resolve_jit("auto", backend=sketch_backend(strategy="default", devices=devices), devices=devices) == \
        (False, plan.jit_reason)
    # the job's one INFO line: short, its throughput labelled with the epochs it is measured over
    [line] = _messages(records)
    assert line.startswith("trained 9 steps in ") and "examples/s over epochs 2-3, the first left out" in line
    assert line.endswith("default x1 replica, float32, XLA off, compiled loop") and len(line) < 300, line
    assert result.details["examples_per_sec_over"].startswith("epochs 2-3")
    assert any(m.startswith("plan: strategy default") for m in _messages(records, logging.DEBUG))


def test_verbose_0_prints_no_seed_line(clean_tf_config):
    with tfaccel.scope(strategy="default"):
        model = _model()
    with tfaccel_records() as records:
        result = tfaccel.fit(model, X, Y, batch_size=21, epochs=1, verbose=0)
    assert _messages(records) == [] and _messages(records, logging.WARNING) == []
    assert any(f"drew seed {result.details['seed']}" in m for m in _messages(records, logging.DEBUG))


def test_an_uneven_global_batch_warns_why_it_leaves_the_multi_step_loop(clean_tf_config, cpu_replicas):
    backend = get_backend("mirrored")
    warning = uneven_batch_warning(backend, prepare_data(X, Y, batch_size=63 // 3))
    assert warning == ("fit: the global batch 21 does not split evenly over 2 replicas, so this job runs Keras fit, "
                       "one step per call, instead of tfaccel's multi-step loop (measured 1.9-5.4x the examples/s "
                       "under multi_worker); to train on the fast path, use a global batch_size that divides by the "
                       "2 replicas (20 or 22)")
    assert "leaves at least 2 examples in the last batch" in uneven_batch_warning(
        backend, prepare_data(X[:61], Y[:61], batch_size=20))
    assert uneven_batch_warning(get_backend("default"), prepare_data(X, Y, batch_size=21)) is None
    with tfaccel.scope(strategy="mirrored"):
        model = _model()
    with tfaccel_records() as records:
        result = tfaccel.fit(model, X[:62], Y[:62], batch_size=22, epochs=1, verbose=0, seed=0)
    assert result.details["loop_name"] == "multi_step" and _messages(records, logging.WARNING) == []


@dataclasses.dataclass
class _Backend:  # the fields of tfaccel's Backend that keras_callbacks reads
    is_chief: bool
    num_workers: int = 2


def test_a_non_chief_says_its_checkpoint_copy_is_scratch(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    user = keras.callbacks.ModelCheckpoint("/data/best.keras", verbose=1)
    with tfaccel_records() as records:
        [copy, _remover] = keras_callbacks.worker_callbacks([user], backend=_Backend(is_chief=False))
    assert user.verbose == 1 and copy.verbose == 0  # Keras' "saving model to <scratch path>" is not printed
    [said] = records
    assert said.all_tasks and said.getMessage() == (
        f"ModelCheckpoint('/data/best.keras') is written by the chief; this worker (not the chief) saves its scratch "
        f"copy to {copy.filepath}, removed when training ends")
    assert copy.filepath.startswith(str(tmp_path))


@pytest.mark.parametrize("name, received, suggestion", [
    ("strategy", "mirorred", "did you mean 'mirrored'?"),
    ("precision", "mixed_float61", "did you mean 'mixed_float16'?"),
])
def test_closed_choices_from_python_say_did_you_mean(clean_tf_config, name, received, suggestion):
    call = tfaccel.get_strategy if name == "strategy" else tfaccel.set_precision
    with pytest.raises(tfaccel.ConfigError, match=f"{name}: unknown value '{received}'; valid values are: .*; "
                                                  f"{re.escape(suggestion)} "):
        call(received)
