"""`tfaccel launch` as a real process: options, dry run, exit codes, signal forwarding, no orphans."""

import json
import os
import signal
import sys
import time

import pytest

from launch_util import SCRIPTS, Launcher, track, wait_gone
from tfaccel.launch.procs import free_ports

PY = sys.executable
SLEEPER = str(SCRIPTS / "sleeper.py")


def _launch(*args, timeout=60):
    with Launcher(*args) as launcher:
        rc = launcher.wait(timeout=timeout)
    assert not wait_gone(launcher.all_pids()), "a process outlived the launcher"
    return rc, launcher


def _one_error_line(launcher) -> str:
    lines = [line for line in launcher.stderr.splitlines() if "error" in line.lower()]
    assert len(lines) == 1, launcher.stderr
    return lines[0]


def test_dry_run_prints_tasks_tf_configs_and_commands_and_starts_nothing(clean_tf_config):
    rc, launcher = _launch("--ps", "1", "--workers", "2", "--dry-run", "--", "coordinator.py")
    assert rc == 1 + 1 and "script 'coordinator.py' not found" in launcher.stderr  # it checks the command
    rc, launcher = _launch("--ps", "1", "--workers", "2", "--dry-run", "--", PY, "-c", "pass")
    assert rc == 0
    out = launcher.stdout
    assert "would start 4 task(s)" in out and "strategy hint parameter_server; nothing was started" in out
    assert "chief:0  127.0.0.1:" in out and f"command: {PY} -c pass" in out
    assert out.count("server: ") == 3 and "-m tfaccel.launch.server" in out
    configs = [json.loads(line.split("TF_CONFIG=", 1)[1]) for line in out.splitlines() if "TF_CONFIG=" in line]
    assert [c["task"]["type"] for c in configs] == ["chief", "worker", "worker", "ps"]
    assert not launcher.task_pids and "started" not in launcher.stderr
    # it says which defaults it filled in
    assert "defaults filled in" in launcher.stderr and "--max-restarts 0" in launcher.stderr
    assert "--chief: added (ps=1 without a chief" in launcher.stderr


def test_dry_run_per_host_names_the_peers_it_waits_for(clean_tf_config, tmp_path):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("worker: ['10.0.0.1:2222', '10.0.0.2:2222']\n")
    script = tmp_path / "train.py"  # this host's task runs it: it must exist here (checked before anything starts)
    script.write_text("")
    rc, launcher = _launch("--cluster", str(cluster), "--task", "worker:1", "--connect-timeout", "7", "--dry-run",
                           "--", PY, str(script))
    assert rc == 0
    assert "per-host mode, task worker:1" in launcher.stdout
    assert f"worker:1  10.0.0.2:2222  command: {PY} {script}" in launcher.stdout
    assert "would wait up to 7 s for: worker:0 (10.0.0.1:2222)" in launcher.stdout


def test_defaults_are_announced_and_py_files_run_with_this_python(clean_tf_config, tmp_path):
    script = tmp_path / "hello.py"
    script.write_text("import sys; print('hi from', sys.executable)\n")
    rc, launcher = _launch("--", str(script))
    assert rc == 0
    assert "defaults filled in (pass the options to set them): --backend tf, --workers 2, ports chosen by the OS " \
        "on 127.0.0.1" in launcher.stderr
    assert f"hello.py is run with this Python ({PY})" in launcher.stderr
    assert launcher.stdout.count(f"hi from {PY}") == 2 and sorted(launcher.task_pids) == ["worker:0", "worker:1"]


def test_output_is_prefixed_and_streams_stay_apart(clean_tf_config):
    code = ("import json, os, sys; t = json.loads(os.environ['TF_CONFIG'])['task']; "
            "print('to-stdout', t['index']); print('to-stderr', t['index'], file=sys.stderr)")
    rc, launcher = _launch("--workers", "2", "--", PY, "-c", code)
    assert rc == 0
    assert "[worker 0] to-stdout 0" in launcher.stdout and "[worker 1] to-stdout 1" in launcher.stdout
    assert "[worker 1] to-stderr 1" in launcher.stderr and "to-stderr" not in launcher.stdout
    assert not [line for line in launcher.stderr.splitlines() if line.startswith("[worker") and "to-stdout" in line]


