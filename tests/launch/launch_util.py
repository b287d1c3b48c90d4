"""Helpers for the launcher tests: run `tfaccel launch` as a real process and track every PID it starts."""

import contextlib
import logging
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import harness
from tfaccel.launch.procs import pid_alive, start_process, terminate

SCRIPTS = Path(__file__).resolve().parent / "scripts"
_STARTED_RE = re.compile(r"started (\w+:\d+) pid=(\d+)")


def launcher_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The environment of a launcher process: this one's (no TF_CONFIG), quiet 2-core settings, repo on path."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(harness.CHILD_ENV)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(harness.REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


def track(pids: Sequence[int]) -> None:
    """Hands PIDs to the autouse fixture that fails a test leaving any of them alive."""
    harness.STARTED_PIDS.extend(int(p) for p in pids)


class Launcher:
    """`python -m tfaccel launch ARGS` as a process; collects its output lines and the task PIDs it logs."""

    def __init__(self, *args: str, env: Optional[Dict[str, str]] = None) -> None:
        self.args = list(args)
        self.proc = start_process([sys.executable, "-m", "tfaccel", "launch", *args], env=launcher_env(env),
                                  cwd=str(harness.REPO_ROOT))
        track([self.proc.pid])
        self.out: List[str] = []
        self.err: List[str] = []
        self.task_pids: Dict[str, List[int]] = {}
        self._threads = [threading.Thread(target=self._read, args=(self.proc.stdout, self.out), daemon=True),
                         threading.Thread(target=self._read, args=(self.proc.stderr, self.err), daemon=True)]
        for thread in self._threads:
            thread.start()

    def _read(self, stream, sink: List[str]) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace")
            match = _STARTED_RE.search(line)
            if match and sink is self.err:
                self.task_pids.setdefault(match.group(1), []).append(int(match.group(2)))
                track([int(match.group(2))])
            sink.append(line)
        stream.close()

    @property
    def stdout(self) -> str:
        return "".join(self.out)

    @property
    def stderr(self) -> str:
        return "".join(self.err)

    def all_pids(self) -> List[int]:
        return [self.proc.pid] + [pid for pids in self.task_pids.values() for pid in pids]

    def wait_for(self, pattern: str, *, stream: str = "stdout", timeout: float = 120.0) -> "re.Match":
        """Waits until a line of the launcher's stdout/stderr matches ``pattern``."""
        regex = re.compile(pattern)
        lines = self.out if stream == "stdout" else self.err
        deadline = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < deadline:
            while seen < len(lines):
                match = regex.search(lines[seen])
                seen += 1
                if match:
                    return match
            if self.proc.poll() is not None and seen >= len(lines):
                time.sleep(0.2)  # the readers may still be draining
                if seen >= len(lines):
                    break
            time.sleep(0.05)
        raise AssertionError(f"no line matching {pattern!r} in {stream}\nSTDOUT:\n{self.stdout[-3000:]}\n"
                             f"STDERR:\n{self.stderr[-3000:]}")

    def wait(self, timeout: float = 120.0) -> int:
        """Waits for the launcher to exit; kills it (and fails) when it does not within ``timeout``."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.close()
            raise AssertionError(f"launcher still running after {timeout} s\nSTDOUT:\n{self.stdout[-3000:]}\n"
                                 f"STDERR:\n{self.stderr[-3000:]}") from None
        for thread in self._threads:
            thread.join(timeout=10)
        return rc

    def close(self) -> None:
        terminate([self.proc], grace=5)
        for pid in self.all_pids():  # a test that failed midway must still leave nothing behind
            if pid_alive(pid):
                try:
                    os.killpg(pid, 9)
                except OSError:
                    pass

    def __enter__(self) -> "Launcher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def wait_gone(pids: Sequence[int], timeout: float = 10.0) -> List[int]:
    """PIDs still alive after ``timeout`` seconds (reaped children and exited orphans count as gone)."""
    deadline = time.monotonic() + timeout
    alive = [p for p in pids if pid_alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in alive if pid_alive(p)]
    return alive


@contextlib.contextmanager
def kept_log(keep: Callable[[logging.LogRecord], Any] = logging.LogRecord.getMessage) -> Iterator[list]:
    """What the tfaccel logger emits (INFO and up) while the block runs, each record passed through ``keep``."""
    kept: list = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            kept.append(keep(record))

    logger, handler = logging.getLogger("tfaccel"), _Keep(level=logging.DEBUG)
    old = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield kept
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)


def run_tracked(launch: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``launch(*args, **kwargs)`` (run_local, run_elastic, ...) bounded at 60 s with a 2 s grace, every PID it
    started handed to the no-leftover fixture, and none of them alive 5 s after it returned."""
    kwargs.setdefault("timeout", 60)
    kwargs.setdefault("grace", 2)
    result = launch(*args, **kwargs)
    track(result.pids)
    assert not wait_gone(result.pids, timeout=5), f"a task outlived {launch.__name__}"
    return result
