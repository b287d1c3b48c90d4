"""Elastic local jobs (issue 25): which workers each restart gets, with real (TensorFlow-free) processes."""

import json
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


# worker:2 of a 3-worker cluster fails (every time); every task prints the restart record it was given.
FAIL_THIRD_RECORD = ("import json, os, sys; c = json.loads(os.environ['TF_CONFIG']); n = len(c['cluster']['worker']); "
                     "i = c['task']['index']; sys.exit(3) if (n, i) == (3, 2) else "
                     "print('RESTARTS=' + os.environ.get('TFACCEL_RESTARTS', ''), flush=True)")
# The first attempt is preempted: worker:0 (its backup written, as tfaccel.fit would) offers CAP workers in the
# capacity file, if one is named, and exits 75; the others wait to be stopped. Later attempts print their record.
PREEMPT_FIRST = """import os, sys, time
marker, cap = sys.argv[1], sys.argv[2]
index = __import__('json').loads(os.environ['TF_CONFIG'])['task']['index']
if not os.path.exists(marker):
    if index == 0:
        if cap:
            with open(cap + '.new', 'w') as fh:
                fh.write('2')
            os.replace(cap + '.new', cap)
        open(marker, 'w').close()
        sys.exit(75)
    time.sleep(30)
print('RESTARTS=' + os.environ.get('TFACCEL_RESTARTS', ''), flush=True)
"""


def _record(result):
    """The restart record the last attempt's worker:0 was given."""
    return json.loads(result.task("worker:0").stdout.split("RESTARTS=", 1)[1].splitlines()[0])


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


def test_a_preemption_blames_no_worker_unless_preemptions_count(tmp_path):
    state = ElasticState(2, 3, max_restarts=0)
    assert [state.after_failure("worker:1", preempted=True) for _ in range(9)] == [(None, "")] * 9
    assert state.slots == [0, 1, 2] and state.failures == {} and state.unblamed == 0
    counted = ElasticState(2, 3, max_restarts=0, count_preemptions=True)
    assert counted.after_failure("worker:1", preempted=True) == ("worker:1 was preempted and its restarts are spent "
                                                                 "(0)", "") and counted.slots == [0, 2]
    cap = tmp_path / "cap"
    cap.write_text("3")
    offered = ElasticState(2, 3, max_restarts=0, capacity_file=str(cap))
    cap.write_text("2")  # read again at a preemption's restart too
    assert offered.after_failure("worker:0", preempted=True) == (f"{cap} offers 2 workers", "")


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


def test_every_restart_of_an_elastic_job_is_in_one_record_handed_to_every_attempt(clean_tf_config):
    """worker:2 fails, is brought back once (restart 1, a failure on 3 workers), fails again with its restarts
    spent (restart 2, a resize 3 -> 2): the last attempt's tasks get both, numbered over the whole job."""
    result = _run([PY, "-c", FAIL_THIRD_RECORD], workers=(2, 3), max_restarts=1)
    assert result.ok and [len(a) for a in result.attempts] == [3, 3, 2], result.message
    record = _record(result)
    assert [(r["restart"], r["why"], r.get("cause"), r["task"], r["from_workers"], r["to_workers"], r["counted"])
            for r in record] == [(1, "failure", None, "worker:2", 3, 3, True),
                                 (2, "resize", "failure", "worker:2", 3, 2, True)]
    assert all("exit code 3" in r["status"] and r["attempt_s"] >= 0 for r in record)
    assert _record(result) == json.loads(result.task("worker:1").stdout.split("RESTARTS=", 1)[1].splitlines()[0])


@pytest.mark.parametrize("capacity, count, sizes, entry", [
    ("3", False, [3, 2], ("resize", "preemption", 3, 2, False)),  # uncounted, and the capacity file is read again
    (None, False, [3, 3], ("preemption", None, 3, 3, False)),  # uncounted: the same workers
    (None, True, [3, 2], ("resize", "preemption", 3, 2, True)),  # --count-preemptions: worker:0's one chance spent
])
def test_a_preempted_attempt_restarts_from_its_backup_uncounted_unless_asked(clean_tf_config, launch_log, tmp_path,
                                                                             capacity, count, sizes, entry):
    cap = tmp_path / "cap"
    if capacity:
        cap.write_text(capacity)
    result = _run([PY, "-c", PREEMPT_FIRST, str(tmp_path / "preempted"), str(cap) if capacity else ""],
                  workers=(2, 3), max_restarts=0, capacity_file=str(cap) if capacity else None,
                  count_preemptions=count)
    assert result.ok and result.restarts == 1 and [len(a) for a in result.attempts] == sizes, result.message
    assert result.attempts[0][0].returncode == 75
    (restart,) = _record(result)
    assert (restart["why"], restart.get("cause"), restart["from_workers"], restart["to_workers"],
            restart["counted"]) == entry and restart["task"] == "worker:0" and "was preempted" in restart["status"]
    said = "counted" if count else "not counted"
    assert any(f"elastic: restart 1 after a preemption ({said} against --max-restarts)" in m for m in launch_log)


