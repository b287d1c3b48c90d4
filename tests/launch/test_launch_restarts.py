"""Issue 25: the launcher's side of preemption, with real (TensorFlow-free) processes and run_job.

A task exiting with tfaccel.EXIT_PREEMPTED is restarted without spending --max-restarts (unless asked), the
next attempt gets TFACCEL_RESTARTS, an interrupted launch whose tasks all exited 75 exits 75, and horovodrun's
"Exit code: 75" counts as a preemption.
"""

import json
import signal
import sys

from tfaccel.errors import EXIT_PREEMPTED
from tfaccel.launch.horovod import rank_preempted
from tfaccel.launch.restarts import RESTARTS_ENV, RestartBudget, preempted_attempt, signals_to_forward
from tfaccel.launch.outcome import LaunchTask, TaskOutcome
from tfaccel.launch.supervisor import run_job

# Exits 75 in the first attempt, then prints what TFACCEL_RESTARTS holds and exits 0.
_ONCE = ("import os, sys\n"
         "if sys.argv[1] == '0':\n"
         "    sys.exit(75)\n"
         "print('RESTARTS=' + os.environ.get('TFACCEL_RESTARTS', ''), flush=True)\n")


def _tasks(n=2):
    def make(attempt):
        return [LaunchTask("worker", i, (sys.executable, "-c", _ONCE, str(attempt)), {"PATH": "/usr/bin:/bin"})
                for i in range(n)]
    return make


def test_a_preempted_attempt_is_restarted_without_spending_max_restarts():
    result = run_job(_tasks(), max_restarts=0, echo=False, grace=5)
    assert result.ok and result.restarts == 1, result.message
    first = result.attempts[0]
    assert sorted(o.returncode for o in first) == [EXIT_PREEMPTED, EXIT_PREEMPTED] or \
        EXIT_PREEMPTED in [o.returncode for o in first]  # the second may be stopped before it exits on its own
    record = json.loads(result.task("worker:0").stdout.split("RESTARTS=", 1)[1])
    assert [(r["restart"], r["why"], r["counted"]) for r in record] == [(1, "preemption", False)]
    assert "was preempted: exit code 75" in record[0]["status"]


def test_count_preemptions_makes_a_preemption_spend_a_restart():
    result = run_job(_tasks(n=1), max_restarts=0, echo=False, grace=5, count_preemptions=True)
    assert result.returncode == EXIT_PREEMPTED and result.restarts == 0 and result.reason == "preempted"
    again = run_job(_tasks(n=1), max_restarts=1, echo=False, grace=5, count_preemptions=True)
    assert again.ok and again.restarts == 1


def test_budget_counts_failures_always_and_preemptions_only_when_asked():
    budget = RestartBudget(1)
    assert budget.allows("preemption") and budget.allows("failure")
    budget.record("preemption", task="worker:0", status="exit code 75", attempt_s=1.0)
    assert budget.counted == 0 and budget.allows("failure")
    restart = budget.record("failure", task="worker:1", status="killed", attempt_s=1.0)
    assert budget.counted == 1 and not budget.allows("failure") and budget.allows("preemption")
    assert budget.describe(restart) == "restart 2 (a failure, counted: 1 of 1 restarts used)"
    assert [e["why"] for e in json.loads(budget.env()[RESTARTS_ENV])] == ["preemption", "failure"]
    assert RestartBudget(0).env() == {}


def test_an_interrupted_launch_whose_tasks_were_all_preempted_exits_75():
    import dataclasses
    import logging

    @dataclasses.dataclass
    class Verdict:
        reason: str
        returncode: int
        message: str

    log = logging.getLogger("test")
    done = [TaskOutcome("worker:0", EXIT_PREEMPTED, "", ""), TaskOutcome("worker:1", EXIT_PREEMPTED, "", "")]
    verdict = preempted_attempt(Verdict("interrupted", 143, "interrupted by SIGTERM"), done, log)
    assert verdict.returncode == EXIT_PREEMPTED and "every task was preempted" in verdict.message
    mixed = done[:1] + [TaskOutcome("worker:1", -signal.SIGKILL, "", "")]
    assert preempted_attempt(Verdict("interrupted", 143, "x"), mixed, log).returncode == 143


def test_horovodrun_naming_a_rank_that_exited_75_is_a_preemption():
    said = ("Horovod detected that one or more processes exited with non-zero status...\n"
            "Process name: 1\nExit code: 75\n")
    assert rank_preempted([TaskOutcome("horovodrun:0", 1, "", said)])
    assert not rank_preempted([TaskOutcome("horovodrun:0", 1, "", said.replace("75", "137"))])


def test_the_launcher_forwards_the_preemption_signal_too(monkeypatch):
    monkeypatch.delenv("TFACCEL_PREEMPTION_SIGNAL", raising=False)
    assert set(signals_to_forward()) == {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    monkeypatch.setenv("TFACCEL_PREEMPTION_SIGNAL", "USR1")
    assert signal.SIGUSR1 in signals_to_forward()


def test_sigusr1_to_the_launcher_reaches_the_tasks_when_it_is_the_preemption_signal(tmp_path):
    """SLURM's --signal=USR1@60 reaches the launcher: it forwards USR1 (the tasks then stop as on SIGTERM). The
    launcher runs in a process of its own (its signal handlers need the main thread)."""
    import os
    import subprocess

    task = ("import signal, sys, time\n"
            "signal.signal(signal.SIGUSR1, lambda *a: sys.exit(75))\n"
            "open('up', 'w').close()\n"
            "time.sleep(60)\n")
    launcher = ("import os, signal, sys, threading, time\n"
                "from tfaccel.launch.outcome import LaunchTask\n"
                "from tfaccel.launch.supervisor import run_job\n"
                f"task = LaunchTask('worker', 0, (sys.executable, '-c', {task!r}), {{'PATH': '/usr/bin:/bin'}})\n"
                "def signal_once_up():  # once the task's handler is in place (a loaded machine starts it late)\n"
                "    while not os.path.exists('up'): time.sleep(0.05)\n"
                "    os.kill(os.getpid(), signal.SIGUSR1)\n"
                "threading.Thread(target=signal_once_up, daemon=True).start()\n"
                "began = time.monotonic()\n"
                "result = run_job(lambda attempt: [task], echo=False, grace=5, timeout=40)\n"
                "print('RESULT', result.returncode, result.reason, round(time.monotonic() - began, 1), flush=True)\n")
    env = {**os.environ, "TFACCEL_PREEMPTION_SIGNAL": "USR1"}
    (tmp_path / "up").unlink(missing_ok=True)  # only this run's task may say it is up
    done = subprocess.run([sys.executable, "-c", launcher], env=env, capture_output=True, timeout=60, cwd=tmp_path)
    line = [ln for ln in done.stdout.decode().splitlines() if ln.startswith("RESULT")]
    assert line, done.stderr.decode()[-2000:]
    _, code, reason, seconds = line[0].split()
    assert (int(code), reason) == (EXIT_PREEMPTED, "interrupted") and float(seconds) < 20, line
