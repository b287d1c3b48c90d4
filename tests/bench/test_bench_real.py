"""``tfaccel bench --suite real``: every contender in its own process, timed by the one Stopwatch, seeded order,
the JSON key ``real`` with medians and min-max, and a clear error for unknown models, paths and sizes."""

import argparse
import json
import subprocess
import sys

import pytest

import harness
from tfaccel.bench import BenchConfig, run_bench
from tfaccel.cli import bench as cli_bench
from tfaccel.errors import ConfigError
from tfaccel.bench.real import KERAS_MULTI_WORKER, format_real

FIGURE = {"median", "min", "max", "values"}


def test_real_suite_report_one_model_default_path(tmp_path):
    config = BenchConfig(suite="real", repeats=1, real_models=("recommender",), real_paths=("default",),
                         real_size="test", real_limits=("noxla",))  # XLA's limit compiles for 12 s here: left out
    report = run_bench(config, json_path=str(tmp_path / "bench.json"))
    row = json.loads((tmp_path / "bench.json").read_text())["real"]["rows"]["recommender"]["default"]
    assert row == json.loads(json.dumps(report["real"]["rows"]["recommender"]["default"]))
    contenders = ["keras", "limit_noxla", "tfaccel"]
    assert sorted(row["time_to_train"]) == contenders and sorted(row["order"][0]) == contenders
    for key in ("time_to_train_ratio", "steady_ratio", "limit", "limit_ratio"):
        assert set(row[key]) == FIGURE and row[key]["median"] > 0
    assert row["limit"] == row["time_to_train"]["limit_noxla"]
    assert row["limit_ratio"]["median"] == row["limit"]["median"] / row["time_to_train"]["tfaccel"]["median"]
    assert row["details"]["tfaccel"]["loop"] and row["details"]["keras"]["loop"] == "keras model.fit"
    assert "calling model.train_step" in row["details"]["limit_noxla"]["loop"]
    assert report["timing"]["timed"] == [f"recommender:default:{c}" for c in row["order"][0]]
    assert report["real"]["jobs"]["recommender"] == {"examples": 128, "batch_size": 32, "epochs": 2}
    text = format_real(report)
    assert "recommender (128 ex., batch 32, 2 epochs) default: plain " in text and "; limit " in text


def test_real_report_says_plain_keras_cannot_run_multi_worker():
    fig = {"median": 2.0, "min": 1.0, "max": 3.0, "values": [2.0]}
    report = {"config": {"repeats": 1}, "seconds": 1.0, "machine": {},
              "real": {"size": "test", "jobs": {"m": {"examples": 8, "batch_size": 4, "epochs": 2}},
                       "rows": {"m": {"multi_worker": {"time_to_train": {"tfaccel": fig}, "keras": KERAS_MULTI_WORKER}}}}}
    assert "multi_worker: tfaccel 2.0s; plain Keras cannot run" in format_real(report)
    assert "keras-team/keras#20585" in KERAS_MULTI_WORKER


@pytest.mark.parametrize("args, message", [
    (["--real-models", "bert"], "--real-models: unknown value 'bert'; valid values are: 'bert_classifier'"),
    (["--real-paths", "default,horovod"], "--real-paths: unknown value 'horovod'; valid values are: 'default'"),
    (["--real-size", "huge"], "--real-size: unknown value 'huge'; valid values are: 'test', 'bench'"),
])
def test_cli_rejects_bad_real_options(args, message):
    proc = subprocess.run([sys.executable, "-m", "tfaccel", "bench", "--suite", "real", *args], capture_output=True,
                          text=True, timeout=120, cwd=str(harness.REPO_ROOT))
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_cli_real_limits_option():
    """``--real-limits``: a list of the limit contenders, ``none`` for neither, an unknown one refused (in-process:
    the CLI's own parsing, without starting another Python)."""
    def parse(value):
        args = argparse.Namespace(real_size="test", real_models=None, real_paths=None, real_limits=value,
                                  real_zero=None)
        return cli_bench.real_config(BenchConfig(), args).real_limits

    assert parse(None) == ("xla", "noxla") and parse("none") == () and parse("noxla") == ("noxla",)
    with pytest.raises(ConfigError, match="--real-limits: unknown value 'tpu'; valid values are: 'xla', 'noxla'"):
        parse("xla,tpu")