def test_the_ray_backend_hands_the_record_to_each_run_and_rereads_the_capacity_file(clean_tf_config, tmp_path,
                                                                                   monkeypatch):
    """Each elastic attempt is one run_ray run given the job's record (its driver passes it to the workers); a
    preempted run (the driver exits 75) is restarted by run_elastic on what the capacity file offers then."""
    import tfaccel.launch.ray as ray_launch
    from tfaccel.launch.outcome import LaunchResult

    cap = tmp_path / "cap"
    cap.write_text("3")
    runs = []

    def fake_run_job(make_tasks, **kwargs):  # the Ray driver, without Ray: the first run is preempted
        spec = json.loads(open(make_tasks(0)[0].cmd[-1]).read())
        runs.append((spec["workers"], spec["max_restarts"], kwargs["record"]))
        if len(runs) == 1:
            cap.write_text("2")
            return LaunchResult(returncode=75, tasks=[], reason="preempted", failed_task="ray:0",
                                message="ray:0 was preempted: exit code 75")
        return LaunchResult(returncode=0, tasks=[], message="ok")

    monkeypatch.setattr(ray_launch, "run_job", fake_run_job)
    monkeypatch.setattr(ray_launch, "check_ray_installed", lambda: "2.60.0")
    result = run_elastic([PY, "-c", "pass"], workers=(2, 3), backend="ray", capacity_file=str(cap), echo=False)
    assert result.ok and [(w, m) for w, m, _ in runs] == [(3, 0), (2, 0)]
    record = runs[0][2]
    assert record is runs[1][2] and [(r.why, r.cause, r.from_workers, r.to_workers, r.counted)
                                     for r in record.history] == [("resize", "preemption", 3, 2, False)]


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


def test_the_cli_passes_count_preemptions_on(clean_tf_config, tmp_path):
    rc, launcher = _cli("--workers", "2:3", "--count-preemptions", "--grace", "2", "--", PY, "-c", PREEMPT_FIRST,
                        str(tmp_path / "preempted"), "")
    assert rc == 0, launcher.stderr
    assert "elastic: restart 1 after a preemption (counted against --max-restarts)" in launcher.stderr
    assert "elastic: world size 3 -> 2 (worker:0 was preempted and its restarts are spent (0))" in launcher.stderr


@pytest.mark.parametrize("extra, said", [
    ([], ["would start 3 worker(s), and restart from the last backup on 2 to 3; nothing was started",
          "a failed worker is not brought back (--max-restarts 0: each worker's own budget)",
          "never fewer than 2 (below that it fails)", "not counted against --max-restarts (--count-preemptions",
          "no --capacity-file", "split evenly over every size 2, 3: each a multiple of 6",
          "TFACCEL_ELASTIC=2:3", "would start 3 task(s) of a 3-task cluster"]),
    (["--max-restarts", "1", "--count-preemptions", "--capacity-file", "{cap}"],
     ["would start 2 worker(s)", "brought back (the whole job restarted from its last backup) up to 1 time(s), then "
      "left out (--max-restarts 1", "counted against the task's --max-restarts (--count-preemptions)",
      "capacity file {cap} offers 2 worker(s) now", "read again at every restart",
      "would start 2 task(s) of a 2-task cluster", '"max_restarts": 0']),
])
def test_the_dry_run_says_what_elastic_mode_will_do(clean_tf_config, capsys, tmp_path, extra, said):
    from tfaccel.cli.main import main as cli_main

    cap = tmp_path / "cap"
    cap.write_text("2\n")
    extra = [arg.format(cap=cap) for arg in extra]
    assert cli_main(["launch", "--workers", "2:3", *extra, "--dry-run", "--", PY, "-c", "pass"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("tfaccel launch --dry-run (elastic, --workers 2:3, --backend tf)")
    for words in said:
        assert words.format(cap=cap) in out, out


def test_the_dry_run_refuses_a_capacity_file_the_launch_would_refuse(clean_tf_config, capsys, tmp_path):
    from tfaccel.cli.main import main as cli_main

    (tmp_path / "cap").write_text("1")
    assert cli_main(["launch", "--workers", "2:3", "--capacity-file", str(tmp_path / "cap"), "--dry-run", "--", PY,
                     "-c", "pass"]) == 2
    assert "offers 1 workers, fewer than the minimum 2 of --workers 2:3" in capsys.readouterr().err


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
