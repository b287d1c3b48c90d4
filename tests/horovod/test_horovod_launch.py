"""tfaccel.launch.horovod: the horovodrun command line, and a real horovodrun bounded by a timeout."""

import sys
import time
from pathlib import Path

import pytest

import harness
from hvd_testing import require_horovod
from tfaccel.errors import BackendUnavailableError, ConfigError
from tfaccel.launch import horovod as lh
from tfaccel.launch.procs import pid_alive


def test_default_command_runs_np_ranks_on_localhost_over_loopback() -> None:
    assert lh.build_horovodrun_command(2, None, ["python", "train.py"], horovodrun="hr") == \
        ["hr", "--gloo", "-np", "2", "-H", "localhost:2", "--network-interfaces", "lo", "python", "train.py"]


def test_hosts_env_and_options() -> None:
    argv = lh.build_horovodrun_command(3, ["node1:2", "node2"], "-- train.py --epochs 2",
                                       extra_env={"A": "1", "B_2": "x y"}, horovodrun="hr", start_timeout=60,
                                       gloo_timeout=90, verbose=True)
    assert argv == ["hr", "--gloo", "-np", "3", "-H", "node1:2,node2:1", "--start-timeout", "60",
                    "--gloo-timeout-seconds", "90", "--verbose",
                    "env", "A=1", "B_2=x y", sys.executable, "train.py", "--epochs", "2"]
    argv = lh.build_horovodrun_command(4, "node1:4", ["python", "t.py"], horovodrun="hr",
                                       network_interfaces="eth0")
    assert argv[argv.index("--network-interfaces") + 1] == "eth0"


def test_parse_hosts() -> None:
    assert lh.parse_hosts("a:2, b:1", 3) == [("a", 2), ("b", 1)]
    assert lh.parse_hosts(None, 4) == [("localhost", 4)]


@pytest.mark.parametrize("np_value", [0, -1, 1.5, True, "2"])
def test_bad_np(np_value) -> None:
    with pytest.raises(ConfigError) as info:
        lh.build_horovodrun_command(np_value, None, ["python", "t.py"], horovodrun="hr")
    assert f"np: the number of Horovod ranks must be a whole number >= 1; received {np_value!r}" in str(info.value)


@pytest.mark.parametrize("hosts, message", [
    ("a:2,,b:1", "hosts: malformed entry '' in 'a:2,,b:1'; valid: comma-separated HOST[:SLOTS]"),
    ("a:x", "hosts: malformed entry 'a:x'"),
    ("a:0", "hosts: 'a:0' has 0 slots; every host needs at least 1"),
    ("a:1,a:1", "hosts: host 'a' is listed twice"),
    ("a:1", "np: 2 ranks do not fit in the 1 slot(s) of hosts 'a:1'; lower -np or add slots, e.g. -H a:2"),
])
def test_bad_hosts(hosts, message) -> None:
    with pytest.raises(ConfigError) as info:
        lh.build_horovodrun_command(2, hosts, ["python", "t.py"], horovodrun="hr")
    assert message in str(info.value)


def test_bad_command_env_and_start_timeout() -> None:
    with pytest.raises(ConfigError, match="command: received an empty command"):
        lh.build_horovodrun_command(2, None, [], horovodrun="hr")
    with pytest.raises(ConfigError, match="extra_env: '1A' is not a valid environment variable name"):
        lh.build_horovodrun_command(2, None, ["t"], extra_env={"1A": "x"}, horovodrun="hr")
    with pytest.raises(ConfigError, match="start_timeout: must be a whole number of seconds >= 1; received 0"):
        lh.build_horovodrun_command(2, None, ["t"], start_timeout=0, horovodrun="hr")
    with pytest.raises(ConfigError, match="gloo_timeout: must be a whole number of seconds >= 1; received 2.5"):
        lh.build_horovodrun_command(2, None, ["t"], gloo_timeout=2.5, horovodrun="hr")


def test_missing_horovodrun_points_to_the_install_script(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BackendUnavailableError) as info:
        lh.build_horovodrun_command(2, None, ["t"])
    assert "no `horovodrun` beside" in str(info.value) and "bash scripts/install_horovod.sh .venv" in str(info.value)


def test_finds_the_horovodrun_of_this_environment(monkeypatch, tmp_path) -> None:
    fake = tmp_path / "horovodrun"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    assert lh.find_horovodrun() == str(fake)


@pytest.mark.horovod
def test_timeout_stops_horovodrun_and_every_rank(tmp_path) -> None:
    require_horovod()
    sleeper = ("import os, pathlib, time; "
               f"pathlib.Path({str(tmp_path)!r}, 'pid' + os.environ['HOROVOD_RANK']).write_text(str(os.getpid())); "
               "time.sleep(300)")
    began = time.monotonic()
    # 30 s: horovodrun itself imports TensorFlow before it starts the ranks, which is slow on a busy machine.
    result = lh.run_horovod(2, [sys.executable, "-c", sleeper], timeout=30, grace=5, echo=False,
                            capture_lines=100, env=harness.CHILD_ENV, gloo_timeout=120)
    harness.STARTED_PIDS.extend(result.pids)
    assert result.returncode == 124 and result.reason == "timeout", result.message
    assert time.monotonic() - began < 90
    rank_pids = [int(p.read_text()) for p in sorted(Path(tmp_path).glob("pid*"))]
    assert len(rank_pids) == 2, f"both ranks should have started within 30 s:\n{result.tasks[0].stderr[-3000:]}"
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in rank_pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in rank_pids if pid_alive(p)], "ranks outlived the timeout"

