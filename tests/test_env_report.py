import json
import subprocess
import sys

import tfaccel
from tfaccel.report import format_report


def _tfaccel(*args, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "tfaccel", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_env_json_is_valid_and_names_tf_and_devices(clean_tf_config):
    proc = _tfaccel("env", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)  # JSON only on stdout
    import tensorflow as tf

    assert report["tensorflow"]["version"] == tf.__version__
    names = [d["name"] for d in report["devices"]["physical"]]
    assert "/physical_device:CPU:0" in names
    assert report["devices"]["logical"]
    assert report["tf_config"] == {"set": False}


def test_env_human_readable():
    proc = _tfaccel("env")
    assert proc.returncode == 0, proc.stderr
    assert "TensorFlow version" in proc.stdout and "Physical device: /physical_device:CPU:0" in proc.stdout


def test_malformed_tf_config_is_reported_not_a_crash():
    import os

    env = dict(os.environ, TF_CONFIG="{not json")
    proc = _tfaccel("env", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    tfc = json.loads(proc.stdout)["tf_config"]
    assert tfc["valid"] is False and "malformed TF_CONFIG" in tfc["error"]
    assert "malformed TF_CONFIG" in _tfaccel("env", env=env).stdout


def test_tf_config_summary(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["a:1", "b:2"], "ps": ["c:3"]},
                                                "task": {"type": "worker", "index": 1}}))
    report = tfaccel.env_report()
    assert report["tf_config"]["task_type"] == "worker" and report["tf_config"]["task_index"] == 1
    assert report["tf_config"]["num_tasks"] == 3
    assert "task worker:1 of 3 (worker=2, ps=1)" in format_report(report)


def test_auto_choices_are_shown_with_their_reasons():
    proc = _tfaccel("env")
    assert proc.returncode == 0, proc.stderr
    lines = {line.split(":")[0]: line for line in proc.stdout.splitlines()}
    for key in ("- auto strategy", "- auto precision", "- auto jit_compile"):
        assert "(" in lines[key], lines[key]  # "value (reason)"


def test_no_verb_prints_help_and_exits_2():
    proc = _tfaccel()
    assert proc.returncode == 2 and "usage: tfaccel" in proc.stderr
