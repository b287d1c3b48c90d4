"""Running `tfaccel doctor` as a user does (a real CLI process and its children), for the doctor's CLI tests."""

import subprocess
import sys
from pathlib import Path
from typing import List, Mapping, Optional

HERE = Path(__file__).resolve().parent
SCRIPT = str(HERE / "train.py")
HUB_SCRIPT = str(HERE / "hub_train.py")
CTL_SCRIPT = str(HERE / "ctl.py")
CRASH_LINE = Path(SCRIPT).read_text().splitlines().index('    raise RuntimeError("planted crash")') + 1


RUN_TIMEOUT_S = 120  # the doctor's --timeout for each of its runs: it ends its children (and a launch's workers)


def run_doctor(*args: str, timeout: float = 2 * RUN_TIMEOUT_S + 60,
               env: Optional[Mapping[str, str]] = None) -> subprocess.CompletedProcess:
    """``tfaccel doctor --timeout 120 ARGS``; the doctor bounds each run itself, this call the whole.

    Args:
        env: the CLI's environment (default: this process's).
    """
    return subprocess.run([sys.executable, "-m", "tfaccel", "doctor", "--timeout", str(RUN_TIMEOUT_S), *args],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout,
                          env=None if env is None else dict(env))


def error_line(done: subprocess.CompletedProcess) -> str:
    """The one line a bad input ends with (exit 2, nothing else on stderr)."""
    lines: List[str] = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, (done.returncode, done.stderr)
    return lines[0]