def test_exit_code_and_failing_task_are_reported(clean_tf_config):
    started = time.monotonic()
    rc, launcher = _launch("--workers", "2", "--grace", "2", "--", PY, SLEEPER, "--exit-after", "0.5", "--code", "9",
                           "--only", "worker:1")
    assert rc == 9 and time.monotonic() - started < 20
    assert "worker:1 (pid" in launcher.stderr and "failed: exit code 9" in launcher.stderr
    assert "worker:1 exiting with 9" in launcher.stderr  # its last lines
    assert "job failed (exit 9)" in launcher.stderr


def test_timeout_exits_124(clean_tf_config):
    rc, launcher = _launch("--workers", "1", "--timeout", "2", "--grace", "1", "--", PY, SLEEPER)
    assert rc == 124 and "timed out after 2 s (--timeout)" in launcher.stderr


@pytest.mark.parametrize("sig, expected", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_to_launcher_reaches_every_task_and_leaves_no_orphan(clean_tf_config, sig, expected):
    with Launcher("--workers", "2", "--grace", "5", "--", PY, SLEEPER) as launcher:
        children = [int(launcher.wait_for(rf"\[worker {i}\] ready .* child=(\d+)", timeout=30).group(1))
                    for i in range(2)]
        track(children)
        sent = time.monotonic()
        launcher.proc.send_signal(sig)
        rc = launcher.wait(timeout=30)
        took = time.monotonic() - sent
    assert rc == expected, launcher.stderr
    assert took < 5  # the tasks obey the forwarded signal: no need to wait for the grace period
    assert f"interrupted by {sig.name}; forwarded {sig.name} to every task" in launcher.stderr
    assert not wait_gone(launcher.all_pids() + children)


def test_tasks_die_with_a_sigkilled_launcher(clean_tf_config):
    """SIGKILL cannot be forwarded: the tasks are SIGKILLed by the kernel instead (PR_SET_PDEATHSIG)."""
    with Launcher("--workers", "2", "--", PY, SLEEPER) as launcher:
        ready = [launcher.wait_for(rf"\[worker {i}\] ready .* pid=(\d+) child=(\d+)", timeout=30) for i in range(2)]
        tasks = [int(m.group(1)) for m in ready]
        grandchildren = [int(m.group(2)) for m in ready]
        track(grandchildren)
        assert sorted(tasks) == sorted(launcher.task_pids["worker:0"] + launcher.task_pids["worker:1"])
        launcher.proc.send_signal(signal.SIGKILL)
        launcher.wait(timeout=10)
        gone_in_time = not wait_gone(tasks, timeout=5)
        for pid in grandchildren:  # processes the tasks started themselves are out of reach: end them here
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        assert not wait_gone(grandchildren)
    assert gone_in_time, "tasks outlived their SIGKILLed launcher"


def test_tasks_ignoring_the_signal_are_killed_after_grace(clean_tf_config):
    with Launcher("--workers", "2", "--grace", "1", "--", PY, SLEEPER, "--ignore-term") as launcher:
        children = [int(launcher.wait_for(rf"\[worker {i}\] ready .* child=(\d+)", timeout=30).group(1))
                    for i in range(2)]
        track(children)
        launcher.proc.send_signal(signal.SIGTERM)
        rc = launcher.wait(timeout=30)
    assert rc == 143
    assert not wait_gone(launcher.all_pids() + children)


def test_per_host_missing_peer_is_a_clear_error_within_connect_timeout(clean_tf_config, tmp_path):
    ports = free_ports(2)
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(f"worker: ['127.0.0.1:{ports[0]}', '127.0.0.1:{ports[1]}']\n")
    started = time.monotonic()
    rc, launcher = _launch("--cluster", str(cluster), "--task", "worker:0", "--connect-timeout", "3", "--grace", "1",
                           "--", PY, SLEEPER)
    elapsed = time.monotonic() - started
    assert rc == 1 and elapsed < 15
    line = _one_error_line(launcher)
    assert f"never accepted connections within 3 s (--connect-timeout): worker:1 (127.0.0.1:{ports[1]})" in line


@pytest.mark.parametrize("args, message", [
    (["--workers", "2"], "command: none given; put it after `--`"),
    (["--task", "worker:0", "--", "x"], "--task: needs --cluster FILE"),
    (["--cluster", "c.yaml", "--workers", "2", "--", "x"], "--cluster: given together with --workers"),
    (["--max-restarts", "-1", "--", "x"], "--max-restarts: must be >= 0; received -1"),
    (["--timeout", "0", "--", "x"], "--timeout: must be a positive number of seconds; received 0"),
    (["--workers", "0", "--", "x"], "workers: must be an integer >= 1; received 0"),
    (["--cluster", "does-not-exist.yaml", "--", "x"], "cluster file does-not-exist.yaml: no such file"),
    (["-np", "2", "--", "x"], "-np: only with --backend horovod; received --backend tf"),
    (["--workers", "1", "--", "no-such-program-xyz", "-v"], "command: program 'no-such-program-xyz' not found on PATH "
                                                            "(received 'no-such-program-xyz -v')"),
    (["--workers", "1", "--", "./no/such/script.py"], "command: script './no/such/script.py' not found"),
    (["--workers", "2", "--", PY, "-u", "nosuch.py"], f"command: script 'nosuch.py' not found (received '{PY} -u "
                                                      "nosuch.py'"),
    (["--workers", "1", "--", "./no/such/tool"], "command: program './no/such/tool' not an executable file"),
    (["--backend", "horovod", "--workers", "2", "--", "x"], "--backend horovod: --workers are for --backend tf"),
    (["--backend", "horovod", "-np", "0", "--dry-run", "--", "x"], "np: the number of Horovod ranks must be"),
])
def test_bad_options_are_one_line_errors_with_exit_2(clean_tf_config, args, message):
    rc, launcher = _launch(*args)
    assert rc == 2 and not launcher.task_pids  # before anything starts
    line = _one_error_line(launcher)
    assert line.startswith("tfaccel launch: error: ") and message in line


def test_remote_cluster_file_without_task_is_refused(clean_tf_config, tmp_path):
    cluster = tmp_path / "remote.yaml"
    cluster.write_text("worker: ['127.0.0.1:2222', '192.0.2.9:2222']\n")
    rc, launcher = _launch("--cluster", str(cluster), "--", "x")
    assert rc == 2
    assert "these addresses are not on it: worker:1 (192.0.2.9:2222)" in _one_error_line(launcher)


def test_task_not_in_cluster_file_is_refused(clean_tf_config, tmp_path):
    cluster = tmp_path / "c.yaml"
    cluster.write_text("worker: ['127.0.0.1:2222']\n")
    rc, launcher = _launch("--cluster", str(cluster), "--task", "ps:0", "--", "x")
    assert rc == 2
    assert "the cluster has no 'ps' role" in _one_error_line(launcher)


def test_horovod_backend_dry_run_shows_the_horovodrun_command(clean_tf_config):
    rc, launcher = _launch("--backend", "horovod", "-np", "2", "--dry-run", "--", "python", "train.py")
    if rc != 0 and "no `horovodrun`" in launcher.stderr:  # not built here: the error must say how to build it
        assert "scripts/install_horovod.sh" in _one_error_line(launcher)
        return
    assert rc == 0, launcher.stderr
    assert "would start 2 rank(s) through horovodrun; nothing was started" in launcher.stdout
    assert "--gloo -np 2 -H localhost:2" in launcher.stdout and launcher.stdout.rstrip().endswith("python train.py")
    assert "-np 2" not in launcher.stderr and "-H localhost:N" in launcher.stderr  # the filled-in default
