"""tfaccel.compat.tf_sigterm: a MultiWorkerMirrored worker ends on SIGTERM, with real processes on 127.0.0.1.

TensorFlow 2.21 installs a SIGTERM handler (its preemption notifier) inside the MultiWorkerMirroredStrategy
constructor; without the fix SIGTERM does not end a worker. Every process started here is bounded by a timeout
and ended by PID (its process group) whatever happens.
"""

import ctypes
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pytest

import harness
from strategies_logs import tfaccel_records
from tfaccel.compat import tf_sigterm
from tfaccel.launch.procs import pid_alive, start_process, terminate

PROGRAM = Path(__file__).with_name("strategies_sigterm_program.py")
EXIT_LIMIT_S = 3.0  # a worker with the fix ends within this long after SIGTERM (measured: ~0.05 s)
STILL_ALIVE_S = 4.0  # without the fix it is still alive this long after SIGTERM
START_TIMEOUT_S = 150.0  # two workers import TF, build the strategy and fit one epoch on 2 busy cores


@pytest.fixture
def log_records():
    with tfaccel_records() as records:
        yield records


class Worker:
    """One worker process; its stdout JSON lines are collected by a thread."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.lines: List[dict] = []
        self.err: List[str] = []
        self._cond = threading.Condition()
        self._threads = [threading.Thread(target=self._read_out, daemon=True),
                         threading.Thread(target=self._read_err, daemon=True)]
        for thread in self._threads:
            thread.start()

    def _read_out(self) -> None:
        for raw in iter(self.proc.stdout.readline, b""):
            text = raw.decode("utf-8", "replace").strip()
            if text.startswith("{"):
                with self._cond:
                    self.lines.append(json.loads(text))
                    self._cond.notify_all()

    def _read_err(self) -> None:
        for raw in iter(self.proc.stderr.readline, b""):
            self.err.append(raw.decode("utf-8", "replace"))

    def wait_phase(self, phase: str, deadline: float) -> dict:
        with self._cond:
            while True:
                found = [line for line in self.lines if line.get("phase") == phase]
                if found:
                    return found[0]
                if self.proc.poll() is not None or time.monotonic() >= deadline:
                    raise AssertionError(f"pid {self.proc.pid} never reached {phase!r} (rc={self.proc.poll()}):\n"
                                         + "".join(self.err[-30:]))
                self._cond.wait(timeout=0.2)


def _start_workers(args: Sequence[str] = (), env: Optional[Dict[str, str]] = None) -> List[Worker]:
    workers = []
    for _, _, tf_config in harness.tf_configs_for(harness.loopback_cluster(2)):
        child = {k: v for k, v in os.environ.items() if not k.startswith(("TF_CONFIG", "TFACCEL_"))}
        child.update(harness.CHILD_ENV)
        child["PYTHONPATH"] = os.pathsep.join(filter(None, [str(harness.REPO_ROOT), os.environ.get("PYTHONPATH")]))
        child["TF_CONFIG"] = tf_config
        child.update(env or {})
        proc = start_process([sys.executable, str(PROGRAM), *args], env=child, cwd=str(harness.REPO_ROOT))
        harness.STARTED_PIDS.append(proc.pid)
        workers.append(Worker(proc))
    return workers


def _seconds_to_exit(proc: subprocess.Popen, limit: float) -> Optional[float]:
    begun = time.monotonic()
    try:
        proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        return None
    return time.monotonic() - begun


def _sigterm_blocked_worker(args: Sequence[str] = (), env: Optional[Dict[str, str]] = None, *,
                            limit: float) -> dict:
    """worker:1 blocked inside an all-reduce (worker:0 sleeps) gets SIGTERM; how long until it exits."""
    workers = _start_workers(args, env)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        strategy_lines = [w.wait_phase("strategy", deadline) for w in workers]
        ready = workers[1].wait_phase("ready", deadline)
        time.sleep(1.5)  # worker:1 is inside the all-reduce now (worker:0 never joins it)
        assert workers[1].proc.poll() is None, "".join(workers[1].err[-30:])
        workers[1].proc.send_signal(signal.SIGTERM)  # the process only, as `kill PID` does
        seconds = _seconds_to_exit(workers[1].proc, limit)
        return {"seconds": seconds, "returncode": workers[1].proc.returncode, "strategy": strategy_lines,
                "ready": ready, "alive_after": pid_alive(workers[1].proc.pid)}
    finally:
        terminate([w.proc for w in workers], grace=0.5)


# ------------------------------------------------------------------------------------------ real processes
@pytest.mark.slow
def test_sigterm_ends_a_worker_blocked_in_a_collective() -> None:
    """After the strategy is up and a fit epoch ran, SIGTERM ends a worker waiting inside an all-reduce at once."""
    result = _sigterm_blocked_worker(limit=EXIT_LIMIT_S)
    assert result["seconds"] is not None, f"worker:1 still alive {EXIT_LIMIT_S} s after SIGTERM"
    assert result["returncode"] == -signal.SIGTERM
    for line in result["strategy"]:
        assert line["owner"] == "SIG_DFL" and line["applied"], line
        assert tf_sigterm.NOTE in line["notes"]
    assert result["ready"]["owner"] == "SIG_DFL"


@pytest.mark.slow
def test_without_the_fix_sigterm_is_swallowed_by_tensorflow() -> None:
    """The upstream behaviour: TF's handler (in libtensorflow_cc) catches SIGTERM and the worker keeps running.

    When this fails because the worker exits, TensorFlow no longer swallows SIGTERM: narrow AFFECTED_VERSIONS.
    """
    result = _sigterm_blocked_worker(env={"TFACCEL_DISABLE_COMPAT": "tf_sigterm"}, limit=STILL_ALIVE_S)
    assert result["seconds"] is None, f"worker:1 exited {result['seconds']:.1f} s after SIGTERM without the fix"
    for line in result["strategy"]:
        assert "libtensorflow" in os.path.basename(line["owner"]) and not line["applied"], line
        assert tf_sigterm.NOTE not in line["notes"]


@pytest.mark.slow
def test_keep_env_keeps_tensorflows_handler() -> None:
    result = _sigterm_blocked_worker(env={tf_sigterm.KEEP_ENV: "1"}, limit=STILL_ALIVE_S)
    assert result["seconds"] is None
    assert all("libtensorflow" in os.path.basename(line["owner"]) for line in result["strategy"])


@pytest.mark.slow
def test_a_python_handler_does_not_run_while_blocked_in_a_collective() -> None:
    """Why the fix restores SIG_DFL and not a Python handler: a handler installed with signal.signal only runs
    when the main thread is back in Python, which a worker waiting inside a collective is not."""
    result = _sigterm_blocked_worker(args=["--python-handler"], limit=STILL_ALIVE_S)
    assert result["seconds"] is None, f"the Python handler ran ({result['returncode']})"


@pytest.mark.slow
def test_preemption_checkpoint_handler_installs_its_own_handler(tmp_path) -> None:
    """PreemptionCheckpointHandler is built after the strategy and replaces SIG_DFL with its own Python handler,
    so TensorFlow's preemption checkpointing keeps working without opting in."""
    workers = _start_workers(["--pch", str(tmp_path / "pch")])
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        for worker in workers:
            assert worker.wait_phase("strategy", deadline)["owner"] == "SIG_DFL"
            line = worker.wait_phase("pch", deadline)
            assert line["python_handler"] == "PreemptionCheckpointHandler._sigterm_handler_fn" and line["bound_to_handler"], line
            assert "libtensorflow" not in line["owner"] and line["owner"] not in ("SIG_DFL", "SIG_IGN"), line
    finally:
        terminate([w.proc for w in workers], grace=0.5)


