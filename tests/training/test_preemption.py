"""Preemption (issue 25): the agreement and its configuration in-process, then a real process under a real SIGTERM.

The multi-process paths (2 MultiWorkerMirrored workers through ``tfaccel launch``, Horovod, Ray) are in
tests/reliability/test_reliability_preempt.py.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tfaccel.errors import EXIT_PREEMPTED, ConfigError, Preempted
from tfaccel.resilience import exiting
from tfaccel.resilience import preemption as pre
from tfaccel.resilience import restarts as rst

HERE = Path(__file__).resolve().parent
JOB = HERE / "scripts" / "preempt_job.py"
ROOT = HERE.parent.parent


# ------------------------------------------------------------------------------------------------ configuration
def test_the_public_names_and_the_exit_status():
    import tfaccel

    assert tfaccel.EXIT_PREEMPTED == EXIT_PREEMPTED == 75 and tfaccel.Preempted is Preempted
    exc = Preempted(epoch=1, step=7, saved=True)
    assert isinstance(exc, SystemExit) and not isinstance(exc, Exception) and exc.code == 75
    assert str(exc) == "preempted at epoch 1, step 7: backup written there; exit status 75"


def test_sigterm_alone_by_default_and_the_named_signal_beside_it(monkeypatch):
    monkeypatch.delenv(pre.SIGNAL_ENV, raising=False)
    assert pre.preemption_signals() == (signal.SIGTERM,)
    for given in ("USR1", "sigusr1", "SIGUSR1", str(int(signal.SIGUSR1))):
        monkeypatch.setenv(pre.SIGNAL_ENV, given)
        assert set(pre.preemption_signals()) == {signal.SIGTERM, signal.SIGUSR1}


@pytest.mark.parametrize("given", ["KILL", "SIGSTOP", "USR9", "banana", "-1"])
def test_a_signal_that_cannot_be_caught_is_refused_naming_the_variable(monkeypatch, given):
    monkeypatch.setenv(pre.SIGNAL_ENV, given)
    with pytest.raises(ConfigError, match=rf"{pre.SIGNAL_ENV} must name a signal .*received '{given}'.*USR1"):
        pre.preemption_signals()


@pytest.mark.parametrize("name,value", [(pre.TIMEOUT_ENV, "soon"), (pre.TIMEOUT_ENV, "0"),
                                        (pre.CHECK_EVERY_ENV, "0"), (pre.CHECK_EVERY_ENV, "2.5")])
def test_bad_timeout_or_interval_is_refused_before_training(monkeypatch, name, value):
    monkeypatch.setenv(name, value)

    class OneProcess:
        num_workers, uses_keras_fit, sum_over_processes = 1, True, None

    with pytest.raises(ConfigError, match=rf"{name} must be .*received '{value}'"):
        pre.make_preemption(OneProcess(), save=None, can_save=False, epochs=1, task="t")


# ------------------------------------------------------------------------------------------------ agreement
class _Processes:
    """Several processes' Preemption objects, one thread each; ``total`` is a real collective over the threads."""

    def __init__(self, n, *, check_every=None, epochs=3, update_every=1):
        self.values = [0.0] * n
        self.barrier = threading.Barrier(n, timeout=20)
        self.saves = []
        self.items = [pre.Preemption(pre.SignalWatch(can_save=True, task=f"p{i}", timeout=5), total=self._total(i),
                                     processes=n, epochs=epochs, check_every=check_every, update_every=update_every,
                                     save=lambda e, s, i=i: self.saves.append((i, e, s))) for i in range(n)]

    def _total(self, i):
        def total(value):
            self.values[i] = value
            self.barrier.wait()
            result = sum(self.values)
            self.barrier.wait()
            return result
        return total

    def boundary(self, epoch, step, **kw):
        stopped = []

        def one(i, item):
            try:
                item.at_boundary(epoch, step, **kw)
            except Preempted as exc:
                stopped.append((i, exc.epoch, exc.step, exc.code))

        threads = [threading.Thread(target=one, args=(i, item)) for i, item in enumerate(self.items)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        return sorted(stopped)


def test_one_signalled_process_stops_every_process_at_the_same_step_with_one_backup(monkeypatch):
    monkeypatch.setattr(exiting, "_STATUS", [])  # no forced exit at the end of pytest
    procs = _Processes(2, check_every=1)
    assert procs.boundary(0, 1) == []
    procs.items[1].watch.received = signal.SIGTERM
    procs.items[1].watch.received_at = time.monotonic()
    stopped = procs.boundary(0, 2)
    assert stopped == [(0, 0, 2, EXIT_PREEMPTED), (1, 0, 2, EXIT_PREEMPTED)]
    assert sorted(procs.saves) == [(0, 0, 2), (1, 0, 2)]  # each process's save (StepBackup writes on the chief only)


def test_with_sharded_accumulation_the_stop_waits_for_the_end_of_an_update(monkeypatch):
    """update_every=3 (sharded gradient accumulation over 3 micro-batches, whose sums a backup would not hold): a
    signal seen inside an update stops both processes at its end, with the backup there; an epoch end always checks."""
    monkeypatch.setattr(exiting, "_STATUS", [])
    procs = _Processes(2, check_every=1, update_every=3)
    procs.items[0].watch.received = signal.SIGTERM
    assert procs.boundary(0, 1) == [] and procs.boundary(0, 2) == []  # inside the first update: not a boundary
    assert all(item.checks == 0 for item in procs.items)
    assert [s[1:3] for s in procs.boundary(0, 3)] == [(0, 3)] * 2
    assert sorted(procs.saves) == [(0, 0, 3), (1, 0, 3)]
    at_end = _Processes(1, check_every=1, update_every=3)
    at_end.items[0].watch.received = signal.SIGTERM
    assert [s[1:3] for s in at_end.boundary(1, 0, epoch_end=True)] == [(1, 0)]


def test_a_signal_at_the_end_of_the_last_epoch_is_no_stop(monkeypatch):
    monkeypatch.setattr(exiting, "_STATUS", [])
    procs = _Processes(1, check_every=1, epochs=2)
    procs.items[0].watch.received = signal.SIGTERM
    assert procs.boundary(2, 0, epoch_end=True) == []  # the job is complete: nothing to resume
    assert procs.boundary(1, 0, epoch_end=True) == [(0, 1, 0, EXIT_PREEMPTED)]


def test_auto_interval_checks_about_once_a_second_and_every_process_agrees(monkeypatch):
    procs = _Processes(2)  # auto
    for b in range(pre.PROBE_BOUNDARIES):
        time.sleep(0.02)  # a 20 ms step: about 50 steps a second
        assert procs.boundary(0, b + 1) == []
    intervals = {item.check_every for item in procs.items}
    assert len(intervals) == 1 and 10 <= intervals.pop() <= 60, [i.check_every for i in procs.items]
    assert all(item.checks == 1 for item in procs.items)  # none during the probe, one where it ends
    assert all(item.details()["check_every"].endswith("(auto)") for item in procs.items)


def test_a_signal_during_the_probe_stops_at_its_end_and_epoch_ends_are_always_checked(monkeypatch):
    monkeypatch.setattr(exiting, "_STATUS", [])
    procs = _Processes(2)
    assert procs.boundary(0, 1) == [] and procs.boundary(1, 0, epoch_end=True) == []
    procs.items[0].watch.received = signal.SIGTERM
    for b in range(3, pre.PROBE_BOUNDARIES):
        assert procs.boundary(1, b) == []
    assert [s[1:3] for s in procs.boundary(1, pre.PROBE_BOUNDARIES)] == [(1, pre.PROBE_BOUNDARIES)] * 2


# ------------------------------------------------------------------------------------------------ restarts record
def test_restarts_joins_the_launchers_record_with_the_chiefs_positions(tmp_path, monkeypatch):
    backup = tmp_path / "backup"
    backup.mkdir()
    progress = rst.Progress(str(backup), is_chief=True, steps_per_epoch=10)
    progress.note(1, 7, force=True)  # the attempt before the restart reached epoch 1, step 7
    monkeypatch.setenv(rst.RESTARTS_ENV, json.dumps([
        {"restart": 1, "why": "preemption", "task": "worker:1", "status": "exit code 75", "ended_at": time.time() - 2,
         "attempt_s": 30.0, "counted": False}]))
    state = {"job": {"written_at": time.time() - 3}}
    (entry,) = rst.restarts_details(str(backup), resumed_from=(1, 7), backup=state, steps_per_epoch=10,
                                    is_chief=True)
    assert entry["why"] == "preemption" and entry["resumed_from"] == [1, 7] and entry["steps_lost"] == 0
    assert 2.5 < entry["seconds_lost"] < 60
    progress.note(2, 3, force=True)  # the second attempt fails at epoch 2, step 3 and resumes from (2, 0)
    monkeypatch.setenv(rst.RESTARTS_ENV, json.dumps([
        {"restart": 1, "why": "preemption", "task": "worker:1", "status": "exit code 75", "ended_at": 1.0,
         "attempt_s": 1.0}, {"restart": 2, "why": "failure", "task": "worker:0", "status": "killed by SIGKILL "
                             "(exit code 137)", "ended_at": time.time(), "attempt_s": 5.0}]))
    first, second = rst.restarts_details(str(backup), resumed_from=(2, 0), backup=None, steps_per_epoch=10,
                                         is_chief=True)
    assert first["steps_lost"] == 0 and second["why"] == "failure" and second["steps_lost_at_least"] == 3


def test_an_elastic_jobs_record_says_each_resize_with_its_cause_and_world_sizes(tmp_path, monkeypatch):
    """run_elastic's one record: restart 1 a failure on 3 workers, restart 2 a resize 3 -> 2 after a preemption
    (its steps lost exact, as for any preemption)."""
    backup = tmp_path / "backup"
    rst.Progress(str(backup), is_chief=True, steps_per_epoch=10).note(1, 4, force=True)
    now = time.time()
    monkeypatch.setenv(rst.RESTARTS_ENV, json.dumps([
        {"restart": 1, "why": "failure", "task": "worker:2", "status": "exit code 3", "ended_at": now - 9,
         "attempt_s": 3.0, "counted": True, "from_workers": 3, "to_workers": 3},
        {"restart": 2, "why": "resize", "task": "worker:0", "status": "exit code 75", "ended_at": now - 1,
         "attempt_s": 5.0, "counted": False, "cause": "preemption", "from_workers": 3, "to_workers": 2}]))
    first, second = rst.restarts_details(str(backup), resumed_from=(1, 4), backup={"job": {"written_at": now - 2}},
                                         steps_per_epoch=10, is_chief=True)
    assert (first["why"], first["from_workers"], first["to_workers"], "cause" in first) == ("failure", 3, 3, False)
    assert {k: second[k] for k in ("restart", "why", "cause", "from_workers", "to_workers", "resumed_from",
                                   "steps_lost")} == {"restart": 2, "why": "resize", "cause": "preemption",
                                                      "from_workers": 3, "to_workers": 2, "resumed_from": [1, 4],
                                                      "steps_lost": 0}
    assert 1.5 < second["seconds_lost"] < 60


def test_no_launcher_record_means_no_restarts_and_a_bad_one_is_an_error(tmp_path, monkeypatch):
    monkeypatch.delenv(rst.RESTARTS_ENV, raising=False)
    assert rst.restarts_details(str(tmp_path), resumed_from=None, backup=None, steps_per_epoch=1, is_chief=True) == []
    monkeypatch.setenv(rst.RESTARTS_ENV, "[{\"restart\": 1}]")
    with pytest.raises(ConfigError, match=rf"{rst.RESTARTS_ENV} must be the JSON list .*received"):
        rst.launcher_restarts()


# ------------------------------------------------------------------------------------------------ a real process
def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFACCEL_") and k != "TF_CONFIG"}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", TF_NUM_INTRAOP_THREADS="1", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _run_until_signalled(env, *, signum=signal.SIGTERM, timeout=120):
    """Starts the job, sends ``signum`` once it trains, returns (returncode, output, seconds from signal to exit)."""
    proc = subprocess.Popen([sys.executable, str(JOB)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines, sent = [], []

    def read():
        for raw in iter(proc.stdout.readline, b""):
            line = raw.decode("utf-8", "replace")
            lines.append(line)
            if line.startswith("JOB: training") and not sent:
                time.sleep(0.3)
                proc.send_signal(signum)
                sent.append(time.monotonic())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    ended = time.monotonic()
    reader.join(10)
    return rc, "".join(lines), (ended - sent[0]) if sent else None


@pytest.mark.slow
def test_sigterm_writes_the_backup_at_the_stop_and_the_resumed_run_ends_like_an_uninterrupted_one(tmp_path):
    ref = subprocess.run([sys.executable, str(JOB)], env=_env(JOB_BACKUP=tmp_path / "ref-backup",
                                                              JOB_OUT=tmp_path / "ref.npz", JOB_SLEEP=0),
                         capture_output=True, timeout=180)
    assert ref.returncode == 0, ref.stdout.decode()[-3000:] + ref.stderr.decode()[-3000:]
    (tmp_path / "tmp").mkdir()
    env = _env(JOB_BACKUP=tmp_path / "backup", JOB_OUT=tmp_path / "res.npz", JOB_SLEEP=0.05,
               TFACCEL_PREEMPTION_SIGNAL="USR1", JOB_ATEXIT=tmp_path / "atexit", TMPDIR=tmp_path / "tmp")
    rc, out, seconds = _run_until_signalled(env, signum=signal.SIGUSR1)
    assert rc == EXIT_PREEMPTED, out[-3000:]
    assert seconds is not None and seconds < 15, seconds
    # the exit handlers registered after `import tfaccel` ran before the exit: the user's, and AutoGraph's removal of
    # the files it generated in the temporary directory
    assert (tmp_path / "atexit").read_text() == "ran"
    assert not list((tmp_path / "tmp").glob("__autograph_generated_file*")), sorted(os.listdir(tmp_path / "tmp"))
    stop = json.loads((tmp_path / "backup" / "tfaccel_backup.json").read_text())
    assert f"stops at epoch {stop['epoch']}, step {stop['step']} (its own signal); backup written" in out
    resumed = subprocess.run([sys.executable, str(JOB)], env={**env, "JOB_SLEEP": "0"}, capture_output=True,
                             timeout=180)
    assert resumed.returncode == 0, resumed.stderr.decode()[-3000:]
    report = json.loads(resumed.stdout.decode().strip().splitlines()[-1])
    assert report["resumed_from"] == [stop["epoch"], stop["step"]]
    a, b = np.load(tmp_path / "ref.npz"), np.load(tmp_path / "res.npz")
    assert max(float(np.max(np.abs(a[k] - b[k]))) for k in a.files) <= 1e-6
    assert report["preemption"]["checks"] > 0 and not (tmp_path / "backup").exists()


@pytest.mark.slow
def test_sigterm_without_backup_dir_says_nothing_was_saved_and_exits_at_once(tmp_path):
    rc, out, seconds = _run_until_signalled(_env(JOB_OUT=tmp_path / "res.npz", JOB_SLEEP=0.05))
    assert rc == EXIT_PREEMPTED, out[-3000:]
    assert "NOTHING WAS SAVED: this job has no backup_dir" in out
    assert seconds is not None and seconds < 5, seconds
