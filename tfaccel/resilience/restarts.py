"""``FitResult.details["restarts"]``: each restart of the job, why, from which (epoch, step), what it lost.

Two sources, each saying what it knows:

* the launcher (``tfaccel launch``) passes every attempt after the first ``TFACCEL_RESTARTS``: one entry per restart
  so far, with why (``"preemption"``, ``"failure"``, or in an elastic job ``"resize"`` with its ``cause`` and the
  ``from_workers`` / ``to_workers``), the task whose exit decided it, and when the attempt ended;
* the chief keeps two small files in ``backup_dir``: ``tfaccel_progress.json`` (the position training reached,
  written at most once a second) and ``tfaccel_restarts.json`` (each attempt's resume position, time, and the
  progress the attempt before it had reached), each written atomically (:mod:`tfaccel.resilience.atomic_io`). Both are
  removed with the backup when training completes.

Steps lost: the position the previous attempt had reached minus the one this attempt resumed from. After a
preemption (a resize caused by one too) both are the agreed step (0 lost); after a failure the progress may lag
the real position by up to a second of steps, so the number is a lower bound (``steps_lost_at_least``). Seconds
lost: from the writing of the
backup resumed from to this attempt's start (training redone plus the restart itself); from the previous attempt's
start when there was no backup.
"""

import json
import os
import time
from typing import Any, Dict, List, Optional, Tuple

from tfaccel.errors import ConfigError
from tfaccel.log import get_logger
from tfaccel.resilience.atomic_io import atomic_write_json

__all__ = ["RESTARTS_ENV", "PROGRESS_FILE", "RECORD_FILE", "launcher_restarts", "Progress", "restarts_details"]

RESTARTS_ENV = "TFACCEL_RESTARTS"  # the name tfaccel.launch.restarts writes
PROGRESS_FILE = "tfaccel_progress.json"
RECORD_FILE = "tfaccel_restarts.json"
_PROGRESS_EVERY_S = 1.0
_KEYS = ("restart", "why", "task", "status", "ended_at", "attempt_s")
_ELASTIC_KEYS = ("cause", "from_workers", "to_workers")  # an elastic job's entries (a resize's cause)


def launcher_restarts() -> List[Dict[str, Any]]:
    """The launcher's record of this job's restarts (``TFACCEL_RESTARTS``), [] when it names none.

    Raises:
        ConfigError: the variable is not the JSON list the launcher writes (what was received is shown).
    """
    raw = os.environ.get(RESTARTS_ENV, "").strip()
    if not raw:
        return []
    try:
        entries = json.loads(raw)
        ok = isinstance(entries, list) and all(isinstance(e, dict) and all(k in e for k in _KEYS) for e in entries)
    except ValueError:
        ok = False
    if not ok:
        raise ConfigError(f"{RESTARTS_ENV} must be the JSON list tfaccel launch writes (objects with "
                          f"{', '.join(_KEYS)}); received {raw[:200]!r}. Unset it: only the launcher sets it")
    return entries


def _read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


class Progress:
    """The chief's note of how far training got, in ``backup_dir`` (at most once a second)."""

    def __init__(self, backup_dir: Optional[str], *, is_chief: bool, steps_per_epoch: int) -> None:
        self.path = os.path.join(backup_dir, PROGRESS_FILE) if backup_dir and is_chief else None
        self.steps_per_epoch = steps_per_epoch
        self._last = 0.0

    def note(self, epoch: int, step: int, *, force: bool = False) -> None:
        """Records that training reached (epoch, step)."""
        now = time.monotonic()
        if self.path is None or (not force and now - self._last < _PROGRESS_EVERY_S):
            return
        self._last = now
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        atomic_write_json(self.path, {"epoch": epoch, "step": step, "at": round(time.time(), 3),
                                      "global_step": epoch * self.steps_per_epoch + step})


def _global(position: Optional[Tuple[int, int]], steps_per_epoch: int) -> int:
    return 0 if position is None else position[0] * steps_per_epoch + position[1]


def restarts_details(backup_dir: Optional[str], *, resumed_from: Optional[Tuple[int, int]], backup: Any,
                     steps_per_epoch: int, is_chief: bool) -> List[Dict[str, Any]]:
    """Each restart of this job so far (the launcher's record joined with the chief's), [] on a first attempt.

    Call it before training writes progress: the progress file then still holds the previous attempt's.

    Args:
        backup_dir: the job's backup_dir (None: positions and steps lost are unknown).
        resumed_from: where this attempt resumes, (epoch, step), or None (from the start).
        backup: the ``BackupState`` resumed from (its job record says when it was written), or None.
        steps_per_epoch: for global step numbers.
        is_chief: this process appends this attempt to the record.
    """
    entries = launcher_restarts()
    if not entries:
        return []
    now = time.time()
    record = (_read_json(os.path.join(backup_dir, RECORD_FILE)) if backup_dir else None) or []
    record = [r for r in record if isinstance(r, dict) and r.get("restart") != entries[-1]["restart"]]
    reached = _read_json(os.path.join(backup_dir, PROGRESS_FILE)) if backup_dir else None
    written_at = (backup or {}).get("job", {}).get("written_at") if backup else None
    record.append({"restart": entries[-1]["restart"], "resumed_from": list(resumed_from) if resumed_from else None,
                   "resumed_global_step": _global(resumed_from, steps_per_epoch), "started_at": round(now, 3),
                   "reached": reached if isinstance(reached, dict) else None, "backup_written_at": written_at})
    if backup_dir and is_chief:
        os.makedirs(backup_dir, exist_ok=True)
        atomic_write_json(os.path.join(backup_dir, RECORD_FILE), record)
    mine = {r["restart"]: r for r in record}
    return [_join(entry, mine.get(entry["restart"])) for entry in entries]


def _join(entry: Dict[str, Any], attempt: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """One restart as ``details["restarts"]`` reports it."""
    out = {k: entry[k] for k in ("restart", "why", "task", "status", *_ELASTIC_KEYS) if k in entry}
    if attempt is None:  # this restart's attempt wrote no record (no backup_dir, or it ended before training)
        return {**out, "resumed_from": None, "steps_lost": None, "seconds_lost": None}
    out["resumed_from"] = attempt["resumed_from"]
    reached = attempt.get("reached")
    lost = None if not reached else max(0, int(reached["global_step"]) - int(attempt["resumed_global_step"]))
    preempted = entry.get("cause", entry["why"]) == "preemption"
    if preempted and attempt["resumed_from"] is not None:
        out["steps_lost"] = lost if lost is not None else 0  # the backup is the agreed stop
    else:
        out["steps_lost_at_least"] = lost
    since = attempt.get("backup_written_at") or (float(entry["ended_at"]) - float(entry["attempt_s"]))
    out["seconds_lost"] = round(float(attempt["started_at"]) - float(since), 2)
    if lost is None and not preempted:
        get_logger().debug("restart %s: steps lost unknown (no progress recorded before it)", entry["restart"])
    return out
