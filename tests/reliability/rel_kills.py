"""Real kills during saves (issue 24): SIGKILL a training process at a random moment while it writes backups.

One trial: the job (scripts/rel_save_job.py: one process, ``backup_freq=1``, so it is writing a backup most of the
time) starts; once its first backup appears, it is SIGKILLed after a random delay drawn from the span in which the
reference run wrote its backups (first backup to the end of training). What the kill left in ``backup_dir`` is
classified (no backup yet, a complete backup, or a half-written one beside it), then the job is started again
without a kill. The promise: the restart exits 0, resumes from a backup it may resume from (None, or a position a
complete save had reached) and ends with the uninterrupted run's weights.
Shared by tests/reliability and scripts/reliability.py. Nothing here imports TF.
"""

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

HERE = Path(__file__).resolve().parent
JOB = HERE / "scripts" / "rel_save_job.py"
REPO_ROOT = HERE.parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from rel_scenarios import STARTED_PIDS, env_for, with_suppress_kill  # noqa: E402
from tfaccel.launch.procs import start_process  # noqa: E402

STEPS_PER_EPOCH = 10  # 320 examples, batch 32
POINTER = "tfaccel_backup.json"


class Job:
    """One run of the job: its JSON events as they arrive, bounded by a timeout, ended by PID."""

    def __init__(self, work: Path, **env: str) -> None:
        self.began = time.monotonic()
        self.first_backup = threading.Event()
        self.first_backup_at: Optional[float] = None
        self.proc = start_process([sys.executable, str(JOB)], env=env_for(env), cwd=str(work))
        STARTED_PIDS.append(self.proc.pid)
        self.events: List[tuple] = []
        self.lines: List[str] = []
        self.train_begin = threading.Event()
        self._threads = [threading.Thread(target=self._read, args=(s,), daemon=True)
                         for s in (self.proc.stdout, self.proc.stderr)]
        self._threads.append(threading.Thread(target=self._watch, args=(Path(env["KILLS_BACKUP_DIR"]),), daemon=True))
        for thread in self._threads:
            thread.start()

    def _watch(self, backup_dir: Path) -> None:
        """Notes when the first backup's pointer appears (polled every 2 ms)."""
        while self.proc.poll() is None and not (backup_dir / POINTER).exists():
            time.sleep(0.002)
        if (backup_dir / POINTER).exists():
            self.first_backup_at = time.monotonic()
            self.first_backup.set()

    def _read(self, stream: Any) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.lines.append(line)
            if line.startswith('{"event"'):
                event = json.loads(line)
                self.events.append((time.monotonic(), event))
                if event["event"] == "train_begin":
                    self.train_begin.set()
        stream.close()

    def wait(self, timeout: float) -> Optional[int]:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with_suppress_kill(self.proc.pid)
            self.proc.wait(timeout=10)
            return None
        finally:
            for thread in self._threads:
                thread.join(timeout=10)
            if self.proc.returncode is not None and self.proc.pid in STARTED_PIDS:
                # reaped by Popen.wait, so gone for sure; over a long tally this host's PIDs wrap (pid_max 32768)
                # and a later, unrelated process with the same number must not count as left behind
                STARTED_PIDS.remove(self.proc.pid)

    def event(self, name: str) -> Optional[tuple]:
        return next(((t, e) for t, e in self.events if e["event"] == name), None)

    def tail(self, n: int = 25) -> str:
        return "\n".join(line for line in self.lines[-n:] if not line.startswith(("I0000", "WARNING: All")))


def reference(work: Path, *, timeout: float = 240) -> Dict[str, Any]:
    """The uninterrupted job: its weights and how long its training took (the window kills are drawn from)."""
    work.mkdir(parents=True, exist_ok=True)
    job = Job(work, KILLS_BACKUP_DIR=str(work / "backup"), KILLS_WEIGHTS_OUT=str(work / "ref.npz"))
    rc = job.wait(timeout)
    done = job.event("done")
    ok = rc == 0 and job.first_backup_at is not None and done is not None
    return {"ok": ok, "why": "" if ok else f"reference failed (rc={rc}):\n{job.tail()}",
            "weights": str(work / "ref.npz"), "backup_span_s": round(done[0] - job.first_backup_at, 3) if ok else None,
            "backups_written": done[1]["backups_written"] if ok else None,
            "backup_writer": done[1]["backup_writer"] if ok else None}