_STARTED_RE = re.compile(r"started (worker:\d+) pid=(\d+)")


@pytest.mark.slow
def test_launch_fail_fast_ends_the_survivor_well_under_the_grace() -> None:
    """`tfaccel launch --workers 2 --grace 30`: worker:1 SIGKILLs itself while worker:0 waits in an all-reduce.
    The launcher's SIGTERM ends worker:0 at once, so the launcher exits long before the 30 s grace."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_CONFIG", "TFACCEL_"))}
    env.update(harness.CHILD_ENV)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(harness.REPO_ROOT), os.environ.get("PYTHONPATH")]))
    launcher = start_process([sys.executable, "-m", "tfaccel", "launch", "--workers", "2", "--grace", "30", "--",
                              sys.executable, str(PROGRAM), "--kill-self", "1"], env=env, cwd=str(harness.REPO_ROOT))
    harness.STARTED_PIDS.append(launcher.pid)
    lines: List[tuple] = []
    begun = time.monotonic()

    def read(stream) -> None:
        for raw in iter(stream.readline, b""):
            text = raw.decode("utf-8", "replace").rstrip("\n")
            match = _STARTED_RE.search(text)
            if match:
                harness.STARTED_PIDS.append(int(match.group(2)))
            lines.append((time.monotonic() - begun, text))

    readers = [threading.Thread(target=read, args=(s,), daemon=True) for s in (launcher.stdout, launcher.stderr)]
    for reader in readers:
        reader.start()
    try:
        launcher.wait(timeout=START_TIMEOUT_S + 30)
    except subprocess.TimeoutExpired:
        pass
    finally:
        ended = time.monotonic() - begun
        terminate([launcher], grace=1)
        for reader in readers:
            reader.join(timeout=5)
    text = "\n".join(line for _, line in lines)
    task_pids = [int(pid) for _, pid in _STARTED_RE.findall(text)]
    for pid in task_pids:
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
    ready = [stamp for stamp, line in lines if '"phase": "ready"' in line and '"worker": 1' in line]
    assert launcher.returncode == 128 + signal.SIGKILL, text[-3000:]
    assert re.search(r"worker:1 \(pid \d+\) failed: killed by SIGKILL", text), text[-3000:]
    assert ready, text[-3000:]
    after_kill = ended - (ready[0] + 1.0)  # worker:1 kills itself 1 s after it said ready
    assert after_kill < 10.0, f"the launcher ended {after_kill:.1f} s after worker:1 was killed (grace 30 s)"
    print(f"launcher exited {after_kill:.2f} s after worker:1's SIGKILL (grace 30 s)")


# ------------------------------------------------------------------------------------------- in-process units
@pytest.fixture
def saved_sigterm():
    """Puts the test process's SIGTERM action back, whatever a test did to it."""
    saved = tf_sigterm._read_action()
    was = tf_sigterm._state.pop("tf_action", None)
    yield
    tf_sigterm._state.pop("tf_action", None)
    if was is not None:
        tf_sigterm._state["tf_action"] = was
    tf_sigterm._write_action(saved)


