"""Options and messages of the Ray backend that need no Ray cluster."""

import os
import subprocess
import sys

import pytest

import harness
from tfaccel.cli.main import main as cli_main
from tfaccel.errors import ConfigError
from tfaccel.launch import run_ray
from tfaccel.launch.ray import forwarded_env, ray_backup_dir, ray_context, report_callbacks
from tfaccel.launch.ray_driver import first_failure
from tfaccel.launch.ray_worker import enter_launch_dir


@pytest.mark.parametrize("kwargs, words", [
    ({"workers": 0}, "workers: must be a whole number >= 1; received 0"),
    ({"max_restarts": -1}, "max_restarts: must be a whole number >= 0; received -1"),
    ({"timeout": 0}, "timeout: must be a positive number of seconds or None; received 0"),
    ({"address": " "}, "address: received an empty address"),
    ({"address": "127.0.0.1:1", "network": "private"}, "network='private': a private network namespace has only "
                                                       "loopback, but the run joins the Ray cluster at '127.0.0.1:1'"),
    ({"network": "nope"}, "nope"),
])
def test_run_ray_rejects_bad_options(kwargs, words):
    with pytest.raises(ConfigError, match=None) as info:
        run_ray(["python", "x.py"], **kwargs)
    assert words in str(info.value)


def test_run_ray_checks_the_command_for_a_local_instance(tmp_path):
    with pytest.raises(ConfigError, match="script 'missing.py' not found"):
        run_ray(["missing.py"], workers=1)


@pytest.mark.parametrize("argv, words", [
    (["--address", "h:1", "--", "x.py"], "--address: only with --backend ray; received --backend tf"),
    (["--backend", "horovod", "--storage-path", "d", "--", "x.py"], "--storage-path: only with --backend ray"),
    (["--backend", "ray", "-np", "2", "--", "x.py"], "--backend ray: -np are not Ray options"),
    (["--backend", "ray", "--ps", "1", "--", "x.py"], "--backend ray: --ps are not Ray options"),
    (["--backend", "ray", "--workers", "0", "--", "x.py"], "--workers: must be >= 1; received 0"),
])
def test_cli_rejects_options_that_are_not_for_ray(argv, words, capsys):
    assert cli_main(["launch", *argv]) == 2
    assert words in capsys.readouterr().err


def test_cli_dry_run_says_where_the_workers_would_run(capsys, caplog, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    assert cli_main(["launch", "--backend", "ray", "--workers", "3", "--max-restarts", "2", "--dry-run", "--",
                     str(script)]) == 0
    out = capsys.readouterr()
    assert ("would run 3 Ray Train worker(s) on a private local Ray instance on 127.0.0.1 (or $RAY_ADDRESS); on a "
            "failure Ray restarts the worker group, up to 2 time(s); nothing was started") in out.out
    assert "--address $RAY_ADDRESS or a private local Ray instance on 127.0.0.1" in caplog.text
    assert cli_main(["launch", "--backend", "ray", "--address", "10.0.0.1:6379", "--dry-run", "--", "x.py"]) == 0
    assert "would run 2 Ray Train worker(s) on the Ray cluster at 10.0.0.1:6379" in capsys.readouterr().out


def test_ray_context_outside_and_inside_a_launched_worker():
    assert ray_context({}) is None and ray_context() is None
    assert ray_context({"TFACCEL_RAY_WORKER": "1/4"}) == {"mode": "launch", "rank": 1, "world_size": 4}
    assert report_callbacks() == []
    assert ray_backup_dir({}) is None
    assert ray_backup_dir({"TFACCEL_RAY_RUN_DIR": "/s/run"}) == "/s/run/tfaccel-backup"


def test_env_report_says_when_it_runs_as_a_ray_train_worker():
    env = {**harness.CHILD_ENV, "TFACCEL_RAY_WORKER": "1/2", "PYTHONPATH": str(harness.REPO_ROOT)}
    out = subprocess.run([sys.executable, "-m", "tfaccel", "env"], env=env, capture_output=True, text=True,
                         timeout=120, cwd=harness.REPO_ROOT)
    assert "- Ray: 2.60" in out.stdout and "(this process is Ray Train worker 1 of 2, tfaccel launch --backend ray)" \
        in out.stdout, out.stdout + out.stderr


def _check_installed_in_child(prelude: str) -> subprocess.CompletedProcess:
    code = prelude + "\nfrom tfaccel.launch.ray import check_ray_installed\nprint(check_ray_installed())"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**harness.CHILD_ENV, "PYTHONPATH": str(harness.REPO_ROOT)})


