"""Restarts of a launched job: a preempted job comes back from its backup without spending ``--max-restarts``,
and every restart is recorded for the training processes of the next attempt.

A task that exits with :data:`tfaccel.errors.EXIT_PREEMPTED` (75) stopped at a step every process agreed on,
after the chief wrote a backup there (``tfaccel.resilience.preemption``). The launcher then stops the other tasks
(which are exiting with the same code), restarts the job, and does not count that restart against
``--max-restarts`` unless ``--count-preemptions`` asks it to. A task that exits with
:data:`tfaccel.errors.EXIT_CONFIG` (2, a ``ConfigError``) ends the job at once: a restart would fail the same way.
Any other early exit is a failure, as before.

Every attempt after the first gets :data:`RESTARTS_ENV`: a JSON list with one entry per restart so far
(``restart``, ``why`` = ``"preemption"``, ``"failure"`` or, in an elastic job, ``"resize"``, ``task``, ``status``,
``ended_at`` as Unix time, ``attempt_s``, ``counted``; an elastic job's entries add ``from_workers`` and
``to_workers``, and a resize its ``cause``, the preemption or failure that ended the attempt). ``tfaccel.fit``
reads it and reports ``FitResult.details["restarts"]`` with the position each restart resumed from, the steps and
the seconds it lost. One :class:`RestartBudget` holds the record of a job: :func:`tfaccel.launch.supervisor.run_job`
keeps its own, and :func:`tfaccel.launch.elastic.run_elastic` keeps one over all its attempts and hands it to each.
"""

import dataclasses
import json
import signal
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from tfaccel.errors import EXIT_PREEMPTED

__all__ = ["RESTARTS_ENV", "NOT_RESTARTED", "Restart", "RestartBudget", "is_preempted", "why_ended", "signals_to_forward",
           "preempted_attempt"]

RESTARTS_ENV = "TFACCEL_RESTARTS"
# How an attempt ends that no restart can change: done, out of time, stopped by a signal, or a configuration error
# (a command task exited EXIT_CONFIG: the same options fail the same way on every attempt).
NOT_RESTARTED = ("ok", "timeout", "interrupted", "config")
_MAX_RECORDED = 100  # the record is an environment variable: the last 100 restarts are plenty


def is_preempted(returncode: Optional[int]) -> bool:
    """Whether a process status says the process stopped on a preemption (exit code 75, with its backup written)."""
    return returncode == EXIT_PREEMPTED


def why_ended(returncode: Optional[int]) -> str:
    """``"preemption"`` for :data:`EXIT_PREEMPTED`, else ``"failure"``."""
    return "preemption" if is_preempted(returncode) else "failure"


