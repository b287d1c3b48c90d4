"""`tfaccel launch` with real TensorFlow clusters: MWMS all-reduce, parameter servers, kill -9, restarts, per-host."""

import json
import os
import signal
import sys
import time

import pytest

from launch_util import SCRIPTS, Launcher, wait_gone
from tfaccel.launch.procs import free_ports

pytestmark = pytest.mark.slow

PY = sys.executable
ALLREDUCE = str(SCRIPTS / "allreduce.py")
PS_COORDINATOR = str(SCRIPTS / "ps_coordinator.py")


def _json_lines(text: str, prefix: str) -> list:
    return [json.loads(line[len(prefix):]) for line in text.splitlines() if line.startswith(prefix + "{")]


def _finish(launcher: Launcher, timeout: float = 240) -> int:
    rc = launcher.wait(timeout=timeout)
    assert not wait_gone(launcher.all_pids()), "a process outlived the launcher"
    return rc


def test_two_workers_all_reduce_in_lock_step(clean_tf_config):
    with Launcher("--workers", "2", "--timeout", "240", "--", PY, ALLREDUCE, "--steps", "3") as launcher:
        rc = _finish(launcher)
    assert rc == 0, launcher.stderr[-3000:]
    reports = [_json_lines(launcher.stdout, f"[worker {i}] ")[-1] for i in range(2)]
    assert [r["task"] for r in reports] == [0, 1]
    assert all(r["replicas"] == 2 and r["sums"] == [3.0, 6.0, 9.0] for r in reports)
    assert "job finished OK" in launcher.stderr


def test_ps_cluster_runs_the_coordinator_on_the_chief_against_real_servers(clean_tf_config):
    with Launcher("--ps", "1", "--workers", "2", "--timeout", "300", "--grace", "5", "--",
                  PY, PS_COORDINATOR, "8") as launcher:
        rc = _finish(launcher, timeout=300)
    assert rc == 0, launcher.stderr[-3000:]
    assert sorted(launcher.task_pids) == ["chief:0", "ps:0", "worker:0", "worker:1"]
    report = _json_lines(launcher.stdout, "[chief 0] ")[-1]
    assert report["counter"] == 8.0 and report["total"] == 28.0 and report["workers"] == 2
    assert report["returned"] == [float(i) for i in range(8)]
    assert report["device"].startswith("/job:ps/")
    assert report["chief_listening"]  # so per-host ps/worker launchers can wait for the chief's port
    assert "(server) at 127.0.0.1:" in launcher.stderr and "-m tfaccel.launch.server" in launcher.stderr
    # the servers run until the chief is done, then the launcher ends them
    assert "stopping worker:0" in launcher.stderr and "ps:0 pid=" in launcher.stderr


def test_kill_9_of_a_worker_stops_the_job_within_30_s_naming_it(clean_tf_config):
    with Launcher("--workers", "2", "--timeout", "300", "--", PY, ALLREDUCE, "--steps", "100000",
                  "--step-sleep", "0.05") as launcher:
        launcher.wait_for(r"\[worker 1\] step 3 ", timeout=180)
        victim = launcher.task_pids["worker:1"][0]
        killed = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        rc = launcher.wait(timeout=60)
        took = time.monotonic() - killed
    print(f"MEASURED kill -9 worker:1 -> launcher exited in {took:.2f} s")
    assert rc == 137 and took < 30
    assert f"worker:1 (pid {victim}) failed: killed by SIGKILL (exit code 137)" in launcher.stderr
    assert "stopping worker:0" in launcher.stderr
    assert not wait_gone(launcher.all_pids())


def test_max_restarts_runs_the_job_again_after_a_killed_worker(clean_tf_config, tmp_path):
    marker = tmp_path / "worker1-crashed"
    started = time.monotonic()
    with Launcher("--workers", "2", "--max-restarts", "1", "--timeout", "300", "--", PY, ALLREDUCE,
                  "--steps", "4", "--crash-once", str(marker)) as launcher:
        rc = _finish(launcher, timeout=300)
    print(f"MEASURED crash + restart + second run: {time.monotonic() - started:.1f} s")
    assert rc == 0, launcher.stderr[-3000:]
    assert marker.exists()
    assert "killed by SIGKILL" in launcher.stderr
    assert "restarting the whole job (restart 1 (a failure, counted: 1 of 1 restarts used)" in launcher.stderr
    assert len(launcher.task_pids["worker:0"]) == 2  # started twice
    reports = [_json_lines(launcher.stdout, f"[worker {i}] ")[-1] for i in range(2)]
    assert all(r["restart"] == "1" and r["sums"] == [3.0, 6.0, 9.0, 12.0] for r in reports)
    assert "job finished OK" in launcher.stderr and "after 1 restart(s)" in launcher.stderr


def test_per_host_mode_two_launchers_make_one_cluster(clean_tf_config, tmp_path):
    ports = free_ports(2)
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(f"worker: ['127.0.0.1:{ports[0]}', '127.0.0.1:{ports[1]}']\n")
    common = ("--cluster", str(cluster), "--connect-timeout", "120", "--timeout", "240")
    with Launcher(*common, "--task", "worker:0", "--", PY, ALLREDUCE, "--steps", "2") as first, \
            Launcher(*common, "--task", "worker:1", "--", PY, ALLREDUCE, "--steps", "2") as second:
        rcs = [_finish(first), _finish(second)]
    assert rcs == [0, 0], first.stderr[-2000:] + second.stderr[-2000:]
    for index, launcher in enumerate((first, second)):
        report = _json_lines(launcher.stdout, f"[worker {index}] ")[-1]
        assert report["task"] == index and report["sums"] == [3.0, 6.0]
        assert list(launcher.task_pids) == [f"worker:{index}"]


def test_per_host_mode_parameter_server_cluster(clean_tf_config, tmp_path):
    """Four launchers, one per task: servers on ps and workers, the coordinator on the chief."""
    ports = free_ports(4)
    cluster = tmp_path / "ps.yaml"
    cluster.write_text(f"chief: ['127.0.0.1:{ports[0]}']\nworker: ['127.0.0.1:{ports[1]}', '127.0.0.1:{ports[2]}']\n"
                       f"ps: ['127.0.0.1:{ports[3]}']\n")
    common = ("--cluster", str(cluster), "--connect-timeout", "150", "--grace", "3", "--timeout", "280")
    launchers = {}
    try:
        for task in ("ps:0", "worker:0", "worker:1", "chief:0"):
            launchers[task] = Launcher(*common, "--task", task, "--", PY, PS_COORDINATOR, "6")
        assert _finish(launchers["chief:0"], timeout=280) == 0, launchers["chief:0"].stderr[-3000:]
        report = _json_lines(launchers["chief:0"].stdout, "[chief 0] ")[-1]
        assert report["counter"] == 6.0 and report["device"].startswith("/job:ps/")
        for task in ("ps:0", "worker:0", "worker:1"):  # servers serve until they are stopped
            server = launchers[task]
            assert server.proc.poll() is None and f"started {task} pid=" in server.stderr
            assert "(server)" in server.stderr
            assert "every other task of the cluster accepts connections" in server.stderr
            server.proc.send_signal(signal.SIGTERM)
            assert _finish(server, timeout=30) == 143
    finally:
        for launcher in launchers.values():
            launcher.close()
    assert not wait_gone([pid for launcher in launchers.values() for pid in launcher.all_pids()])
