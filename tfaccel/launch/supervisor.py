"""Runs the processes of one launch and watches them until the job is over.

One :class:`LaunchTask` per process. The supervisor starts them (server tasks first; the tasks that run the
user's command once every server accepts connections), streams their output with a ``[worker 1] `` prefix
(stdout to stdout, stderr to stderr), and ends the job as soon as it is decided:

- every command task exited 0: the server tasks are ended and the job succeeded;
- a command task exited non-zero, or a server task exited at all: fail-fast, every other task gets SIGTERM,
  then SIGKILL after ``grace`` seconds; the job exits with the failing task's code (128 + N when it was
  killed by signal N) and the log names the task and shows its last lines;
- the deadline passed (exit 124), the launcher got SIGINT/SIGTERM/SIGHUP (forwarded to every task; exit 128 + N),
  or a peer never accepted connections within the connect timeout (exit 1).

:func:`run_job` adds restarts: after a failure the whole job is built again (fresh ports) and started, up to
``max_restarts`` times. Every process is started in its own session and ended with its whole process group,
so no task or child of a task outlives the launcher (short of the launcher itself being SIGKILLed).
"""

import collections
import contextlib
import dataclasses
import itertools
import shlex
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Any, Callable, Deque, Dict, List, Mapping, Optional, Sequence, Tuple

from tfaccel.launch.netns import open_network
from tfaccel.launch.procs import exit_status, port_open, start_process, terminate, wait_for_ports
from tfaccel.launch.restarts import RestartBudget, is_preempted, preempted_attempt, signals_to_forward
from tfaccel.log import get_logger

__all__ = ["LaunchTask", "TaskOutcome", "LaunchResult", "run_job", "exit_code", "describe_returncode",
           "warn_exposed_ports", "EXIT_TIMEOUT", "EXIT_UNREACHABLE", "RESTART_ENV"]

EXIT_TIMEOUT = 124  # like coreutils timeout(1)
EXIT_UNREACHABLE = 1
RESTART_ENV = "TFACCEL_RESTART_COUNT"  # how many times the job was restarted before this attempt
TAIL_LINES = 15
_POLL_S = 0.05


@dataclasses.dataclass(frozen=True)
class LaunchTask:
    """One process of a launch.

    Attributes:
        task_type: cluster role, e.g. ``"worker"``.
        task_index: index within the role.
        cmd: the argv to run (never through a shell).
        env: the complete environment of the process.
        server: True for ps / parameter-server worker tasks: they run until the command tasks are done.
        address: ``"host:port"`` of the task in the cluster, if it has one.
        tf_config: the TF_CONFIG JSON the task gets (for display), if any.
    """

    task_type: str
    task_index: int
    cmd: Tuple[str, ...]
    env: Mapping[str, str]
    server: bool = False
    address: Optional[str] = None
    tf_config: Optional[str] = None

    @property
    def name(self) -> str:
        """``"worker:1"``."""
        return f"{self.task_type}:{self.task_index}"

    @property
    def prefix(self) -> str:
        """``"[worker 1] "``, put in front of every line of the task's output."""
        return f"[{self.task_type} {self.task_index}] "


@dataclasses.dataclass
class TaskOutcome:
    """What one task did.

    Attributes:
        name: ``"worker:1"``.
        returncode: the process's exit status (negative: killed by that signal).
        stdout: its standard output (all of it, or the last lines when capture is bounded), unprefixed.
        stderr: its standard error, the same way.
        pid: its process id.
        stopped: True when the launcher ended it (fail-fast, timeout, interrupt, or a server after success).
        value: for a callable run by ``run_local``, what it returned (None otherwise).
    """

    name: str
    returncode: Optional[int]
    stdout: str
    stderr: str
    pid: int = 0
    stopped: bool = False
    value: Any = None