def _what_the_kill_left(backup_dir: Path) -> Dict[str, Any]:
    """Where in a save the kill landed, read from the files it left."""
    names = sorted(os.listdir(backup_dir)) if backup_dir.exists() else None
    if names is None:
        return {"left": "training had ended (backups removed)", "files": [], "named": None}
    named = None
    if POINTER in names:
        try:
            named = json.loads((backup_dir / POINTER).read_text())["weights"]
        except (ValueError, KeyError):
            named = "<unreadable pointer>"
    stray = [n for n in names if n not in (POINTER, named) and not n.startswith(".tmp-")]
    if named is None:
        state = "no backup yet"
    elif any(n.startswith(f".tmp-{POINTER}") for n in names):
        state = "half-written pointer beside the current one"
    elif any(".tmp-" in n for n in names):
        state = "half-written weights file beside the current backup"
    elif stray and _number(stray[0]) > _number(named):
        state = "new weights complete, pointer not yet swapped"
    elif stray:
        state = "pointer swapped, previous backup not yet removed"
    else:
        state = "between saves (one complete backup)"
    return {"left": state, "files": names, "named": named}


def _number(name: str) -> int:
    digits = name.split("-", 1)[-1].split(".", 1)[0]
    return int(digits) if digits.isdigit() else -1


def trial(work: Path, ref: Dict[str, Any], *, rng: random.Random, timeout: float = 240,
          atol: float = 1e-5) -> Dict[str, Any]:
    """Kill at a random moment of training, inspect, restart, compare with the reference."""
    import numpy as np

    work.mkdir(parents=True, exist_ok=True)
    backup_dir = work / "backup"
    delay = rng.uniform(0.0, ref["backup_span_s"])
    job = Job(work, KILLS_BACKUP_DIR=str(backup_dir))
    began = time.monotonic()
    if not job.first_backup.wait(timeout):
        job.wait(1)
        return {"ok": False, "why": f"the job wrote no backup:\n{job.tail()}", "delay_s": round(delay, 3)}
    time.sleep(delay)
    finished_first = job.proc.poll() is not None
    if not finished_first:
        os.kill(job.proc.pid, signal.SIGKILL)
    job.wait(30)
    measured: Dict[str, Any] = {"delay_s": round(delay, 3), "finished_before_kill": finished_first,
                                **_what_the_kill_left(backup_dir)}
    restart = Job(work, KILLS_BACKUP_DIR=str(backup_dir), KILLS_WEIGHTS_OUT=str(work / "res.npz"))
    rc = restart.wait(timeout)
    measured["seconds"] = round(time.monotonic() - began, 1)
    done = restart.event("done")
    if rc != 0 or done is None:
        return {"ok": False, "why": f"the restart failed (rc={rc}):\n{restart.tail()}", **measured}
    resumed = done[1]["resumed_from"]
    measured["resumed_from"] = resumed
    if measured["named"] is None and resumed is not None or measured["named"] is not None and resumed is None:
        return {"ok": False, "why": f"resumed from {resumed} although the kill left {measured['left']}", **measured}
    if resumed is not None and measured["named"] != f"backup-{resumed[0] * STEPS_PER_EPOCH + resumed[1]}.weights.h5":
        return {"ok": False, "why": f"resumed from {resumed}, not the backup the pointer named", **measured}
    ref_w, res_w = np.load(ref["weights"]), np.load(work / "res.npz")
    diff = max(float(np.max(np.abs(res_w[k] - ref_w[k]))) for k in ref_w.files)
    measured["max_abs_diff"] = diff
    if diff > atol:
        return {"ok": False, "why": f"final weights differ from the uninterrupted run's by {diff:.3g}", **measured}
    measured["restart_writer"] = done[1]["backup_writer"]
    if backup_dir.exists():
        return {"ok": False, "why": "backup_dir was not removed after training completed", **measured}
    return {"ok": True, "why": "", **measured}


def tally(results: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Counts of outcomes and of what the kills left behind."""
    left: Dict[str, int] = {}
    for r in results:
        left[r.get("left", "?")] = left.get(r.get("left", "?"), 0) + 1
    return {"runs": len(results), "ok": sum(1 for r in results if r["ok"]), "left_by_kill": left,
            "resumed_from_start": sum(1 for r in results if r["ok"] and r.get("resumed_from") is None),
            "finished_before_kill": sum(1 for r in results if r.get("finished_before_kill"))}
