"""The two-strategies order of issue 13 under ``tfaccel launch --workers 2``: one bounded run, or a tally.

``strategies_two_strategies_program.py`` does what the TF multi-worker tutorial does (the strategy first, then
the dataset, then training with ``strategy="auto"``). ``run_once`` launches it on a 2-worker loopback cluster
with a time bound and classifies the run: ``completed`` (both workers printed their result and the launcher
exited 0), ``hung`` (the launcher's ``--timeout`` ended it: exit 124) or ``failed``. Shared by
tests/strategies/test_strategies_cache.py (one run) and scripts/two_strategies_runs.py (a counted series).
"""

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

if str(Path(__file__).resolve().parents[1]) not in sys.path:  # tests/ (the harness), for scripts/ too
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import CHILD_ENV  # noqa: E402  (quiet, small, 2-core-friendly tasks)
from tfaccel.launch.procs import pid_alive, start_process, terminate  # noqa: E402

PROGRAM = Path(__file__).resolve().with_name("strategies_two_strategies_program.py")
REPO_ROOT = Path(__file__).resolve().parents[2]
ROUTES = ("compile_and_fit", "scope_fit")
_STARTED_RE = re.compile(r"started (\w+:\d+) pid=(\d+)")
_REPORT_RE = re.compile(r"^\[worker (\d+)\] (\{.*\})\s*$")


@dataclasses.dataclass
class RunOutcome:
    """One launch: ``status`` is ``completed``, ``hung`` or ``failed``; ``reports`` the workers' JSON lines."""

    status: str
    seconds: float
    returncode: Optional[int]
    reports: Dict[int, dict]
    task_pids: List[int]
    stderr: str

    def describe(self) -> str:
        """One line for a tally, plus the launcher's last lines when the run did not complete."""
        line = f"{self.status} in {self.seconds:.1f} s (exit {self.returncode})"
        if self.status != "completed":
            line += "\n" + "\n".join(self.stderr.strip().splitlines()[-15:])
        return line


def _env(extra: Optional[Dict[str, str]]) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(CHILD_ENV)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


def _reports(stdout: str) -> Dict[int, dict]:
    out = {}
    for line in stdout.splitlines():
        match = _REPORT_RE.match(line)
        if match:
            try:
                out[int(match.group(1))] = json.loads(match.group(2))
            except ValueError:
                continue
    return out


def _end_survivors(pids: Sequence[int]) -> None:
    """Task processes the launcher did not reap (it was itself killed) are ended by PID."""
    for pid in pids:
        if pid_alive(pid):
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass


def run_once(*, route: str = "compile_and_fit", timeout: float = 120.0, epochs: int = 2,
             env: Optional[Dict[str, str]] = None, track: Callable[[List[int]], None] = lambda pids: None
             ) -> RunOutcome:
    """Launches the two-strategies program on 2 workers, bounded by ``timeout`` seconds.

    Args:
        route: ``compile_and_fit`` or ``scope_fit`` (``tfaccel.scope()`` + ``tfaccel.fit``).
        timeout: the launcher's ``--timeout``; the launcher itself is ended 30 s later at the latest.
        epochs: epochs each worker trains.
        env: extra environment for the launcher and its tasks.
        track: called with every PID started (the launcher's, then its tasks'), for leftover checks.

    Returns:
        The ``RunOutcome``.
    """
    if route not in ROUTES:
        raise ValueError(f"route must be one of {ROUTES}; received {route!r}")
    cmd = [sys.executable, "-m", "tfaccel", "launch", "--workers", "2", "--timeout", f"{timeout:g}", "--grace", "3",
           "--", sys.executable, str(PROGRAM), "--route", route, "--epochs", str(epochs)]
    began = time.monotonic()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = start_process(cmd, env=_env(env), cwd=str(REPO_ROOT), stdout=out, stderr=err)
        track([proc.pid])
        try:
            returncode: Optional[int] = proc.wait(timeout=timeout + 30)
        except subprocess.TimeoutExpired:
            returncode = None
        finally:
            terminate([proc], grace=5)
        seconds = time.monotonic() - began
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    pids = [int(m.group(2)) for m in _STARTED_RE.finditer(stderr)]
    track(pids)
    _end_survivors(pids)
    reports = _reports(stdout)
    if returncode == 0 and sorted(reports) == [0, 1] and all(r.get("ok") for r in reports.values()):
        status = "completed"
    elif returncode in (124, None):
        status = "hung"
    else:
        status = "failed"
    return RunOutcome(status, seconds, returncode, reports, pids, stderr)


def tally(runs: int, *, route: str = "compile_and_fit", timeout: float = 120.0,
          on_run: Callable[[int, RunOutcome], None] = lambda index, outcome: None) -> Dict[str, int]:
    """Runs ``runs`` launches one after the other; returns ``{"completed": n, "hung": n, "failed": n}``."""
    counts = {"completed": 0, "hung": 0, "failed": 0}
    for index in range(runs):
        outcome = run_once(route=route, timeout=timeout)
        counts[outcome.status] += 1
        on_run(index, outcome)
    return counts
