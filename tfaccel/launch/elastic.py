"""Elastic local jobs: ``tfaccel launch --workers MIN:MAX``.

The job starts on MAX workers (or on the capacity a scheduler gives, never more than MAX). When a worker fails it
is brought back, with the whole job restarted from the last backup, up to ``max_restarts`` times; a worker whose
restarts are spent cannot be brought back, and the job restarts on the workers it has, as long as they are at
least MIN. With a capacity file (a number of workers a scheduler, or a person, writes), every restart starts as
many workers as it says (MIN..MAX): the job shrinks when it falls and grows back when capacity returns, at the
next restart. Every task of an elastic job sees ``TFACCEL_ELASTIC=MIN:MAX`` (tfaccel's ``fit`` then checks, before
training, that the global batch splits evenly over every size) and, after a change of size, why and from how
many (``TFACCEL_RESIZE_REASON``, ``TFACCEL_RESIZE_FROM``). The tasks record each change with the step it
happened at (``FitResult.details["world_size"]``); the launcher logs it.

A preempted attempt (a task exited ``tfaccel.EXIT_PREEMPTED``, 75: every task stopped at an agreed step, the backup
written there) restarts from that backup without counting against any worker's ``max_restarts`` (unless
``count_preemptions``), on the same workers or on what the capacity file offers then. One record of the job's
restarts (:class:`tfaccel.launch.restarts.RestartBudget`) is kept over every attempt and handed to each
(``TFACCEL_RESTARTS``): ``FitResult.details["restarts"]`` lists every restart, numbered over the whole job, with
why (``"failure"``, ``"preemption"``, or ``"resize"`` with the workers before and after).

Each attempt is one :func:`tfaccel.launch.local.run_local` launch on fresh ports, or (``backend="ray"``) one
:func:`tfaccel.launch.ray.run_ray` run of that many Ray Train workers, never restarted by itself: Ray Train 2.60's
``ScalingConfig`` has no elastic path for TensorFlow, so a Ray job changes size by a restart too (all attempts
under one run name, so a backup kept in the run's storage is found again). Per-host mode has no
launcher that sees every host: a scheduler does the same by starting ``tfaccel launch --cluster FILE --task
NAME`` on the hosts it has, with a cluster file of that many workers, ``TFACCEL_ELASTIC=MIN:MAX`` in every task's
environment and the same ``backup_dir``.
"""

import dataclasses
import os
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from tfaccel.errors import ConfigError
from tfaccel.job_id import launch_job_id, new_job_id
from tfaccel.launch.outcome import LaunchResult
from tfaccel.launch.restarts import NOT_RESTARTED, RestartBudget
from tfaccel.log import get_logger
from tfaccel.resilience.contract import ELASTIC_ENV, RESIZE_FROM_ENV, RESIZE_REASON_ENV, parse_workers_range

__all__ = ["ElasticState", "read_capacity", "run_elastic", "parse_workers_range"]


def read_capacity(path: str) -> int:
    """The number of workers a capacity file offers now (one integer).

    Raises:
        ConfigError: the file is missing or does not hold a non-negative integer (names the file and the text).
    """
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read(200)
    except OSError as exc:
        raise ConfigError(f"--capacity-file {path}: cannot be read ({exc.strerror}); write the number of workers "
                          "available into it, e.g. `echo 3 > FILE`") from exc
    try:
        value = int(text.strip())
        if value < 0:
            raise ValueError(value)
    except ValueError as exc:
        raise ConfigError(f"--capacity-file {path}: expected one integer >= 0 (the workers available now); "
                          f"received {text.strip()[:40]!r}") from exc
    return value