@dataclasses.dataclass
class LaunchResult:
    """The outcome of a launch.

    Attributes:
        returncode: what ``tfaccel launch`` exits with: 0, the failing task's code (128 + N for signal N),
            124 on timeout, 128 + N when the launcher was interrupted by signal N, 1 when peers never came up.
        tasks: the outcome of every task of the last attempt, in launch order.
        restarts: how many times the job was restarted.
        reason: ``"ok"``, ``"failed"``, ``"timeout"``, ``"interrupted"`` or ``"unreachable"``.
        failed_task: the name of the task that failed first (``"failed"`` only).
        message: one line saying what happened.
        attempts: the task outcomes of every attempt, the last one included.
        elapsed: seconds from the first start to the end.
    """

    returncode: int
    tasks: List[TaskOutcome]
    restarts: int = 0
    reason: str = "ok"
    failed_task: Optional[str] = None
    message: str = ""
    attempts: List[List[TaskOutcome]] = dataclasses.field(default_factory=list)
    elapsed: float = 0.0

    @property
    def ok(self) -> bool:
        """True when the job succeeded."""
        return self.returncode == 0

    @property
    def pids(self) -> List[int]:
        """The PID of every process started, over all attempts."""
        return [t.pid for attempt in (self.attempts or [self.tasks]) for t in attempt]

    def task(self, name: str) -> TaskOutcome:
        """The outcome of the task called ``name`` (``"worker:1"``) in the last attempt."""
        for outcome in self.tasks:
            if outcome.name == name:
                return outcome
        raise KeyError(f"no task {name!r} in this launch; tasks: {[t.name for t in self.tasks]}")


def exit_code(returncode: int) -> int:
    """A process status as a shell exit code: negative (killed by signal N) becomes 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def describe_returncode(returncode: Optional[int]) -> str:
    """``"exit code 3"`` or ``"killed by SIGKILL (exit code 137)"``."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name} (exit code {exit_code(returncode)})"
    return f"exit code {returncode}"


@dataclasses.dataclass
class _Verdict:
    reason: str
    returncode: int
    message: str
    failed_task: Optional[str] = None


class _Signals:
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

    def __enter__(self) -> "_Signals":
        if threading.current_thread() is threading.main_thread():
            for sig in signals_to_forward():
                self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()


def _pump(stream: IO[bytes], prefix: str, sink: Optional[IO[str]], lock: threading.Lock,
          keep: Deque[str]) -> None:
    """Copies one output stream of a task line by line: kept in ``keep``, echoed to ``sink`` with a prefix."""
    try:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", errors="replace")
            keep.append(line)
            if sink is not None:
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
        return "".join(source[-lines:]).rstrip("\n")

    def outcome(self) -> TaskOutcome:
        return TaskOutcome(self.task.name, self.proc.returncode, "".join(self.out), "".join(self.err),
                           pid=self.proc.pid, stopped=self.stopped)


