"""Issue 24: one job identity per launch (TFACCEL_JOB_ID), shared by every task, kept across restarts, derived the
same on every host in per-host mode; real launches of small commands (no TensorFlow in the tasks, ~15 s in all).

The evaluator's side (an old progress file of another job is not followed) runs in
test_launch_evaluator.py::test_evaluator_follows_every_checkpoint_and_ends_with_the_job.
"""

import json
import subprocess
import sys

import pytest

import launch_util
from tfaccel.errors import ConfigError
from tfaccel.job_id import JOB_ID_ENV, SLURM_JOB_ENV, cluster_job_id, environment_job_id
from tfaccel.launch import run_local
from tfaccel.launch.procs import free_ports

# Prints the task's job id; worker:1 fails the first attempt (after worker:0 has printed and ended).
PROBE = ("import json, os, sys, time\n"
         "restart = os.environ['TFACCEL_RESTART_COUNT']\n"
         "index = json.loads(os.environ['TF_CONFIG'])['task']['index']\n"
         "print('JOBID', index, restart, os.environ['TFACCEL_JOB_ID'], flush=True)\n"
         "if restart == '0' and index == 1 and os.environ.get('PROBE_FAIL_FIRST'):\n"
         "    time.sleep(1.5)\n"
         "    sys.exit(3)\n")


def _ids(result) -> list:
    return [tuple(line.split()[1:]) for attempt in result.attempts for task in attempt
            for line in task.stdout.splitlines() if line.startswith("JOBID ")]


def test_local_workers_share_one_job_id_that_a_restart_keeps(monkeypatch):
    monkeypatch.delenv(JOB_ID_ENV, raising=False)
    monkeypatch.delenv(SLURM_JOB_ENV, raising=False)
    result = run_local([sys.executable, "-c", PROBE], workers=2, max_restarts=1, env={"PROBE_FAIL_FIRST": "1"},
                       timeout=120, echo=False)
    assert result.returncode == 0 and result.restarts == 1, [t.stderr for t in result.tasks]
    seen = _ids(result)
    assert sorted((index, restart) for index, restart, _ in seen) == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")]
    assert len({job for _, _, job in seen}) == 1 and seen[0][2].startswith("local-"), seen
    # a second launch is another job
    again = run_local([sys.executable, "-c", PROBE], workers=1, timeout=60, echo=False)
    assert _ids(again)[0][2] != seen[0][2]
    # the environment's id wins over a new one, and the launch's own over the environment's
    monkeypatch.setenv(JOB_ID_ENV, "from-env-1")
    assert {job for _, _, job in _ids(run_local([sys.executable, "-c", PROBE], workers=2, timeout=60,
                                                echo=False))} == {"from-env-1"}
    assert {job for _, _, job in _ids(run_local([sys.executable, "-c", PROBE], workers=1, timeout=60, echo=False,
                                                job_id="given-2"))} == {"given-2"}


def test_job_ids_from_the_environment_and_bad_ones():
    assert environment_job_id({SLURM_JOB_ENV: "4711"}) == "slurm-4711"  # every node of the allocation, and a requeue
    assert environment_job_id({SLURM_JOB_ENV: "4711", JOB_ID_ENV: "mine"}) == "mine"
    assert environment_job_id({}) is None
    with pytest.raises(ConfigError, match=r"job_id \(--job-id\) must be 1-128 characters .*received 'a b/\.\.'"):
        run_local([sys.executable, "-c", "pass"], workers=1, job_id="a b/..", echo=False)
    out = subprocess.run([sys.executable, "-m", "tfaccel", "launch", "--job-id", "x" * 300, "--", "true"],
                         capture_output=True, text=True, timeout=60, env=launch_util.launcher_env())
    assert out.returncode == 2 and "--job-id must be 1-128 characters" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def _env(**extra: str) -> dict:
    """A launcher's environment without a job id of its own (unless given)."""
    env = {k: v for k, v in launch_util.launcher_env().items() if k not in (JOB_ID_ENV, SLURM_JOB_ENV)}
    return {**env, **extra}


