"""One attempt of a launch: its processes started, their output pumped, their exits watched, and the verdict.

An :class:`Attempt` starts every task of a job (server tasks first; the tasks that run the user's command once
every server accepts connections), streams their output with a ``[worker 1] `` prefix, decides as soon as the
attempt is over (see :mod:`tfaccel.launch.supervisor`) and ends every process with its whole process group.
"""

import collections
import contextlib
import dataclasses
import shlex
import signal
import subprocess
import threading
import time
from typing import IO, Any, Deque, Dict, List, Optional, Sequence, Tuple

from tfaccel.cluster.address import socket_address
from tfaccel.errors import EXIT_CONFIG
from tfaccel.launch.outcome import (EXIT_TIMEOUT, EXIT_UNREACHABLE, LaunchTask, TaskOutcome, describe_returncode,
                                    exit_code)
from tfaccel.launch.procs import exit_status, port_open, start_process, terminate, wait_for_ports
from tfaccel.launch.restarts import is_preempted, preempted_attempt, signals_to_forward
from tfaccel.launch.tf_noise import is_tf_noise, show_tf_logs
from tfaccel.log import get_logger

__all__ = ["Attempt", "Verdict", "SignalWatch", "forwarded_signal", "TAIL_LINES"]

TAIL_LINES = 15
_POLL_S = 0.05


@dataclasses.dataclass
class Verdict:
    """How an attempt ended: ``reason`` (``"ok"``, ``"failed"``, ``"config"`` (a command task exited with
    :data:`tfaccel.errors.EXIT_CONFIG`), ``"preempted"``, ``"timeout"``, ``"interrupted"``, ``"unreachable"``), the launch's exit code, one line saying what happened, and the task that failed."""

    reason: str
    returncode: int
    message: str
    failed_task: Optional[str] = None


class SignalWatch:
    """Records SIGINT/SIGTERM/SIGHUP sent to the launcher while a job runs (main thread only; elsewhere a no-op).

    SIGHUP (the terminal or ssh connection of the launcher went away) is handled like SIGTERM: forwarded to every
    task, which then gets the grace period, instead of the launcher dying at once and its tasks being SIGKILLed.
    """

    def __init__(self) -> None:
        self.received: Optional[int] = None
        self._previous: Dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        if self.received is None:
            self.received = signum

    def __enter__(self) -> "SignalWatch":
        if threading.current_thread() is threading.main_thread():
            for sig in signals_to_forward():  # and the preemption signal (TFACCEL_PREEMPTION_SIGNAL)
                self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()


def _pump(stream: IO[bytes], prefix: str, sink: Optional[IO[str]], lock: threading.Lock,
          keep: Deque[str], quiet: bool = False) -> None:
    """Copies one output stream of a task line by line: kept in ``keep``, echoed to ``sink`` with a prefix (but
    TensorFlow's start-up noise where ``quiet``: :mod:`tfaccel.launch.tf_noise`)."""
    try:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", errors="replace")
            keep.append(line)
            if sink is not None and not (quiet and is_tf_noise(line)):
                text = prefix + (line if line.endswith("\n") else line + "\n")
                with lock, contextlib.suppress(ValueError, OSError):  # a closed sink must not kill the pump
                    sink.write(text)
                    sink.flush()
    finally:
        stream.close()


@dataclasses.dataclass
class _Running:
    task: LaunchTask
    proc: subprocess.Popen
    out: Deque[str]
    err: Deque[str]
    threads: List[threading.Thread]
    started: float
    ended: Optional[float] = None
    stopped: bool = False

    def tail(self, lines: int = TAIL_LINES) -> str:
        source = list(self.err) or list(self.out)
        if not show_tf_logs():
            source = [line for line in source if not is_tf_noise(line)]
        return "".join(source[-lines:]).rstrip("\n")

    def outcome(self) -> TaskOutcome:
        return TaskOutcome(self.task.name, self.proc.returncode, "".join(self.out), "".join(self.err),
                           pid=self.proc.pid, stopped=self.stopped)


