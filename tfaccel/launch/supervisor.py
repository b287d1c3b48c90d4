"""Runs the processes of one launch and watches them until the job is over.

One :class:`LaunchTask` per process. The supervisor starts them (server tasks first; the tasks that run the
user's command once every server accepts connections), streams their output with a ``[worker 1] `` prefix
(stdout to stdout, stderr to stderr), and ends the job as soon as it is decided:

- every command task exited 0: the server tasks are ended and the job succeeded;
- a command task exited non-zero, or a server task exited at all: fail-fast, every other task gets SIGTERM,
  then SIGKILL after ``grace`` seconds; the job exits with the failing task's code (128 + N when it was
  killed by signal N) and the log names the task and shows its last lines;
- a command task exited with ``tfaccel.errors.EXIT_CONFIG`` (2: a ``ConfigError``): fail-fast as above, and the
  job is never restarted, whatever ``max_restarts`` says (the same options would fail the same way);
- a command task exited with ``tfaccel.EXIT_PREEMPTED`` (75: it stopped at a step every task agreed on, its
  backup written): the others are stopped and the job is restarted, not counted against ``max_restarts``
  (:mod:`tfaccel.launch.restarts`);
- the deadline passed (exit 124), the launcher got SIGINT/SIGTERM/SIGHUP or ``TFACCEL_PREEMPTION_SIGNAL``
  (forwarded to every task; exit 128 + N, or 75 when every task exited 75), or a peer never accepted connections
  within the connect timeout (exit 1).

:func:`run_job` adds restarts (the restart policy lives here; one attempt's processes in
:mod:`tfaccel.launch.attempt`): after a failure the whole job is built again (fresh ports) and started, up to
``max_restarts`` times. Every process is started in its own session and ended with its whole process group,
so no task or child of a task outlives the launcher (short of the launcher itself being SIGKILLed).
"""

import contextlib
import dataclasses
import itertools
import signal
import sys
import time
from typing import IO, Any, Callable, List, Optional, Sequence, Tuple

from tfaccel.cluster.address import split_address
from tfaccel.launch.attempt import Attempt, SignalWatch, Verdict
from tfaccel.launch.netns import open_network
from tfaccel.launch.outcome import LaunchResult, LaunchTask, TaskOutcome
from tfaccel.launch.restarts import NOT_RESTARTED, RestartBudget
from tfaccel.log import get_logger

__all__ = ["run_job", "warn_exposed_ports", "RESTART_ENV"]

RESTART_ENV = "TFACCEL_RESTART_COUNT"  # how many times the job was restarted before this attempt


def warn_exposed_ports(tasks: Sequence[LaunchTask], log: Any, *, restarts: bool = False) -> bool:
    """Logs one warning naming the ports of the tasks that run a TensorFlow gRPC server on this machine's network.

    Such a server listens on every interface and runs whatever graph it is sent, without authentication: anyone
    who can reach the port can read files and run code as this user. Returns True when it warned.
    """
    exposed = [(t.name, t.address) for t in tasks if t.address and t.task_type != "evaluator"]
    if not exposed:
        return False
    ports = ", ".join(f"{split_address(address)[1]} ({name})" for name, address in exposed)
    log.warning("launch: TensorFlow's gRPC servers of this launch listen on every network interface of this machine "
                "without authentication (whoever reaches a port can run any TensorFlow graph as this user): port(s) "
                "%s%s; allow them only from the cluster's hosts (firewall), or run a local cluster with --network "
                "private (see docs/guides/security.md)", ports,
                "; a restart chooses new ports" if restarts else "")
    return True