@dataclasses.dataclass
class ElasticState:
    """Which worker slots a job has, how often each failed, and every change of size.

    Slot ``k`` is a place for one worker (a machine); an attempt of ``n`` workers runs slots ``slots[0..n-1]`` as
    ``worker:0..n-1``.

    Raises:
        ConfigError: the capacity file cannot be read, or offers fewer workers than MIN at the start.
    """

    min_workers: int
    max_workers: int
    max_restarts: int
    capacity_file: Optional[str] = None
    count_preemptions: bool = False
    slots: List[int] = dataclasses.field(default_factory=list)
    failures: Dict[int, int] = dataclasses.field(default_factory=dict)
    unblamed: int = 0
    changes: List[Dict[str, Any]] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self.slots = list(range(self._offered(self.max_workers)))
        if self.size < self.min_workers:
            raise ConfigError(f"--capacity-file {self.capacity_file}: offers {self.size} workers, fewer than the "
                              f"minimum {self.min_workers} of --workers {self.min_workers}:{self.max_workers}")

    def _offered(self, have: int) -> int:
        """Workers to start: what the capacity file offers (at most MAX), else the slots still usable."""
        return min(self.max_workers, read_capacity(self.capacity_file)) if self.capacity_file else have

    @property
    def size(self) -> int:
        return len(self.slots)

    def _blame(self, task: Optional[str], what: str) -> Optional[str]:
        """Counts a failure of ``task`` (it ``what``: "failed") against its slot; why that slot is left out now, or
        None."""
        index = int(task.split(":")[1]) if task and task.startswith("worker:") else -1
        slot = self.slots[index] if 0 <= index < self.size else None
        if slot is None:
            self.unblamed += 1
            return None
        self.failures[slot] = self.failures.get(slot, 0) + 1
        if self.failures[slot] <= self.max_restarts:
            return None
        self.slots.remove(slot)
        return f"{task} {what} and its restarts are spent ({self.max_restarts})"

    def after_failure(self, task: Optional[str], *, preempted: bool = False) -> Tuple[Optional[str], str]:
        """Counts a failure of ``task`` (``"worker:1"``, or None when no worker is to blame) and picks the next
        size; returns (why the size changes, or None; why not to restart, or "").

        A preemption (``preempted``: the task exited 75, its backup written) is counted only with
        ``count_preemptions``; otherwise it blames nobody: the job restarts on the same workers, or on what the
        capacity file offers now.
        """
        before = self.size
        counted = not preempted or self.count_preemptions
        why = self._blame(task, "was preempted" if preempted else "failed") if counted else None
        failures = sum(self.failures.values()) + self.unblamed
        if failures > (self.max_restarts + 1) * self.max_workers:
            return why, f"{failures} failures, more than the workers' restarts allow"
        if self.capacity_file:
            offered = self._offered(self.size)
            self.slots = (self.slots + [s for s in range(self.max_workers) if s not in self.slots])[:offered]
            why = f"{self.capacity_file} offers {offered} workers" + (f"; {why}" if why else "")
        if self.size < self.min_workers:
            return why, f"{self.size} worker(s) left ({why}), fewer than the minimum of {self.min_workers}"
        return (why if self.size != before else None), ""


def run_elastic(cmd: Any, *, workers: Tuple[int, int], max_restarts: int = 0, capacity_file: Optional[str] = None,
                timeout: Optional[float] = None, env: Optional[Mapping[str, str]] = None, backend: str = "tf",
                count_preemptions: bool = False, **options: Any) -> LaunchResult:
    """Runs an elastic job (see the module doc): restarts from the last backup on the workers it has.

    Args:
        cmd: the command (argv or string), or (``backend="tf"``) a picklable callable, as for ``run_local``.
        workers: ``(MIN, MAX)`` workers.
        max_restarts: how many times each worker may fail and be brought back. Defaults to 0.
        capacity_file: a file holding the number of workers available, read at every (re)start. Defaults to None.
        timeout: bound on the whole run in seconds, restarts included. Defaults to None.
        env: extra environment for every task. Defaults to None.
        backend: ``"tf"`` (each attempt a ``run_local`` cluster on this machine) or ``"ray"`` (each attempt a
            ``run_ray`` run of that many Ray Train workers, all under one run name). Defaults to "tf".
        count_preemptions: count a preemption (a task exited 75) against that task's ``max_restarts``; otherwise
            it restarts the job from its backup, uncounted. Defaults to False.
        **options: more options of ``run_local`` or ``run_ray`` (grace, echo, capture_lines, network, ...).

    Returns:
        A ``LaunchResult`` over every attempt; ``message`` names the world size it ended on.

    Raises:
        ConfigError: a bad range or backend, an unreadable capacity file, or fewer workers offered than MIN at
            the start.
    """
    low, high = parse_workers_range(f"{workers[0]}:{workers[1]}")
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ConfigError(f"max_restarts: must be an integer >= 0; received {max_restarts!r}")
    # One job id for every attempt (the backup's owner stays the same job), as run_local keeps it across restarts.
    options["job_id"] = launch_job_id(options.get("job_id"), {**os.environ, **(env or {})},
                                      lambda: new_job_id(f"elastic-{backend}"))
    launch = _launcher(cmd, backend, options)
    state = ElasticState(low, high, max_restarts, capacity_file, count_preemptions)
    # One record of the job's restarts over every attempt, handed to each (TFACCEL_RESTARTS): the attempts never
    # restart by themselves, so every restart, a preemption's included, is decided and numbered here.
    record = RestartBudget(max_restarts, count_preemptions=count_preemptions)
    log, began, results, sizes = get_logger(), time.monotonic(), [], []
    child_env, resized = {**(env or {}), ELASTIC_ENV: f"{low}:{high}"}, {}
    while True:
        left = None if timeout is None else timeout - (time.monotonic() - began)
        if left is not None and left <= 0:
            break
        log.info("launch: elastic attempt %d on %d worker(s) (--workers %d:%d)", len(results) + 1, state.size, low,
                 high)
        sizes.append(state.size)
        results.append(launch(state.size, {**child_env, **resized}, left, record))
        if results[-1].reason in NOT_RESTARTED:
            break
        before = state.size
        restart, why = _next_attempt(state, record, results[-1])
        if not restart:
            break
        if why:
            resized = {RESIZE_REASON_ENV: why, RESIZE_FROM_ENV: str(before)}
    return _combined(results, sizes)