def _split_address(address: str) -> Tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class _Attempt:
    """One run of every task of a job."""

    def __init__(self, tasks: Sequence[LaunchTask], *, grace: float, connect_timeout: float,
                 peers: Sequence[Tuple[str, str]], stdout: Optional[IO[str]], stderr: Optional[IO[str]],
                 capture_lines: Optional[int], signals: _Signals, deadline: Optional[float],
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
            thread = threading.Thread(target=_pump, args=(stream, task.prefix, sink, self.lock, keep),
                                      name=f"tfaccel-launch-{task.name}", daemon=True)
            thread.start()
            threads.append(thread)
        self.running.append(_Running(task, proc, out, err, threads, time.monotonic()))
        role = "server" if task.server else "command"
        self.log.info("launch: started %s pid=%d (%s)%s: %s", task.name, proc.pid, role,
                      f" at {task.address}" if task.address else "", shlex.join(task.cmd))

    # -- deciding -----------------------------------------------------------------------------------------
    def _check_exits(self, all_started: bool) -> Optional[_Verdict]:
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
            for thread in run.threads:  # the process is gone: let its last lines arrive before showing them
                thread.join(timeout=2)
            if not run.task.server and is_preempted(rc):
                message = (f"{run.task.name} (pid {run.proc.pid}) was preempted: {describe_returncode(rc)} after "
                           f"{now - run.started:.1f} s (it stopped at a step every task agreed on, backup written)")
                self.log.warning("launch: %s; stopping the other tasks", message)
                return _Verdict("preempted", exit_code(rc), message, failed_task=run.task.name)
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
            self.log.error("launch: %s; stopping the other tasks. Last lines of %s:\n%s", message, run.task.name,
                           _indent(run.tail()) or "    (no output)")
            return _Verdict("failed", code, message, failed_task=run.task.name)
        commands = [r for r in self.running if not r.task.server]
        if all_started and commands and all(r.ended is not None for r in commands):
            return _Verdict("ok", 0, f"all {len(commands)} command task(s) finished OK")
        return None

    def _servers_listening(self, confirmed: set) -> List[_Running]:
        waiting = []
        for run in self.running:
            if run.task.server and run.task.address and run.task.name not in confirmed:
                probe = self.netns.port_open if self.netns is not None else port_open
                if probe(*_split_address(run.task.address), timeout=0.2):
                    confirmed.add(run.task.name)
                else:
                    waiting.append(run)
        return waiting

    # -- running ------------------------------------------------------------------------------------------
    def run(self) -> _Verdict:
        try:
            verdict = self._watch()
        except BaseException:
            self._stop(signal.SIGTERM, wanted=False)
            raise
        if verdict.reason == "interrupted":
            self._stop(_forwarded(verdict.returncode - 128), wanted=False)
        else:
            self._stop(signal.SIGTERM, wanted=verdict.reason == "ok")
        if verdict.reason in ("preempted", "interrupted"):
            return preempted_attempt(verdict, [r.outcome() for r in self.running if not r.task.server], self.log)
        return verdict

    def _watch(self) -> _Verdict:
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
                message = f"interrupted by {name}; forwarded {signal.Signals(_forwarded(sig)).name} to every task"
                self.log.warning("launch: %s (SIGKILL after %.0f s)", message, self.grace)
                return _Verdict("interrupted", 128 + sig, message)
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
                return _Verdict("timeout", EXIT_TIMEOUT, message)
            time.sleep(_POLL_S)

    def _wait_for_peers(self, missing: List[Tuple[str, str]]) -> None:
        addresses = [_split_address(address) for _, address in self.peers]
        never = set(wait_for_ports(addresses, timeout=self.connect_timeout))
        missing.extend((name, address) for (name, address), addr in zip(self.peers, addresses) if addr in never)

    def _unreachable(self, missing: Sequence[Tuple[str, str]]) -> _Verdict:
        names = ", ".join(f"{name} ({address})" for name, address in missing)
        message = (f"never accepted connections within {self.connect_timeout:g} s (--connect-timeout): {names}; "
                   "start their tasks (tfaccel launch --cluster FILE --task NAME on their hosts) or check the "
                   "addresses and firewall")
        return _Verdict("unreachable", EXIT_UNREACHABLE, message)

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


def warn_exposed_ports(tasks: Sequence[LaunchTask], log: Any, *, restarts: bool = False) -> bool:
    """Logs one warning naming the ports of the tasks that run a TensorFlow gRPC server on this machine's network.

    Such a server listens on every interface and runs whatever graph it is sent, without authentication: anyone
    who can reach the port can read files and run code as this user. Returns True when it warned.
    """
    exposed = [(t.name, t.address) for t in tasks if t.address and t.task_type != "evaluator"]
    if not exposed:
        return False
    ports = ", ".join(f"{_split_address(address)[1]} ({name})" for name, address in exposed)
    log.warning("launch: TensorFlow's gRPC servers of this launch listen on every network interface of this machine "
                "without authentication (whoever reaches a port can run any TensorFlow graph as this user): port(s) "
                "%s%s; allow them only from the cluster's hosts (firewall), or run a local cluster with --network "
                "private (see the README's Security section)", ports,
                "; a restart chooses new ports" if restarts else "")
    return True


def _forwarded(sig: int) -> int:
    """The signal the tasks get when the launcher gets ``sig``: the same, but SIGTERM for SIGHUP (a task's own
    terminal did not hang up; SIGTERM is what schedulers send and what training code handles)."""
    return signal.SIGTERM if sig == signal.SIGHUP else sig


def _indent(text: str) -> str:
    return "\n".join(f"    {line}" for line in text.splitlines())


def run_job(make_tasks: Callable[[int], Sequence[LaunchTask]], *, max_restarts: int = 0,
            timeout: Optional[float] = None, grace: float = 10.0, connect_timeout: float = 60.0,
            peers: Sequence[Tuple[str, str]] = (), stdout: Optional[IO[str]] = None,
            stderr: Optional[IO[str]] = None, echo: bool = True, capture_lines: Optional[int] = None,
            on_attempt_end: Optional[Callable[[int, List[TaskOutcome]], None]] = None,
            network: str = "host", count_preemptions: bool = False,
            preempted: Optional[Callable[[List[TaskOutcome]], bool]] = None) -> LaunchResult:
    """Runs a job until it succeeds, fails more than ``max_restarts`` times, times out or is interrupted.

    A preempted attempt (a command task exited with ``tfaccel.EXIT_PREEMPTED``) is restarted without counting
    against ``max_restarts`` unless ``count_preemptions``; every attempt after the first gets the record of the
    restarts so far (``tfaccel.launch.restarts``).

    Args:
        make_tasks: builds the tasks of attempt N (0 first); called again for every restart, so it can pick
            fresh ports.
        max_restarts: how many times the whole job is started again after a failure. Defaults to 0.
        timeout: bound on the whole run in seconds, restarts included; None for no bound. Defaults to None.
        grace: seconds between SIGTERM and SIGKILL when tasks are stopped. Defaults to 10.
        connect_timeout: seconds that server tasks and ``peers`` get to accept connections. Defaults to 60.
        peers: ``(name, "host:port")`` of tasks started elsewhere that must accept connections in time.
        stdout: where prefixed task stdout goes. Defaults to ``sys.stdout`` (at call time).
        stderr: where prefixed task stderr goes. Defaults to ``sys.stderr`` (at call time).
        echo: stream task output at all. Defaults to True.
        capture_lines: keep only the last N lines of each stream in the result; None keeps everything.
        on_attempt_end: called with (attempt, outcomes) after every attempt (e.g. to collect results).
        network: ``"host"`` runs the tasks on this machine's network; ``"private"`` / ``"auto"`` in one
            loopback-only network namespace for the whole run, restarts included (server ports are probed inside
            it; see :func:`tfaccel.launch.netns.open_network`). Defaults to "host".
        count_preemptions: count restarts after a preemption against ``max_restarts``. Defaults to False.
        preempted: tells a preempted attempt from its outcomes where the exit status cannot (horovodrun exits 1
            when a rank exits 75). Defaults to None (the exit status alone).

    Returns:
        A :class:`LaunchResult`.
    """
    log = get_logger()
    if echo:
        stdout = stdout if stdout is not None else sys.stdout
        stderr = stderr if stderr is not None else sys.stderr
    else:
        stdout = stderr = None
    begun = time.monotonic()
    deadline = begun + timeout if timeout else None
    attempts: List[List[TaskOutcome]] = []
    verdict = _Verdict("failed", 1, "not started")
    net = open_network(network, log=log)
    budget = RestartBudget(max_restarts, count_preemptions=count_preemptions)
    with _Signals() as signals, net if net is not None else contextlib.nullcontext():
        for attempt in itertools.count():
            if signals.received is not None and attempts:  # interrupted between two attempts: stop here
                name = signal.Signals(signals.received).name
                verdict = _Verdict("interrupted", 128 + signals.received, f"interrupted by {name} before a restart")
                break
            tasks = [dataclasses.replace(t, env={**t.env, **budget.env()}) for t in make_tasks(attempt)]
            if net is None and attempt == 0:
                warn_exposed_ports(tasks, log, restarts=max_restarts > 0)
            if max_restarts:
                log.info("launch: attempt %d (%d of at most %d restarts used): %d task(s)", attempt + 1,
                         budget.counted, max_restarts, len(tasks))
            runner = _Attempt(tasks, grace=grace, connect_timeout=connect_timeout, peers=peers, stdout=stdout,
                              stderr=stderr, capture_lines=capture_lines, signals=signals, deadline=deadline,
                              timeout=timeout, netns=net)
            began_attempt = time.monotonic()
            verdict = runner.run()
            outcomes = runner.outcomes()
            attempts.append(outcomes)
            if on_attempt_end is not None:
                on_attempt_end(attempt, outcomes)
            why = "preemption" if verdict.reason == "preempted" or (
                verdict.reason == "failed" and preempted is not None and preempted(outcomes)) else "failure"
            if verdict.reason in ("ok", "timeout", "interrupted") or not budget.allows(why):
                break
            restart = budget.record(why, task=verdict.failed_task or "?", status=verdict.message,
                                    attempt_s=time.monotonic() - began_attempt)
            log.warning("launch: restarting the whole job (%s) after: %s", budget.describe(restart), verdict.message)
    elapsed = time.monotonic() - begun
    if verdict.reason == "ok":
        log.info("launch: job finished OK in %.1f s%s", elapsed,
                 f" after {len(attempts) - 1} restart(s)" if len(attempts) > 1 else "")
    else:
        what = {"failed": "failed", "timeout": "timed out", "interrupted": "interrupted", "preempted": "was preempted",
                "unreachable": "could not reach its peers"}.get(verdict.reason, verdict.reason)
        log.error("launch: job %s (exit %d): %s", what, verdict.returncode, verdict.message)
        if net is not None and verdict.reason == "failed":
            log.info("launch: the tasks ran without access to other machines (private network); if the "
                     "command needs the network (downloads, remote storage), run it with --network host")
    return LaunchResult(returncode=verdict.returncode, tasks=attempts[-1], restarts=len(attempts) - 1,
                        reason=verdict.reason, failed_task=verdict.failed_task, message=verdict.message,
                        attempts=attempts, elapsed=elapsed)