class Attempt:
    """One run of every task of a job."""

    def __init__(self, tasks: Sequence[LaunchTask], *, grace: float, connect_timeout: float,
                 peers: Sequence[Tuple[str, str]], stdout: Optional[IO[str]], stderr: Optional[IO[str]],
                 capture_lines: Optional[int], signals: SignalWatch, deadline: Optional[float],
                 timeout: Optional[float], netns: Any = None) -> None:
        self.tasks = list(tasks)
        self.grace = grace
        self.connect_timeout = connect_timeout
        self.peers = list(peers)
        self.stdout, self.stderr = stdout, stderr
        self.capture_lines = capture_lines
        self.signals = signals
        self.deadline = deadline
        self.timeout = timeout
        self.netns = netns
        self.running: List[_Running] = []
        self.lock = threading.Lock()
        self.log = get_logger()

    # -- starting -----------------------------------------------------------------------------------------
    def _start(self, task: LaunchTask) -> None:
        proc = start_process(task.cmd, env=task.env, die_with_parent=True, netns=self.netns)
        out: Deque[str] = collections.deque(maxlen=self.capture_lines)
        err: Deque[str] = collections.deque(maxlen=self.capture_lines)
        threads = []
        for stream, sink, keep in ((proc.stdout, self.stdout, out), (proc.stderr, self.stderr, err)):
            thread = threading.Thread(target=_pump, args=(stream, task.prefix, sink, self.lock, keep,
                                                          not show_tf_logs()),
                                      name=f"tfaccel-launch-{task.name}", daemon=True)
            thread.start()
            threads.append(thread)
        self.running.append(_Running(task, proc, out, err, threads, time.monotonic()))
        role = "server" if task.server else "command"
        self.log.info("launch: started %s pid=%d (%s)%s: %s", task.name, proc.pid, role,
                      f" at {task.address}" if task.address else "", shlex.join(task.cmd))

    # -- deciding -----------------------------------------------------------------------------------------
    def _check_exits(self, all_started: bool) -> Optional[Verdict]:
        now = time.monotonic()
        newly = []
        for run in self.running:
            if run.ended is None and exit_status(run.proc) is not None:  # not reaped before terminate()
                run.ended = now
                newly.append(run)
        for run in newly:
            rc = exit_status(run.proc)
            if not run.task.server and rc == 0:
                self.log.info("launch: %s pid=%d finished OK after %.1f s", run.task.name, run.proc.pid,
                              now - run.started)
                continue
            if run.task.server and rc == 0 and not any(not t.server for t in self.tasks):
                # per-host mode inside srun: the server ended because its chief's job is over (launch.server)
                return Verdict("ok", 0, f"{run.task.name} (a server task) ended after its chief's job was over")
            for thread in run.threads:  # the process is gone: let its last lines arrive before showing them
                thread.join(timeout=2)
            if not run.task.server and is_preempted(rc):
                message = (f"{run.task.name} (pid {run.proc.pid}) was preempted: {describe_returncode(rc)} after "
                           f"{now - run.started:.1f} s (it stopped at a step every task agreed on, backup written)")
                self.log.warning("launch: %s; stopping the other tasks", message)
                return Verdict("preempted", exit_code(rc), message, failed_task=run.task.name)
            if run.task.server and run.task.task_type == "worker" and any(
                    other is not run and other.task.server and other.task.task_type == "worker"
                    and exit_status(other.proc) is None for other in self.running):
                # issue 9 (R3): ClusterCoordinator re-schedules a lost worker's closures on the other workers, so
                # a parameter-server job goes on while at least one worker server is alive.
                self.log.warning("launch: %s (pid %d), a parameter-server worker, exited: %s after %.1f s; the job "
                                 "goes on with the other workers (the coordinator re-schedules its work). Last lines "
                                 "of %s:\n%s", run.task.name, run.proc.pid, describe_returncode(rc), now - run.started,
                                 run.task.name, _indent(run.tail()) or "    (no output)")
                continue
            what = "failed" if not run.task.server else "(a server task) exited before the command tasks finished"
            code = exit_code(rc) if rc != 0 else 1
            message = (f"{run.task.name} (pid {run.proc.pid}) {what}: {describe_returncode(rc)} after "
                       f"{now - run.started:.1f} s")
            if not run.task.server and rc == EXIT_CONFIG:
                message += (f" (exit {EXIT_CONFIG}: a configuration error, tfaccel.ConfigError; a restart would fail the "
                            "same way, so the job is not restarted: fix what the task's message names)")
                self.log.error("launch: %s. Last lines of %s:\n%s", message, run.task.name,
                               _indent(run.tail()) or "    (no output)")
                return Verdict("config", code, message, failed_task=run.task.name)
            self.log.error("launch: %s; stopping the other tasks. Last lines of %s:\n%s", message, run.task.name,
                           _indent(run.tail()) or "    (no output)")
            return Verdict("failed", code, message, failed_task=run.task.name)
        commands = [r for r in self.running if not r.task.server]
        if all_started and commands and all(r.ended is not None for r in commands):
            return Verdict("ok", 0, f"all {len(commands)} command task(s) finished OK")
        return None

    def _servers_listening(self, confirmed: set) -> List[_Running]:
        waiting = []
        for run in self.running:
            if run.task.server and run.task.address and run.task.name not in confirmed:
                probe = self.netns.port_open if self.netns is not None else port_open
                if probe(*socket_address(run.task.address), timeout=0.2):
                    confirmed.add(run.task.name)
                else:
                    waiting.append(run)
        return waiting

    # -- running ------------------------------------------------------------------------------------------
    def run(self) -> Verdict:
        try:
            verdict = self._watch()
        except BaseException:
            self._stop(signal.SIGTERM, wanted=False)
            raise
        if verdict.reason == "interrupted":
            self._stop(forwarded_signal(verdict.returncode - 128), wanted=False)
        else:
            self._stop(signal.SIGTERM, wanted=verdict.reason == "ok")
        if verdict.reason in ("preempted", "interrupted"):
            return preempted_attempt(verdict, [r.outcome() for r in self.running if not r.task.server], self.log)
        return verdict

    def _watch(self) -> Verdict:
        servers = [t for t in self.tasks if t.server]
        commands = [t for t in self.tasks if not t.server]
        for task in servers:
            self._start(task)
        if commands and any(t.address for t in servers):
            self.log.info("launch: waiting for %d server task(s) to accept connections before starting %s",
                          len(servers), ", ".join(t.name for t in commands))
        else:
            for task in commands:
                self._start(task)
            commands = []
        begun = time.monotonic()
        confirmed: set = set()
        missing_peers: List[Tuple[str, str]] = []
        watcher: Optional[threading.Thread] = None
        if self.peers:
            watcher = threading.Thread(target=self._wait_for_peers, args=(missing_peers,), daemon=True,
                                       name="tfaccel-launch-peers")
            watcher.start()
        while True:
            if self.signals.received is not None:
                sig = self.signals.received
                name = signal.Signals(sig).name
                message = f"interrupted by {name}; forwarded {signal.Signals(forwarded_signal(sig)).name} to every task"
                self.log.warning("launch: %s (SIGKILL after %.0f s)", message, self.grace)
                return Verdict("interrupted", 128 + sig, message)
            verdict = self._check_exits(all_started=not commands)
            if verdict is not None:
                return verdict
            now = time.monotonic()
            if commands:
                waiting = self._servers_listening(confirmed)
                if not waiting:
                    for task in commands:
                        self._start(task)
                    commands = []
                elif now - begun > self.connect_timeout:
                    return self._unreachable([(r.task.name, r.task.address or "?") for r in waiting])
            if watcher is not None and not watcher.is_alive():
                watcher = None
                if missing_peers:
                    return self._unreachable(missing_peers)
                self.log.info("launch: every other task of the cluster accepts connections")
            if self.deadline is not None and now >= self.deadline:
                alive = [r.task.name for r in self.running if exit_status(r.proc) is None]
                message = f"timed out after {self.timeout:g} s (--timeout); still running: {', '.join(alive) or 'none'}"
                return Verdict("timeout", EXIT_TIMEOUT, message)
            time.sleep(_POLL_S)

    def _wait_for_peers(self, missing: List[Tuple[str, str]]) -> None:
        addresses = [socket_address(address) for _, address in self.peers]
        never = set(wait_for_ports(addresses, timeout=self.connect_timeout))
        missing.extend((name, address) for (name, address), addr in zip(self.peers, addresses) if addr in never)

    def _unreachable(self, missing: Sequence[Tuple[str, str]]) -> Verdict:
        names = ", ".join(f"{name} ({address})" for name, address in missing)
        message = (f"never accepted connections within {self.connect_timeout:g} s (--connect-timeout): {names}; "
                   "start their tasks (tfaccel launch --cluster FILE --task NAME on their hosts) or check the "
                   "addresses and firewall")
        return Verdict("unreachable", EXIT_UNREACHABLE, message)

    def _stop(self, sig: int, *, wanted: bool) -> None:
        """Ends every task still running (``wanted``: the job is done, these are servers) and its group."""
        alive = [r for r in self.running if exit_status(r.proc) is None]
        for run in alive:
            run.stopped = True
        if alive:
            self.log.info("launch: stopping %s with %s", ", ".join(f"{r.task.name} pid={r.proc.pid}" for r in alive),
                          signal.Signals(sig).name)
        # Every group gets SIGKILL at the end, even of tasks that already exited: their children may linger.
        terminate([r.proc for r in self.running], grace=self.grace, sig=sig)
        for run in self.running:
            for thread in run.threads:
                thread.join(timeout=5)

    def outcomes(self) -> List[TaskOutcome]:
        return [run.outcome() for run in self.running]

def forwarded_signal(sig: int) -> int:
    """The signal the tasks get when the launcher gets ``sig``: the same, but SIGTERM for SIGHUP (a task's own
    terminal did not hang up; SIGTERM is what schedulers send and what training code handles)."""
    return signal.SIGTERM if sig == signal.SIGHUP else sig


def _indent(text: str) -> str:
    return "\n".join(f"    {line}" for line in text.splitlines())
