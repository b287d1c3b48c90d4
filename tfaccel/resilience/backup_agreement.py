"""Every worker of a multi_worker job resumes from the chief's backup, or none does.

Under ``multi_worker`` each worker reads ``backup_dir`` and loads the backup's files itself: the strategy broadcasts a
variable's value when the variable is created, not what a worker assigns to it later. A worker that read another
backup than the chief's, or none, trains from other weights at another step: its collectives no longer match the
chief's (``InternalError: Collective instance 108 expected type 1 and data_type 1 but got type 0 and data_type 9``
from TensorFlow, seen here), or, where they happen to match, the all-reduced gradients update different models.
Two ways to get there:

* ``backup_dir`` is not one shared directory (each host its own disk): only the chief's holds the backup;
* a ``fit`` that ended with an error, then ``fit`` again in the same processes: each worker waits for its own
  writes before the error goes on, not for the chief's pointer, so a worker may read ``backup_dir`` before the
  chief's last backup is named there.

So every worker calls :func:`agree_with_chief` with what it read, before loading anything: one sum over the
workers gives each the chief's position; a worker whose read differs reads ``backup_dir`` once more; a second sum
counts the workers that still differ, and if any does, every worker stops with the same error (none can take the
chief's weights from a broadcast, as Horovod's ranks do).
"""

from typing import Any, Callable, List, Mapping, Optional

from tfaccel.errors import ConfigError
from tfaccel.resilience.shard_backup import SHARDS_FIELD

__all__ = ["backup_position", "agree_with_chief"]


def backup_position(state: Optional[Mapping[str, Any]]) -> List[int]:
    """[has a backup, epoch, step, global step, sharded optimizer state] of a ``BackupState`` (or None)."""
    return ([1, int(state["epoch"]), int(state["step"]), int(state.get("global_step", 0)),
             int(bool((state.get(SHARDS_FIELD) or {}).get("files")))] if state else [0, 0, 0, 0, 0])


def _describe(position: List[int]) -> str:
    return f"the backup at epoch {position[1]}, step {position[2]}" if position[0] else "no backup"


def agree_with_chief(state: Optional[Mapping[str, Any]], reread: Optional[Callable[[], Any]], *,
                     total: Callable[[List[float]], List[float]], is_chief: bool,
                     workers: int) -> Optional[Mapping[str, Any]]:
    """The backup this worker resumes from: the chief's (module doc). Every worker calls it at the same point.

    Args:
        state: the ``BackupState`` this worker read (``tfaccel.resilience.backups.read_backup``), or None.
        reread: reads ``backup_dir`` again (None: no second read).
        total: element-wise sum of a list over the workers (``tfaccel.strategies.process_sum.strategy_sum``).
        is_chief: this worker is the chief. workers: the number of workers.

    Returns:
        ``state``, or the backup read again, when it is the chief's.

    Raises:
        ConfigError: on every worker, when any worker's ``backup_dir`` does not hold the chief's backup.
    """
    mine = backup_position(state)
    chief = [int(round(v)) for v in total([float(v) if is_chief else 0.0 for v in mine])]
    if mine != chief and reread is not None:
        state = reread()
        mine = backup_position(state)
    differ = int(round(total([0.0 if mine == chief else 1.0, 0.0, 0.0, 0.0, 0.0])[0]))
    if differ:
        raise ConfigError(
            f"backup_dir: the chief resumes from {_describe(chief)}, and {differ} of {workers} workers read another "
            f"backup or none (this worker: {_describe(mine)}). Under multi_worker every worker loads the backup's "
            "files itself, so backup_dir must be one directory that every worker reads (a shared file system: NFS, "
            "a mounted bucket, a Kubernetes ReadWriteMany volume). Fix: give every worker the same shared "
            "backup_dir, or remove the backup to start over")
    return state