def run_job(make_tasks: Callable[[int], Sequence[LaunchTask]], *, max_restarts: int = 0,
            timeout: Optional[float] = None, grace: float = 10.0, connect_timeout: float = 60.0,
            peers: Sequence[Tuple[str, str]] = (), stdout: Optional[IO[str]] = None,
            stderr: Optional[IO[str]] = None, echo: bool = True, capture_lines: Optional[int] = None,
            on_attempt_end: Optional[Callable[[int, List[TaskOutcome]], None]] = None,
            network: str = "host", count_preemptions: bool = False,
            preempted: Optional[Callable[[List[TaskOutcome]], bool]] = None,
            record: Optional[RestartBudget] = None) -> LaunchResult:
    """Runs a job until it succeeds, fails more than ``max_restarts`` times, times out or is interrupted.

    A preempted attempt (a command task exited with ``tfaccel.EXIT_PREEMPTED``) is restarted without counting
    against ``max_restarts`` unless ``count_preemptions``; every attempt after the first gets the record of the
    restarts so far (:mod:`tfaccel.launch.restarts`).

    Args:
        make_tasks: builds the tasks of attempt N (0 first); called again for every restart, so it can pick
            fresh ports.
        max_restarts: how many times the whole job is started again after a failure. Defaults to 0.
        timeout: bound on the whole run in seconds, restarts included; None for no bound. Defaults to None.
        grace: seconds between SIGTERM and SIGKILL when tasks are stopped. Defaults to 10.
        connect_timeout: seconds that server tasks and ``peers`` get to accept connections. Defaults to 60.
        peers: ``(name, "host:port")`` of tasks started elsewhere that must accept connections in time.
        stdout, stderr: where prefixed task stdout, stderr go. Defaults to ``sys.stdout``, ``sys.stderr`` (then).
        echo: stream task output at all. Defaults to True.
        capture_lines: keep only the last N lines of each stream in the result; None keeps everything.
        on_attempt_end: called with (attempt, outcomes) after every attempt (e.g. to collect results).
        network: ``"host"`` runs the tasks on this machine's network; ``"private"`` / ``"auto"`` in one
            loopback-only network namespace for the whole run, restarts included (server ports are probed inside
            it; see :func:`tfaccel.launch.netns.open_network`). Defaults to "host".
        count_preemptions: count restarts after a preemption against ``max_restarts``. Defaults to False.
        preempted: tells a preempted attempt from its outcomes where the exit status cannot (horovodrun exits 1
            when a rank exits 75). Defaults to None (the exit status alone).
        record: the restart record of a job whose caller restarts it (``run_elastic``): every task gets it, and the
            launch is one attempt, never restarted here (reason ``"preempted"`` if so). Defaults to None (its own).

    Returns:
        A :class:`LaunchResult`.
    """
    stdout, stderr = ((sys.stdout if stdout is None else stdout, sys.stderr if stderr is None else stderr) if echo
                      else (None, None))
    log, begun = get_logger(), time.monotonic()
    deadline = begun + timeout if timeout else None
    net = open_network(network, log=log)

    def attempt_of(tasks: Sequence[LaunchTask], signals: SignalWatch) -> Attempt:
        return Attempt(tasks, grace=grace, connect_timeout=connect_timeout, peers=peers, stdout=stdout, stderr=stderr,
                       capture_lines=capture_lines, signals=signals, deadline=deadline, timeout=timeout, netns=net)

    with SignalWatch() as signals, net if net is not None else contextlib.nullcontext():
        verdict, attempts = _run_attempts(make_tasks, lambda tasks: attempt_of(tasks, signals), signals,
                                          budget=record if record is not None else RestartBudget(
                                              max_restarts, count_preemptions=count_preemptions),
                                          once=record is not None, on_attempt_end=on_attempt_end,
                                          warn_ports=net is None, preempted=preempted)
    elapsed = time.monotonic() - begun
    _log_end(verdict, len(attempts), elapsed, private=net is not None)
    return LaunchResult(returncode=verdict.returncode, tasks=attempts[-1], restarts=len(attempts) - 1,
                        reason=verdict.reason, failed_task=verdict.failed_task,
                        message=verdict.message, attempts=attempts, elapsed=elapsed)


def _run_attempts(make_tasks: Callable[[int], Sequence[LaunchTask]],
                  attempt_of: Callable[[Sequence[LaunchTask]], Attempt], signals: SignalWatch, *,
                  budget: RestartBudget, on_attempt_end: Optional[Callable[[int, List[TaskOutcome]], None]],
                  warn_ports: bool, preempted: Optional[Callable[[List[TaskOutcome]], bool]] = None,
                  once: bool = False) -> Tuple[Verdict, List[List[TaskOutcome]]]:
    """The restart policy: attempts until one succeeds, times out or is interrupted, or the budget allows no
    restart for why the last one ended (preemptions are not counted unless asked); an interrupt between two
    attempts stops there. Every attempt gets the restarts so far in its environment. ``once``: one attempt, its
    restart the caller's business."""
    log = get_logger()
    attempts: List[List[TaskOutcome]] = []
    verdict = Verdict("failed", 1, "not started")
    max_restarts = budget.max_restarts
    for attempt in itertools.count():
        if signals.received is not None and attempts:  # interrupted between two attempts: stop here
            name = signal.Signals(signals.received).name
            return Verdict("interrupted", 128 + signals.received, f"interrupted by {name} before a restart"), attempts
        tasks = [dataclasses.replace(t, env={**t.env, **budget.env()}) for t in make_tasks(attempt)]
        if warn_ports and attempt == 0:
            warn_exposed_ports(tasks, log, restarts=max_restarts > 0)
        if max_restarts and not once:
            log.info("launch: attempt %d (%d of at most %d restarts used): %d task(s)", attempt + 1, budget.counted,
                     max_restarts, len(tasks))
        runner, began = attempt_of(tasks), time.monotonic()
        verdict = runner.run()
        outcomes = runner.outcomes()
        attempts.append(outcomes)
        if on_attempt_end is not None:
            on_attempt_end(attempt, outcomes)
        why = "preemption" if verdict.reason == "preempted" or (
            verdict.reason == "failed" and preempted is not None and preempted(outcomes)) else "failure"
        if verdict.reason in NOT_RESTARTED or once or not budget.allows(why):
            break
        restart = budget.record(why, task=verdict.failed_task or "?", status=verdict.message,
                                attempt_s=time.monotonic() - began)
        log.warning("launch: restarting the whole job (%s) after: %s", budget.describe(restart), verdict.message)
    return verdict, attempts


def _log_end(verdict: Verdict, attempts: int, elapsed: float, *, private: bool) -> None:
    """The launch's last log line: finished OK, or how it ended and why."""
    log = get_logger()
    if verdict.reason == "ok":
        log.info("launch: job finished OK in %.1f s%s", elapsed,
                 f" after {attempts - 1} restart(s)" if attempts > 1 else "")
        return
    what = {"failed": "failed", "config": "failed on a configuration error", "timeout": "timed out", "interrupted": "interrupted", "preempted": "was preempted",
            "unreachable": "could not reach its peers"}.get(verdict.reason, verdict.reason)
    log.error("launch: job %s (exit %d): %s", what, verdict.returncode, verdict.message)
    if private and verdict.reason == "failed":
        log.info("launch: the tasks ran without access to other machines (private network); if the "
                 "command needs the network (downloads, remote storage), run it with --network host")