def _per_host(cluster, task: str, *args: str, env=None) -> str:
    code = "import os; print('JOBID', os.environ['TFACCEL_JOB_ID'], flush=True)"
    out = subprocess.run([sys.executable, "-m", "tfaccel", "launch", "--cluster", str(cluster), "--task", task,
                          "--connect-timeout", "30", "--timeout", "60", *args, "--", sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=90, env=env or _env())
    assert out.returncode == 0, out.stderr[-3000:]
    return next(line.split("JOBID ", 1)[1].strip() for line in out.stdout.splitlines() if "JOBID " in line)


def test_per_host_launches_of_one_cluster_file_get_the_same_id(tmp_path):
    ports = free_ports(2)
    cluster = tmp_path / "two_hosts.yaml"
    cluster.write_text(f"worker: ['127.0.0.1:{ports[0]}', '127.0.0.1:{ports[1]}']\n")
    first = _per_host(cluster, "worker:0")
    second = _per_host(cluster, "worker:1")
    from tfaccel.cluster import ClusterSpec

    assert first == second == cluster_job_id(ClusterSpec.from_file(cluster)), (first, second)
    assert _per_host(cluster, "worker:1", "--job-id", "run-7") == "run-7"
    assert _per_host(cluster, "worker:0", env=_env(**{JOB_ID_ENV: "sched-9"})) == "sched-9"
    assert _per_host(cluster, "worker:1", env=_env(**{SLURM_JOB_ENV: "4711"})) == "slurm-4711"


A_JOB = ("import os, sys, time\n"
         "from tfaccel.resilience.backups import commit_backup\n"
         "backup_dir, release = sys.argv[1], sys.argv[2]\n"
         "os.makedirs(backup_dir, exist_ok=True)\n"
         "open(os.path.join(backup_dir, 'backup-1.weights.h5'), 'wb').write(b'weights')\n"
         "commit_backup(backup_dir, {'epoch': 0, 'step': 1, 'global_step': 1, 'weights': 'backup-1.weights.h5'})\n"
         "print('A-COMMITTED', flush=True)\n"
         "deadline = time.time() + 90\n"
         "while not os.path.exists(release) and time.time() < deadline:\n"
         "    time.sleep(0.1)\n")
B_JOB = ("import sys\n"
         "from tfaccel.errors import ConfigError\n"
         "from tfaccel.resilience.backups import read_backup\n"
         "try:\n"
         "    read_backup(sys.argv[1])\n"
         "except ConfigError as exc:\n"
         "    print('REFUSED', exc, flush=True)\n"
         "    sys.exit(3)\n"
         "print('NOT REFUSED', flush=True)\n")


def test_a_second_job_on_the_same_backup_dir_is_refused_naming_both_ids(tmp_path):
    backup_dir, release = tmp_path / "backup", tmp_path / "release"
    with launch_util.Launcher("--workers", "1", "--job-id", "job-a", "--timeout", "120", "--", sys.executable, "-c",
                              A_JOB, str(backup_dir), str(release)) as first:
        first.wait_for("A-COMMITTED", timeout=90)
        second = subprocess.run([sys.executable, "-m", "tfaccel", "launch", "--workers", "1", "--job-id", "job-b",
                                 "--timeout", "60", "--", sys.executable, "-c", B_JOB, str(backup_dir)],
                                capture_output=True, text=True, timeout=90, env=_env())
        release.write_text("")
        assert first.wait(timeout=60) == 0, first.stderr[-3000:]
    assert second.returncode == 3, second.stdout[-2000:] + second.stderr[-2000:]
    refused = next(line for line in second.stdout.splitlines() if "REFUSED" in line)
    assert "is in use by job 'job-a'" in refused and "this is job 'job-b'" in refused, refused
    assert json.loads((backup_dir / "tfaccel_backup.json").read_text())["job"]["id"] == "job-a"  # left as it was
