"""Issue 24 points 6 and 7: launches on this machine's network say which gRPC ports are exposed; Horovod ranks and
Ray workers get an allowlist of the launcher's environment plus what --env names."""

import json
import logging
import os
import stat
import sys

import pytest

from launch_util import kept_log, Launcher, wait_gone
from tfaccel.errors import ConfigError
from tfaccel.launch import netns
from tfaccel.launch.envpolicy import check_env_names, job_env, left_out, runtime_env
from tfaccel.launch.horovod import horovod_env, run_horovod
from tfaccel.launch.host import run_host
from tfaccel.launch.procs import free_ports
from tfaccel.launch.outcome import LaunchTask
from tfaccel.launch.supervisor import warn_exposed_ports

PY = sys.executable
PRINT_PORT = "import json, os; print('PORT', json.loads(os.environ['TF_CONFIG'])['cluster']['worker'])"


@pytest.fixture
def tfaccel_log():
    with kept_log(lambda record: record) as kept:
        yield kept


def _exposure_lines(text: str) -> list:
    return [line for line in text.splitlines() if "listen on every network interface" in line]


def test_host_network_launch_warns_once_naming_every_port(clean_tf_config):
    with Launcher("--workers", "2", "--network", "host", "--", PY, "-c", PRINT_PORT) as launcher:
        rc = launcher.wait(timeout=60)
    assert rc == 0, launcher.stderr
    assert not wait_gone(launcher.all_pids())
    lines = _exposure_lines(launcher.stderr)
    assert len(lines) == 1, launcher.stderr
    workers = json.loads(next(l for l in launcher.stdout.splitlines() if "PORT" in l).split("PORT ", 1)[1]
                         .replace("'", '"'))
    for index, address in enumerate(workers):
        assert f"{address.rsplit(':', 1)[1]} (worker:{index})" in lines[0]
    assert "firewall" in lines[0] and "--network private" in lines[0]


@pytest.mark.skipif(not netns.isolation_available()[0], reason="no private network namespace on this machine")
def test_private_network_launch_does_not_warn_about_exposed_ports(clean_tf_config):
    with Launcher("--workers", "1", "--network", "private", "--", PY, "-c", "pass") as launcher:
        rc = launcher.wait(timeout=60)
    assert rc == 0, launcher.stderr
    assert not _exposure_lines(launcher.stderr)


def test_per_host_launch_warns_naming_its_own_port(clean_tf_config, tmp_path, tfaccel_log):
    ports = free_ports(2)
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(f"worker: ['127.0.0.1:{ports[0]}', '127.0.0.1:{ports[1]}']\n")
    result = run_host([PY, "-c", "import time; time.sleep(30)"], cluster=str(cluster), task="worker:1",
                      connect_timeout=0.5, grace=1, echo=False)
    assert result.reason == "unreachable"
    warnings = [r.getMessage() for r in tfaccel_log if r.levelno == logging.WARNING
                and "listen on every network interface" in r.getMessage()]
    assert len(warnings) == 1 and f"{ports[1]} (worker:1)" in warnings[0] and str(ports[0]) not in warnings[0]


def test_exposure_warning_leaves_out_tasks_without_a_server(tfaccel_log):
    log = logging.getLogger("tfaccel")
    evaluator = LaunchTask("evaluator", 0, ("x",), {}, address="127.0.0.1:5")
    assert not warn_exposed_ports([evaluator, LaunchTask("horovodrun", 0, ("x",), {})], log)
    assert warn_exposed_ports([LaunchTask("ps", 0, ("x",), {}, server=True, address="[::1]:7")], log, restarts=True)
    message = tfaccel_log[-1].getMessage()
    assert "7 (ps:0)" in message and "a restart chooses new ports" in message


# ------------------------------------------------------------------------------------------ environment
LAUNCHER = {"PATH": "/venv/bin", "HOME": "/h", "PYTHONPATH": "/repo", "LC_ALL": "C", "CUDA_VISIBLE_DEVICES": "0",
            "TF_CONFIG": "{}", "TF_CPP_MIN_LOG_LEVEL": "2", "TFACCEL_RESTART_COUNT": "0", "EPOCHS": "3",
            "AWS_SECRET_ACCESS_KEY": "fake", "HF_TOKEN": "fake", "GITHUB_TOKEN": "fake", "WANDB_API_KEY": "fake",
            "LD_PRELOAD": "/evil.so", "HOROVOD_LOG_LEVEL": "INFO", "GLOO_SOCKET_IFNAME": "lo", "SSH_AUTH_SOCK": "/s"}
