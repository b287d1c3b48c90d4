"""Issue 38 (6): a configuration error inside a task (a ``ConfigError``, exit 2) ends the job at once with the task's
message; neither ``--max-restarts`` nor an elastic job restarts it (a restart would fail the same way).

Real processes: ``python -m tfaccel launch`` runs a script whose task raises tfaccel's own ConfigError (a global
batch that does not split over 3 workers, from ``tfaccel.train.request``'s check). The script imports no TensorFlow,
so each attempt costs a Python start-up.
"""

import subprocess
import sys

import harness
from launch_util import launcher_env

from tfaccel.errors import EXIT_CONFIG, LAUNCHED_ENV

# What a task of a 3-worker job sees when it asks for a batch of 64 (tfaccel checks that the global batch splits
# evenly over the replicas). The attempt number shows how many attempts ran.
_SCRIPT = ("import os, sys\n"
           "import tfaccel\n"
           "print('ATTEMPT', os.environ.get('TFACCEL_RESTART_COUNT', '0'), flush=True)\n"
           "raise tfaccel.ConfigError('batch_size 64 does not split over the 3 replicas of this job; valid: a '\n"
           "                          'multiple of 3, e.g. 63 or 66')\n")


def _launch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tfaccel", "launch", *args, "--", sys.executable, "-c", _SCRIPT],
                          capture_output=True, text=True, timeout=120, env=launcher_env(),
                          cwd=str(harness.REPO_ROOT))


def test_a_config_error_is_not_restarted_by_max_restarts() -> None:
    out = _launch("--workers", "3", "--max-restarts", "2", "--network", "host", "--grace", "2")
    assert out.returncode == EXIT_CONFIG, out.stderr[-3000:]
    assert out.stdout.count("ATTEMPT 0") >= 1 and "ATTEMPT 1" not in out.stdout, out.stdout
    assert "restarting the whole job" not in out.stderr
    assert "a configuration error, tfaccel.ConfigError; a restart would fail the same way" in out.stderr
    assert "batch_size 64 does not split over the 3 replicas" in out.stderr  # the task's own message, shown
    assert "job failed on a configuration error (exit 2)" in out.stderr


def test_a_config_error_is_not_restarted_by_an_elastic_job() -> None:
    out = _launch("--workers", "1:2", "--max-restarts", "2", "--network", "host", "--grace", "2")
    assert out.returncode == EXIT_CONFIG, out.stderr[-3000:]
    assert "elastic attempt 2" not in out.stderr and "ATTEMPT 1" not in out.stdout
    assert "batch_size 64 does not split" in out.stderr


def test_outside_a_launch_a_config_error_keeps_pythons_exit_status() -> None:
    """The hook is only installed in launched tasks; a plain `python script.py` exits 1 as Python always does."""
    env = {k: v for k, v in launcher_env().items() if k != LAUNCHED_ENV}
    out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 1 and "tfaccel.errors.ConfigError: batch_size 64" in out.stderr
    launched = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=60,
                              env={**env, LAUNCHED_ENV: "1"})
    assert launched.returncode == EXIT_CONFIG and "Traceback" not in launched.stderr  # one line, then exit 2
    assert "tfaccel.ConfigError at <string>:4: batch_size 64 does not split" in launched.stderr
    full = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=60,
                          env={**env, LAUNCHED_ENV: "1", "TFACCEL_TRACEBACK": "1"})
    assert full.returncode == EXIT_CONFIG and "Traceback" in full.stderr  # Python's report kept, still exit 2


def test_another_exception_in_a_launched_task_keeps_exit_status_1() -> None:
    env = {**launcher_env(), LAUNCHED_ENV: "1"}
    out = subprocess.run([sys.executable, "-c", "import tfaccel\nraise RuntimeError('boom')"], capture_output=True,
                         text=True, timeout=60, env=env)
    assert out.returncode == 1 and "RuntimeError: boom" in out.stderr
