"""The first hour of a new user (issue 33), the parts without TensorFlow: the launcher's script check and its quiet
echo, a tfaccel error in a launched task as one line, one learning-rate default for the CLI and the Python API,
`--help` text for every option, "did you mean" on a closed choice, and the getting-started page's numbers."""

import argparse
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import harness
from tfaccel.cli.main import build_parser
from tfaccel.errors import LAUNCHED_ENV, ConfigError, invalid_choice
from tfaccel.job import JobOptions
from tfaccel.launch.command import normalize_command, script_operand
from tfaccel.launch.tf_noise import is_tf_noise

REPO = harness.REPO_ROOT


@pytest.mark.parametrize("argv, script", [
    ("python nosuch.py", "nosuch.py"),
    (".venv/bin/python3 -u -W ignore train.py --epochs 2", "train.py"),
    ("/usr/bin/python3.11 -X dev t.py", "t.py"),
    ("python -m tfaccel.cli.main", None),
    ("python -c print(1)", None),
    ("bash run.sh a", "run.sh"),
    ("sh -e -o pipefail run.sh", "run.sh"),
    ("bash -ec true", None),
    ("tfaccel fit --model mlp", None),
    ("python", None),
])
def test_the_script_an_interpreter_runs(argv, script):
    assert script_operand(argv.split()) == script


def test_a_missing_script_is_refused_before_anything_starts(tmp_path):
    with pytest.raises(ConfigError, match=r"^command: script 'nosuch.py' not found \(received 'python3 -u nosuch.py'"):
        normalize_command(["python3", "-u", "nosuch.py"], check_exists=True)
    script = tmp_path / "train.py"
    script.write_text("")
    assert normalize_command(["python3", str(script)], check_exists=True)[0] == ("python3", str(script))
    assert normalize_command(["python3", "nosuch.py"])[0] == ("python3", "nosuch.py")  # for other hosts: unchecked


def test_python_missing_from_path_runs_with_this_python(tmp_path):
    """A PATH with python3 only (``env -i``, Debian without python-is-python3): ``-- python train.py`` runs."""
    script = tmp_path / "train.py"
    script.write_text("")
    bare = tmp_path / "bin"
    bare.mkdir()
    argv, notes = normalize_command(["python", str(script)], check_exists=True, env={"PATH": str(bare)})
    assert argv == (sys.executable, str(script)) and "not on PATH" in notes[0]
    with pytest.raises(ConfigError, match=r"program 'pythonx' not found on PATH"):
        normalize_command(["pythonx", str(script)], check_exists=True, env={"PATH": str(bare)})


def test_tensorflows_start_up_noise_is_recognised_and_nothing_else():
    noise = ["WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n",
             "I0000 00:00:1795838446.735485    4993 port.cc:153] oneDNN custom operations are on. You may see ...\n",
             "I0000 00:00:1795838498.265338    8583 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to\n",
             "To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow with the ...\n",
             "WARNING:tensorflow:Using CollectiveAllReduceStrategy eagerly has significant overhead currently. ...\n"]
    kept = ["tfaccel WARNING: fit: the global batch 63 does not split evenly over 2 replicas\n",
            "Epoch 1/5\n", "WARNING:tensorflow:Something else\n", "W0000 00:00:1.0 1 port.cc:1] a real warning\n"]
    assert all(is_tf_noise(line) for line in noise) and not any(is_tf_noise(line) for line in kept)


@pytest.mark.parametrize("env, expected", [
    ({LAUNCHED_ENV: "1"},
     "tfaccel.ConfigError at <string>:2: strategy: unknown value 'x'; valid values are: 'a' (TFACCEL_TRACEBACK=1 "
     "shows the traceback)\n"),
    ({}, None),
    ({LAUNCHED_ENV: "1", "TFACCEL_TRACEBACK": "1"}, None),
])
def test_a_tfaccel_error_in_a_launched_task_is_one_line(env, expected):
    code = "import tfaccel\nraise tfaccel.errors.invalid_choice('strategy', 'x', ['a'])"
    base = {k: v for k, v in os.environ.items() if k not in (LAUNCHED_ENV, "TFACCEL_TRACEBACK")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**base, "PYTHONPATH": str(REPO), **env})
    # a ConfigError in a launched task exits 2 (the launcher never restarts it); elsewhere Python's 1
    assert proc.returncode == (2 if env.get(LAUNCHED_ENV) else 1)
    if expected is None:
        assert proc.stderr.startswith("Traceback (most recent call last):"), proc.stderr
    else:
        assert proc.stderr == expected


def test_one_learning_rate_default_for_the_cli_and_the_python_api():
    import tfaccel.train.api as api

    fit_args = build_parser().parse_args(["fit"])
    assert fit_args.scale_learning_rate == JobOptions().scale_learning_rate == "none"
    assert inspect.signature(api.fit).parameters["scale_learning_rate"].default is None  # compile_and_fit passes it on


def _subparsers(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def test_every_option_of_every_verb_has_help():
    verbs = _subparsers(build_parser())
    missing = [f"tfaccel {verb} {action.option_strings or action.dest}" for verb, parser in verbs.items()
               for action in parser._actions if not action.help and action.dest != "help"]
    assert not missing, missing
    assert verbs["fit"].description and verbs["cache"].description
    memory = verbs["memory"].format_help()
    assert "lists them" not in memory and "multi_worker" in memory  # the names are in the help itself


def test_closed_choices_suggest_the_closest_value():
    assert "did you mean" not in str(invalid_choice("strategy", "gpu", ["default", "mirrored"]))  # nothing close
    assert str(invalid_choice("strategy", "Mirrored", ["default", "mirrored"], hint="Or 'auto'.")).endswith(
        "valid values are: 'default', 'mirrored'; did you mean 'mirrored'? Or 'auto'.")
    assert str(invalid_choice("np", 3, ["1", "2"])) == "np: unknown value 3; valid values are: '1', '2'"


def test_the_getting_started_shapes_are_the_codes():
    from tfaccel.datasets import load_dataset

    page = (REPO / "docs" / "getting-started.md").read_text()
    shape = re.search(r'load_dataset\("digits"\) .*: \((\d+), 8, 8, 1\)', page)
    assert shape and int(shape.group(1)) == load_dataset("digits")[0].shape[0]