def test_missing_ray_is_reported_with_the_install_command():
    out = _check_installed_in_child("import sys; sys.modules['ray'] = None")
    assert out.returncode != 0
    assert "launch --backend ray: Ray Train is not importable here" in out.stderr
    assert "pip install -e '.[cpu,ray]'" in out.stderr


def test_untested_ray_version_is_warned_about():
    out = _check_installed_in_child("import ray; ray.__version__ = '2.99.0'")
    assert out.returncode == 0, out.stderr
    assert "launch: ray 2.99.0 is installed; tfaccel was tested with ray 2.60.*" in out.stderr


def test_forwarded_env_is_an_allowlist_plus_the_names_given_with_env():
    launcher = {"EPOCHS": "2", "PYTHONPATH": "/repo", "PATH": "/venv/bin", "HOME": "/root", "TF_CONFIG": "{}",
                "CUDA_VISIBLE_DEVICES": "0", "RAY_ADDRESS": "h:1", "SSH_AUTH_SOCK": "/s", "TMPDIR": "/t",
                "AWS_SECRET_ACCESS_KEY": "fake", "TF_CPP_MIN_LOG_LEVEL": "2", "TFACCEL_X": "1"}
    assert forwarded_env(launcher) == {"TF_CPP_MIN_LOG_LEVEL": "2", "TFACCEL_X": "1"}
    assert forwarded_env(launcher, names=["EPOCHS"]) == {"EPOCHS": "2", "TF_CPP_MIN_LOG_LEVEL": "2", "TFACCEL_X": "1"}
    assert forwarded_env({**launcher, "TFACCEL_JOB_ID": "job-7"})["TFACCEL_JOB_ID"] == "job-7"  # the job's identity


def test_enter_launch_dir_changes_into_the_launchers_directory_or_says_why_not(tmp_path, caplog):
    before = os.getcwd()
    try:
        enter_launch_dir(str(tmp_path))
        assert os.getcwd() == str(tmp_path)
        enter_launch_dir(None)
        assert os.getcwd() == str(tmp_path)
        enter_launch_dir(str(tmp_path / "not-on-this-node"))
        assert os.getcwd() == str(tmp_path)
    finally:
        os.chdir(before)
    assert (f"launch: the launcher's working directory {tmp_path / 'not-on-this-node'} does not exist on Ray node "
            in caplog.text)
    assert f"the command runs in {tmp_path} (give absolute paths, or the same directory on every node)" in caplog.text


class _GroupError(Exception):
    """Shaped like Ray Train's WorkerGroupError: ``worker_failures`` maps ranks to their errors."""

    def __init__(self, worker_failures: dict) -> None:
        super().__init__("Training failed due to worker errors")
        self.worker_failures = worker_failures


def _failure(rank: int, attempt: int, when: float, code: int = 1) -> dict:
    return {"rank": rank, "attempt": attempt, "code": code, "when": when,
            "message": f"worker:{rank} (pid 1, Ray node 127.0.0.1) failed: exit code {code}"}


def test_first_failure_names_the_earliest_failed_command_of_the_last_attempt():
    summary = {"attempts": 2, "failures": [_failure(0, 0, 1.0, 3), _failure(1, 1, 9.0, 2), _failure(0, 1, 5.0, 137)]}
    error = _GroupError({0: RuntimeError("tfaccel: ..."), 1: RuntimeError("tfaccel: ...")})
    assert first_failure(summary, error)["rank"] == 0 and first_failure(summary, error)["code"] == 137


def test_first_failure_names_a_dead_ray_worker_process_before_the_peers_it_took_down():
    summary = {"attempts": 1, "failures": [_failure(0, 0, 5.0)]}  # rank 0's command lost its peer
    died = RuntimeError("The actor died unexpectedly\nThe actor is dead because its worker process has died.")
    error = _GroupError({0: RuntimeError("tfaccel: ..."), 1: died})
    assert first_failure(summary, error) == {
        "rank": 1, "code": 1, "message": "worker:1 (Ray Train worker process) failed: The actor is dead because its "
                                         "worker process has died."}


def test_first_failure_without_a_worker_to_name_shows_rays_error():
    out = first_failure({"attempts": 1, "failures": []}, ValueError("controller gone"))
    assert out == {"rank": None, "code": 1, "message": "Ray Train failed: ValueError: controller gone"}