def _next_attempt(state: ElasticState, record: RestartBudget, result: LaunchResult) -> Tuple[bool, Optional[str]]:
    """After an attempt that ended early: counts it (a preemption only with ``count_preemptions``), picks the next
    size, logs and records the restart; returns (restart?, why the size changes or None)."""
    log = get_logger()
    cause = "preemption" if result.reason == "preempted" else "failure"
    before = state.size
    why, stop = state.after_failure(result.failed_task, preempted=cause == "preemption")
    if why:
        state.changes.append({"from": before, "to": state.size, "after": result.failed_task, "reason": why})
        log.warning("launch: elastic: world size %d -> %d (%s); restarting from the last backup", before,
                    state.size, why)
    if stop:
        log.error("launch: elastic: not restarting: %s", stop)
        return False, why
    restart = record.record(cause, task=result.failed_task or "?", status=result.message, attempt_s=result.elapsed,
                            workers=(before, state.size))
    if cause == "preemption":
        log.warning("launch: elastic: restart %d after a preemption (%s against --max-restarts): from the backup on "
                    "%d worker(s)", restart.restart, "counted" if restart.counted else "not counted", state.size)
    return True, why


def _launcher(cmd: Any, backend: str, options: Dict[str, Any]) -> Callable[..., LaunchResult]:
    """``(workers, env, timeout, record) -> LaunchResult``: one attempt on ``backend``, never restarted by itself,
    its tasks given the job's restart record."""
    if backend == "ray":
        from tfaccel.launch import run_ray

        # One run name for every attempt: a job that keeps its backup in the run's storage finds it again.
        options = {"name": f"tfaccel-elastic-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}", **options}
        return lambda size, env, left, record: run_ray(cmd, workers=size, max_restarts=0, timeout=left, env=env,
                                                       record=record, **options)
    if backend != "tf":
        raise ConfigError(f"backend: elastic jobs run on 'tf' (a local cluster) or 'ray'; received {backend!r}")
    from tfaccel.launch import run_local

    return lambda size, env, left, record: run_local(cmd, workers=size, max_restarts=0, timeout=left, env=env,
                                                     record=record, **options)


def _combined(results: List[LaunchResult], sizes: List[int]) -> LaunchResult:
    last = results[-1]
    attempts = [outcomes for result in results for outcomes in (result.attempts or [result.tasks])]
    changes = [b for a, b in zip(sizes, sizes[1:]) if a != b]
    message = (f"{last.message}; elastic: ended on {sizes[-1]} worker(s)"
               + (f" (world size {' -> '.join(str(n) for n in [sizes[0]] + changes)})" if changes else ""))
    return dataclasses.replace(last, restarts=len(results) - 1 + sum(r.restarts for r in results), attempts=attempts,
                               message=message, elapsed=sum(r.elapsed for r in results))
