"""What a launch is made of and what it ends with: the tasks it starts, each task's outcome, the launch's result,
and how an exit status reads (128 + N for a process killed by signal N, like a shell)."""

import dataclasses
import signal
from typing import Any, List, Mapping, Optional, Tuple

__all__ = ["LaunchTask", "TaskOutcome", "LaunchResult", "exit_code", "describe_returncode", "EXIT_TIMEOUT",
           "EXIT_UNREACHABLE"]

EXIT_TIMEOUT = 124  # like coreutils timeout(1)
EXIT_UNREACHABLE = 1


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
        reason: ``"ok"``, ``"failed"``, ``"config"`` (a task exited 2, a configuration error: never restarted),
            ``"preempted"``, ``"timeout"``, ``"interrupted"`` or ``"unreachable"``.
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