@dataclasses.dataclass(frozen=True)
class Restart:
    """One restart of a job.

    Attributes:
        restart: 1 for the first restart.
        why: ``"preemption"``, ``"failure"`` or (an elastic job that restarts on another number of workers)
            ``"resize"``.
        task: the task whose exit decided it (``"worker:1"``).
        status: how it ended (``"exit code 75"``).
        ended_at: Unix time at which the attempt was over.
        attempt_s: how long the attempt ran.
        counted: whether it was counted against ``--max-restarts`` (an elastic job: the task's own budget).
        cause: a resize's ``"preemption"`` or ``"failure"``; None otherwise.
        from_workers, to_workers: an elastic job's workers before and after the restart; None otherwise.
    """

    restart: int
    why: str
    task: str
    status: str
    ended_at: float
    attempt_s: float
    counted: bool
    cause: Optional[str] = None
    from_workers: Optional[int] = None
    to_workers: Optional[int] = None

    def as_dict(self) -> Dict[str, Any]:
        """The entry of :data:`RESTARTS_ENV` (what is None left out)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


class RestartBudget:
    """Decides whether a job that ended early starts again, and records each restart.

    Args:
        max_restarts: restarts allowed after failures (and preemptions, with ``count_preemptions``).
        count_preemptions: count restarts after a preemption against ``max_restarts``. Defaults to False.
    """

    def __init__(self, max_restarts: int, *, count_preemptions: bool = False) -> None:
        self.max_restarts, self.count_preemptions = int(max_restarts), bool(count_preemptions)
        self.history: List[Restart] = []

    @property
    def counted(self) -> int:
        """Restarts counted against ``max_restarts`` so far."""
        return sum(1 for r in self.history if r.counted)

    def allows(self, why: str) -> bool:
        """Whether a job that ended for ``why`` may start again."""
        if why == "preemption" and not self.count_preemptions:
            return True
        return self.counted < self.max_restarts

    def record(self, why: str, *, task: str, status: str, attempt_s: float,
               workers: Optional[Tuple[int, int]] = None) -> Restart:
        """Notes a restart about to happen; returns it.

        Args:
            why: ``"preemption"`` or ``"failure"``: how the attempt ended.
            task, status, attempt_s: the task whose exit decided it, how it ended, how long the attempt ran.
            workers: an elastic job's ``(workers before, workers after)``; when they differ the restart is a
                ``"resize"`` caused by ``why``. Defaults to None.
        """
        resized = workers is not None and workers[0] != workers[1]
        restart = Restart(restart=len(self.history) + 1, why="resize" if resized else why, task=task, status=status,
                          ended_at=round(time.time(), 3), attempt_s=round(attempt_s, 3),
                          counted=why != "preemption" or self.count_preemptions, cause=why if resized else None,
                          from_workers=workers[0] if workers else None, to_workers=workers[1] if workers else None)
        self.history.append(restart)
        return restart

    def describe(self, restart: Restart) -> str:
        """``restart 2 (a preemption, not counted: 0 of 3 restarts used)`` for the log."""
        what = "a preemption" if restart.why == "preemption" else "a failure"
        counted = "counted" if restart.counted else "not counted"
        return f"restart {restart.restart} ({what}, {counted}: {self.counted} of {self.max_restarts} restarts used)"

    def env(self) -> Dict[str, str]:
        """``{RESTARTS_ENV: JSON}`` for the tasks of the next attempt (empty before any restart)."""
        if not self.history:
            return {}
        return {RESTARTS_ENV: json.dumps([r.as_dict() for r in self.history[-_MAX_RECORDED:]],
                                         separators=(",", ":"))}


def signals_to_forward() -> Tuple[int, ...]:
    """What the launcher catches and passes on to its tasks: SIGINT, SIGTERM, SIGHUP and the preemption signal that
    ``TFACCEL_PREEMPTION_SIGNAL`` names (SLURM's ``--signal=USR1@60`` reaches the launcher first)."""
    from tfaccel.resilience.contract import preemption_signals

    return tuple(sorted({int(signal.SIGINT), int(signal.SIGTERM), int(signal.SIGHUP), *preemption_signals()}))


def _status(returncode: Optional[int]) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def preempted_attempt(verdict: Any, commands: Sequence[Any], log: Any) -> Any:
    """The verdict of an attempt that a preemption ended (``verdict.reason`` ``"preempted"``) or that the launcher's
    own signal ended (``"interrupted"``), once every task is stopped: each command task's exit status is logged, and
    an interrupted launch whose command tasks all exited :data:`EXIT_PREEMPTED` exits with that code too, so that a
    scheduler above it can tell a preempted job (backup written at an agreed step) from a failed one.

    Args:
        verdict: the attempt's verdict (a dataclass with ``reason``, ``returncode``, ``message``).
        commands: the outcomes (``name``, ``returncode``) of the attempt's command tasks.
        log: the launcher's logger.
    """
    statuses = ", ".join(f"{o.name} {_status(o.returncode)}" for o in commands)
    every = bool(commands) and all(is_preempted(o.returncode) for o in commands)
    if verdict.reason == "preempted":
        log.warning("launch: after the preemption: %s", statuses)
        return verdict
    if not every:
        return verdict
    log.warning("launch: every task stopped at an agreed step with its backup written (%s); exiting with %d so that "
                "the job is restarted from its backup", statuses, EXIT_PREEMPTED)
    return dataclasses.replace(verdict, returncode=EXIT_PREEMPTED,
                               message=f"{verdict.message}; every task was preempted (exit code {EXIT_PREEMPTED})")
