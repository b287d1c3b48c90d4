"""Elastic local jobs (issue 25): which workers each restart gets, with real (TensorFlow-free) processes."""

import sys

import pytest

from launch_util import Launcher, run_tracked, wait_gone
from tfaccel.errors import ConfigError
from tfaccel.launch.elastic import ElasticState, read_capacity, run_elastic

PY = sys.executable
# worker:2 of a 3-worker cluster fails; every other task prints what the elastic launcher gave it.
FAIL_THIRD = ("import json, os, sys; c = json.loads(os.environ['TF_CONFIG']); n = len(c['cluster']['worker']); "
              "i = c['task']['index']; sys.exit(3) if (n, i) == (3, 2) else "
              "print('GOT', n, i, os.environ.get('TFACCEL_ELASTIC'), os.environ.get('TFACCEL_RESIZE_REASON'), "
              "'JOB', os.environ.get('TFACCEL_JOB_ID'))")


def _run(*args, **kwargs):
    kwargs.setdefault("capture_lines", 50)
    return run_tracked(run_elastic, *args, **kwargs)


def test_a_worker_whose_restarts_are_spent_is_left_out():
    state = ElasticState(2, 3, max_restarts=1)
    assert state.slots == [0, 1, 2]
    assert state.after_failure("worker:1") == (None, "")  # brought back once
    why, stop = state.after_failure("worker:1")
    assert (why, stop) == ("worker:1 failed and its restarts are spent (1)", "") and state.slots == [0, 2]
    state.after_failure("worker:1")  # now slot 2 (the second worker of two)
    why, stop = state.after_failure("worker:1")
    assert state.slots == [0] and stop == ("1 worker(s) left (worker:1 failed and its restarts are spent (1)), "
                                           "fewer than the minimum of 2")


def test_failures_no_worker_is_blamed_for_are_bounded_too():
    state = ElasticState(1, 2, max_restarts=1)
    assert [state.after_failure(None) for _ in range(4)] == [(None, "")] * 4
    assert state.after_failure("chief:0") == (None, "5 failures, more than the workers' restarts allow")


def test_a_capacity_file_shrinks_and_grows_the_job(tmp_path):
    cap = tmp_path / "cap"
    cap.write_text("2\n")
    state = ElasticState(1, 3, max_restarts=5, capacity_file=str(cap))
    assert state.size == 2
    cap.write_text("3")
    assert state.after_failure("worker:0") == (f"{cap} offers 3 workers", "") and state.slots == [0, 1, 2]
    cap.write_text("9")  # never more than MAX
    assert state.after_failure(None) == (None, "") and state.size == 3
    cap.write_text("0")
    assert state.after_failure(None)[1].startswith("0 worker(s) left")


@pytest.mark.parametrize("text, message", [("", "expected one integer >= 0"), ("two", "received 'two'"),
                                           ("-1", "received '-1'")])
def test_a_bad_capacity_file_is_a_clear_error(tmp_path, text, message):
    (tmp_path / "cap").write_text(text)
    with pytest.raises(ConfigError, match=f"--capacity-file {tmp_path / 'cap'}: .*{message}"):
        read_capacity(str(tmp_path / "cap"))
    with pytest.raises(ConfigError, match="cannot be read"):
        read_capacity(str(tmp_path / "missing"))


def test_bad_ranges_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"--workers: expected .* received '3:2'"):
        run_elastic(["true"], workers=(3, 2))
    with pytest.raises(ConfigError, match="max_restarts: must be an integer >= 0; received -1"):
        run_elastic(["true"], workers=(1, 2), max_restarts=-1)
    (tmp_path / "cap").write_text("1")
    with pytest.raises(ConfigError, match="offers 1 workers, fewer than the minimum 2 of --workers 2:3"):
        run_elastic(["true"], workers=(2, 3), capacity_file=str(tmp_path / "cap"))


def test_the_job_goes_on_with_the_workers_it_has(clean_tf_config, launch_log):
    result = _run([PY, "-c", FAIL_THIRD], workers=(2, 3))
    assert result.ok and result.restarts == 1 and [t.name for t in result.tasks] == ["worker:0", "worker:1"]
    assert [len(a) for a in result.attempts] == [3, 2]
    reason = "worker:2 failed and its restarts are spent (0)"
    assert all(f"GOT 2 {t.name[-1]} 2:3 {reason} JOB" in t.stdout for t in result.tasks)
    jobs = {line.split(" JOB ")[1] for attempt in result.attempts for t in attempt for line in t.stdout.splitlines()
            if " JOB " in line}
    assert len(jobs) == 1 and next(iter(jobs)).startswith("elastic-tf-")  # one job id over every attempt
    assert any(f"elastic: world size 3 -> 2 ({reason})" in m for m in launch_log)
    assert result.message.endswith("elastic: ended on 2 worker(s) (world size 3 -> 2)")


def test_below_the_minimum_the_job_fails(clean_tf_config, launch_log):
    result = _run([PY, "-c", FAIL_THIRD], workers=(3, 3))
    assert result.returncode == 3 and result.restarts == 0 and result.failed_task == "worker:2"
    assert any("not restarting: 2 worker(s) left" in m and "fewer than the minimum of 3" in m for m in launch_log)


def _cli(*args, timeout=60):
    with Launcher(*args) as launcher:
        rc = launcher.wait(timeout=timeout)
    assert not wait_gone(launcher.all_pids()), "a process outlived the launcher"
    return rc, launcher


def test_the_cli_runs_an_elastic_job(clean_tf_config):
    rc, launcher = _cli("--workers", "2:3", "--grace", "2", "--", PY, "-c", FAIL_THIRD)
    assert rc == 0, launcher.stderr
    assert "elastic: world size 3 -> 2 (worker:2 failed and its restarts are spent (0))" in launcher.stderr
    second = sorted(line.split("GOT ")[1].split(" JOB ")[0] for line in launcher.stdout.splitlines()
                    if "GOT 2 " in line)
    assert second == [f"2 {i} 2:3 worker:2 failed and its restarts are spent (0)" for i in (0, 1)]


@pytest.mark.parametrize("args, message", [
    (["--workers", "3:2"], "--workers: expected a number of workers N or a range MIN:MAX with 1 <= MIN <= MAX; "
                           "received '3:2'"),
    (["--workers", "two"], "--workers: expected a number of workers N or a range MIN:MAX"),
    (["--workers", "2", "--capacity-file", "cap"], "--capacity-file: only with --workers MIN:MAX"),
    (["--workers", "2:3", "--ps", "1"], "--workers 2:3: an elastic job is a local cluster of workers or Ray Train "
                                        "workers; received --ps 1"),
    (["--workers", "2:3", "--backend", "horovod"], "--backend horovod: --workers are for --backend tf"),
])
def test_bad_elastic_options_are_one_line_errors_with_exit_2(clean_tf_config, args, message):
    rc, launcher = _cli(*args, "--", PY, "-c", "pass")
    errors = [line for line in launcher.stderr.splitlines() if "error" in line.lower()]
    assert rc == 2 and len(errors) == 1 and message in errors[0], launcher.stderr