SECRETS = ("AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "GITHUB_TOKEN", "WANDB_API_KEY", "LD_PRELOAD")


def test_job_env_is_tfaccel_tf_and_named_variables_only():
    assert job_env(LAUNCHER) == {"TF_CPP_MIN_LOG_LEVEL": "2", "TFACCEL_RESTART_COUNT": "0"}
    assert job_env(LAUNCHER, names=["EPOCHS", "HF_TOKEN"])["HF_TOKEN"] == "fake"  # named: the user's choice
    assert job_env({}, defaults={"PYTHONUNBUFFERED": "1"}) == {"PYTHONUNBUFFERED": "1"}


def test_runtime_env_adds_what_a_program_needs_here_and_never_a_secret():
    env = runtime_env(LAUNCHER)
    assert {"PATH", "HOME", "PYTHONPATH", "LC_ALL", "CUDA_VISIBLE_DEVICES", "TF_CPP_MIN_LOG_LEVEL"} <= set(env)
    assert not set(SECRETS) & set(env) and "TF_CONFIG" not in env and "EPOCHS" not in env
    assert left_out(LAUNCHER, env, limit=2) == "9 variable(s) (AWS_SECRET_ACCESS_KEY, EPOCHS, ...)"


def test_horovod_env_keeps_horovod_settings_and_drops_secrets():
    env = horovod_env(LAUNCHER, names=["EPOCHS"])
    assert env["HOROVOD_LOG_LEVEL"] == "INFO" and env["GLOO_SOCKET_IFNAME"] == "lo" and env["SSH_AUTH_SOCK"] == "/s"
    assert env["EPOCHS"] == "3" and not set(SECRETS) & set(env)


def test_run_horovod_gives_horovodrun_only_the_allowlist(tmp_path, monkeypatch, clean_tf_config):
    """horovodrun copies its whole environment onto every rank's command line: what tfaccel starts it with is what
    the ranks (and `ps` on every host) see. A stand-in horovodrun records that environment."""
    seen = tmp_path / "env.json"
    fake = tmp_path / "horovodrun"
    fake.write_text(f"#!{PY}\nimport json, os\nopen({str(seen)!r}, 'w').write(json.dumps(dict(os.environ)))\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    for key, value in LAUNCHER.items():
        if key not in ("PATH", "HOME", "TF_CONFIG"):
            monkeypatch.setenv(key, value)
    monkeypatch.delenv("TFACCEL_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    result = run_horovod(1, [PY, "-c", "pass"], horovodrun=str(fake), env={"EXPLICIT": "1"}, forward=["EPOCHS"],
                         network="host", timeout=60, echo=False)
    assert result.returncode == 0, result.tasks[0].stderr
    env = json.loads(seen.read_text())
    assert env["EPOCHS"] == "3" and env["EXPLICIT"] == "1" and env["HOROVOD_LOG_LEVEL"] == "INFO"
    assert env["TFACCEL_RESTART_COUNT"] == "0" and env["PYTHONPATH"] == os.environ["PYTHONPATH"]
    assert not set(SECRETS) & set(env), sorted(env)
    assert env["TFACCEL_JOB_ID"].startswith("horovod-")  # one id for every rank: horovodrun passes it on
    monkeypatch.setenv("SLURM_JOB_ID", "4711")  # the allocation's id reaches the ranks, though SLURM_* does not
    assert run_horovod(1, [PY, "-c", "pass"], horovodrun=str(fake), network="host", timeout=60, echo=False).ok
    assert json.loads(seen.read_text())["TFACCEL_JOB_ID"] == "slurm-4711"
    assert run_horovod(1, [PY, "-c", "pass"], horovodrun=str(fake), network="host", timeout=60, echo=False,
                       job_id="hvd-run-3").ok
    assert json.loads(seen.read_text())["TFACCEL_JOB_ID"] == "hvd-run-3"


@pytest.mark.parametrize("names, words", [
    (["A B"], "not an environment variable name"),
    (["1X"], "not an environment variable name"),
    (["X" * 500], "not an environment variable name"),
    (["TF_CONFIG"], "gives every task its own TF_CONFIG"),
    (["TFACCEL_SURELY_NOT_SET_24"], "not set in this environment"),
])
def test_bad_env_names_are_refused(names, words):
    with pytest.raises(ConfigError, match=words):
        check_env_names(names, {"TF_CONFIG": "{}"})
