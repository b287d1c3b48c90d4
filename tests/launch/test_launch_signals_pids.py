"""Issue 24 point 8: SIGHUP is handled like SIGTERM, and no signal reaches a process group whose task is reaped."""

import os
import signal
import subprocess
import sys
import time

from launch_util import SCRIPTS, Launcher, track, wait_gone
from tfaccel.launch.procs import exit_status, pid_alive, start_process, terminate

PY = sys.executable
SLEEPER = str(SCRIPTS / "sleeper.py")


def test_sighup_to_launcher_stops_tasks_like_sigterm(clean_tf_config):
    """An ssh drop's SIGHUP: the tasks get SIGTERM (and the grace period), the launcher exits 129, no orphan."""
    with Launcher("--workers", "2", "--grace", "5", "--", PY, SLEEPER) as launcher:
        children = [int(launcher.wait_for(rf"\[worker {i}\] ready .* child=(\d+)", timeout=30).group(1))
                    for i in range(2)]
        track(children)
        launcher.proc.send_signal(signal.SIGHUP)
        rc = launcher.wait(timeout=30)
    assert rc == 128 + signal.SIGHUP, launcher.stderr
    assert "interrupted by SIGHUP; forwarded SIGTERM to every task" in launcher.stderr
    assert "stopping worker:0" in launcher.stderr and "with SIGTERM" in launcher.stderr
    assert not wait_gone(launcher.all_pids() + children)


def _spy(monkeypatch) -> list:
    calls = []
    real_killpg, real_kill = os.killpg, os.kill

    def killpg(pid: int, sig: int) -> None:
        calls.append(("killpg", pid, sig))
        real_killpg(pid, sig)

    def kill(pid: int, sig: int) -> None:
        calls.append(("kill", pid, sig))
        real_kill(pid, sig)

    monkeypatch.setattr(os, "killpg", killpg)
    monkeypatch.setattr(os, "kill", kill)
    return calls


def test_no_signal_to_the_group_of_a_task_reaped_before_terminate(monkeypatch):
    """Its PID (and group id) may belong to an unrelated process by now: terminate must not touch it."""
    proc = start_process([PY, "-c", "pass"])
    track([proc.pid])
    proc.communicate(timeout=30)  # reaped
    calls = _spy(monkeypatch)
    terminate([proc], grace=0.5)
    assert [c for c in calls if c[1] == proc.pid] == []


def test_an_exited_task_stays_unreaped_so_its_leftover_group_is_still_killed():
    """exit_status() reads the status without reaping: the zombie pins the group id until terminate() has
    SIGKILLed what the task left running in its group, then reaps it."""
    code = ("import subprocess, sys\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
            "print(child.pid, flush=True)\n"
            "sys.exit(3)\n")
    proc = start_process([PY, "-c", code], stderr=subprocess.DEVNULL)
    track([proc.pid])
    child = int(proc.stdout.readline())
    track([child])
    deadline = time.monotonic() + 30
    while exit_status(proc) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert exit_status(proc) == 3 and exit_status(proc) == 3  # asked twice: still not reaped
    assert proc.returncode is None and os.path.exists(f"/proc/{proc.pid}") and not pid_alive(proc.pid)
    assert pid_alive(child)
    terminate([proc], grace=0.5)
    proc.stdout.close()
    proc.stderr is None or proc.stderr.close()
    assert proc.returncode == 3 and not os.path.exists(f"/proc/{proc.pid}")
    assert not wait_gone([child], timeout=5)


def test_exit_status_reports_a_signal_as_negative():
    proc = start_process([PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    track([proc.pid])
    deadline = time.monotonic() + 30
    while exit_status(proc) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert exit_status(proc) == -signal.SIGKILL
    terminate([proc], grace=0.1)
    proc.stdout.close()
    proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL


_STOPS_75 = ("import signal, sys, time\n"
             "signal.signal(signal.SIGUSR1, lambda *a: sys.exit(75))\n"
             "print('ready', flush=True)\n"
             "time.sleep(60)\n")


def test_a_task_gets_a_forwarded_signal_once_and_stops_with_its_own_exit_code(monkeypatch):
    """A second delivery of the preemption signal can land after the task's handler ran (Python puts the default
    action back while it exits) and kill it, so a task that stopped with 75 would be reported killed by the signal:
    the task leading its group gets the group's signal alone; a process outside a group of its own gets it by PID."""
    leader = start_process([PY, "-c", _STOPS_75], stderr=subprocess.DEVNULL)
    outsider = subprocess.Popen([PY, "-c", _STOPS_75], stdout=subprocess.PIPE)  # in pytest's process group
    track([leader.pid, outsider.pid])
    for proc in (leader, outsider):
        assert proc.stdout.readline().strip() == b"ready"
    calls = _spy(monkeypatch)
    terminate([leader, outsider], sig=signal.SIGUSR1, grace=20)
    forwarded = [c for c in calls if c[2] == signal.SIGUSR1]  # then the SIGKILL for what a task left in its group
    assert [c for c in forwarded if c[1] == leader.pid] == [("killpg", leader.pid, signal.SIGUSR1)]
    assert [c for c in forwarded if c[1] == outsider.pid] == [("killpg", outsider.pid, signal.SIGUSR1),
                                                               ("kill", outsider.pid, signal.SIGUSR1)]
    assert (leader.returncode, outsider.returncode) == (75, 75)
    for proc in (leader, outsider):
        proc.stdout.close()
