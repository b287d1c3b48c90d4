"""The pause a backup causes in the step loop, synchronous against asynchronous (``scripts/backup_pause.py``).

One model trains step by step (``train_on_batch``); every ``steps_between`` steps the backup callback fit uses
(:class:`tfaccel.resilience.backups.StepBackup`) backs it up, and the time its ``save`` blocks the loop is the pause.
Synchronous (``TFACCEL_ASYNC_BACKUP=0``, today's file written from the live variables) and asynchronous (a snapshot in
the loop, the file written by a thread) run in turn on the same model. The steps that ran while a write was in flight
are timed apart: on a machine with few cores the writer thread takes CPU from training, a cost the pause leaves out.
"""

import os
import statistics
import time
from typing import Any, Dict, List

from tfaccel.resilience.backup_writer import BackupWriter
from tfaccel.resilience.backups import StepBackup, remove_backup

__all__ = ["measure_pause", "compare_modes"]


def measure_pause(model: Any, x: Any, y: Any, *, backup_dir: str, asynchronous: bool, backups: int = 4,
                  steps_between: int = 3) -> Dict[str, Any]:
    """Trains ``backups * steps_between`` steps on the batch ``(x, y)``, backing up every ``steps_between``.

    Returns:
        ``pause_s`` (median time ``save`` blocked the loop), each pause and the part of it spent waiting for the
        previous write, ``pause_without_wait_s`` (the snapshot alone, asynchronous), ``step_s`` (median step with no write in
        flight), ``step_s_during_write``, ``write_s`` (mean background write), ``waited`` (backups that waited for
        the previous write) and the backup's size on disk.
    """
    writer = BackupWriter(asynchronous=asynchronous)
    callback = StepBackup(backup_dir, save_freq=None, is_chief=True, steps_per_epoch=10 ** 9, writer=writer)
    callback.set_model(model)
    pauses: List[float] = []
    waits: List[float] = []
    idle: List[float] = []
    busy: List[float] = []
    step = 0
    for _ in range(backups):
        for _ in range(steps_between):
            writing = writer.pending
            began = time.perf_counter()
            model.train_on_batch(x, y)
            (busy if writing else idle).append(time.perf_counter() - began)
            step += 1
        began, waited = time.perf_counter(), writer.wait_seconds
        callback.save(0, step)
        pauses.append(time.perf_counter() - began)
        waits.append(writer.wait_seconds - waited)
    writer.wait()
    size = sum(os.path.getsize(os.path.join(backup_dir, n)) for n in os.listdir(backup_dir))
    remove_backup(backup_dir)
    return {"mode": writer.details()["mode"], "pause_s": statistics.median(pauses),
            "pauses_s": [round(p, 3) for p in pauses], "of_which_waiting_s": [round(w, 3) for w in waits],
            "pause_without_wait_s": statistics.median(p - w for p, w in zip(pauses, waits)), "step_s": statistics.median(idle) if idle else None,
            "step_s_during_write": statistics.median(busy) if busy else None,
            "write_s": writer.write_seconds / backups, "waited": writer.waits, "backup_bytes": size}


def compare_modes(model: Any, x: Any, y: Any, *, backup_dir: str, backups: int = 4,
                  steps_between: int = 3) -> Dict[str, Any]:
    """Synchronous (today's save), asynchronous, then synchronous again, on one model; the ratio of the pauses.

    The second synchronous run saves after the asynchronous one filled Keras' skip-set cache
    (``tfaccel.compat.keras_weights_snapshot``), which makes ``save_weights`` itself faster.
    """
    model.train_on_batch(x, y)  # traced, and the optimizer's state built
    runs = {name: measure_pause(model, x, y, backup_dir=backup_dir, asynchronous=asynchronous, backups=backups,
                                steps_between=steps_between)
            for name, asynchronous in (("sync", False), ("async", True), ("sync_cached", False))}
    runs["async_over_sync"] = runs["async"]["pause_s"] / runs["sync"]["pause_s"]
    runs["async_over_sync_cached"] = runs["async"]["pause_s"] / runs["sync_cached"]["pause_s"]
    return runs