def _install_tensorflows_handler() -> None:
    """What TF's SigtermNotifier does: creating the "sigterm" PreemptionNotifier through TF's own C++ is not
    reachable from Python without a cluster, so this points SIGTERM at a function inside libtensorflow_cc (never
    called: the test sends no signal)."""
    import tensorflow as tf

    lib = Path(tf.__file__).parent / "libtensorflow_cc.so.2"
    cc = ctypes.CDLL(str(lib))
    address = ctypes.cast(cc.TFE_NewContext, ctypes.c_void_p).value  # defined in libtensorflow_cc
    buf = ctypes.create_string_buffer(512)
    ctypes.c_void_p.from_buffer(buf).value = address
    tf_sigterm._write_action(buf)


def test_apply_is_idempotent_and_reversible(saved_sigterm, monkeypatch) -> None:
    monkeypatch.delenv("TFACCEL_DISABLE_COMPAT", raising=False)
    monkeypatch.delenv(tf_sigterm.KEEP_ENV, raising=False)
    assert tf_sigterm.is_needed()
    tf_sigterm._write_action(ctypes.create_string_buffer(512))  # zeroed: SIG_DFL
    assert not tf_sigterm.apply() and not tf_sigterm.is_applied()  # TF's handler is not there: nothing to undo
    _install_tensorflows_handler()
    assert "libtensorflow_cc" in tf_sigterm.handler_owner()
    assert tf_sigterm.apply() and tf_sigterm.apply() and tf_sigterm.is_applied()
    assert tf_sigterm.handler_owner() == "SIG_DFL"
    assert tf_sigterm.remove() and not tf_sigterm.remove()
    assert "libtensorflow_cc" in tf_sigterm.handler_owner()


def test_around_strategy_creation_puts_back_a_python_handler(saved_sigterm, monkeypatch) -> None:
    """A handler the program installed before the strategy is what comes back, not SIG_DFL."""
    monkeypatch.delenv("TFACCEL_DISABLE_COMPAT", raising=False)
    monkeypatch.delenv(tf_sigterm.KEEP_ENV, raising=False)
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        python_owner = tf_sigterm.handler_owner()
        with tf_sigterm.around_strategy_creation():
            _install_tensorflows_handler()  # as the MWMS constructor does
        assert tf_sigterm.is_applied() and tf_sigterm.handler_owner() == python_owner
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_the_fix_follows_a_failed_constructor_too(saved_sigterm, monkeypatch) -> None:
    """A constructor that raises (start-up timeout) after TF installed its handler still gets SIGTERM back."""
    monkeypatch.delenv("TFACCEL_DISABLE_COMPAT", raising=False)
    monkeypatch.delenv(tf_sigterm.KEEP_ENV, raising=False)
    tf_sigterm._write_action(ctypes.create_string_buffer(512))
    with pytest.raises(RuntimeError):
        with tf_sigterm.around_strategy_creation():
            _install_tensorflows_handler()
            raise RuntimeError("start-up barrier timed out")
    assert tf_sigterm.is_applied() and tf_sigterm.handler_owner() == "SIG_DFL"


def test_switched_off_and_kept_say_why(saved_sigterm, monkeypatch, log_records) -> None:
    monkeypatch.setenv("TFACCEL_DISABLE_COMPAT", "tf_sigterm")
    with tf_sigterm.around_strategy_creation():
        _install_tensorflows_handler()
    assert not tf_sigterm.is_applied() and "libtensorflow_cc" in tf_sigterm.handler_owner()
    assert any("compat fix tf_sigterm: switched off by TFACCEL_DISABLE_COMPAT (tf_sigterm)" in r.getMessage()
               and r.levelno == logging.WARNING for r in log_records)
    monkeypatch.delenv("TFACCEL_DISABLE_COMPAT")
    monkeypatch.setenv(tf_sigterm.KEEP_ENV, "1")
    assert not tf_sigterm.apply()
    assert any("TFACCEL_KEEP_TF_SIGTERM=1: TensorFlow's SIGTERM preemption notifier is kept" in r.getMessage()
               for r in log_records)
    assert tf_sigterm.apply(force=True) and tf_sigterm.handler_owner() == "SIG_DFL"


def test_outside_the_version_range_it_does_not_patch(saved_sigterm, monkeypatch, log_records) -> None:
    import tensorflow as tf

    monkeypatch.delenv("TFACCEL_DISABLE_COMPAT", raising=False)
    monkeypatch.delenv(tf_sigterm.KEEP_ENV, raising=False)
    monkeypatch.setattr(tf, "__version__", "2.22.0")
    _install_tensorflows_handler()
    assert not tf_sigterm.is_needed() and not tf_sigterm.apply()
    assert any("compat fix tf_sigterm not applied: TensorFlow 2.22.0 is outside the versions this fix is known to "
               "be needed on (2.21 up to 2.21.x); not patching" in r.getMessage() for r in log_records)
