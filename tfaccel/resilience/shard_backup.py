"""Backups of sharded optimizer state (``shard_optimizer_state=True``, ``tfaccel.train.zero``).

Under one host's ``mirrored`` strategy the chief's process holds every replica's slots: the backup's weights file
holds the whole state, as for any optimizer. Under ``multi_worker`` a worker holds only the slots of the variables
it owns, so each worker writes its own shard file (``backup-<global step>.shard-<k>-of-<N>.npz``: its slots by their
index among the optimizer's variables; written under a temporary name, fsynced, renamed) and the chief's weights
file holds the weights and the optimizer's other variables, its slots left empty (:func:`slots_apart`). Every
worker then adds 1 for its files written to a sum over the workers (a collective, the barrier): the chief moves
the pointer only when the sum is N, so a pointer never names a shard that is not on disk (the sum is the backend's
``sum_over_processes``; Horovod's ranks do the same with Horovod's all-reduce).

The pointer records the layout under ``optimizer_shards``: ``count`` (replicas), ``processes``, ``owners`` (the
owner replica of each trainable variable) and ``files`` (the shard files; none under ``mirrored``). A resumed job
loads the weights file, then every shard file into its own layout, whatever its number of workers: each worker
takes the slots it owns now from whichever shard holds them (``elastic`` 3 -> 2, or a launch with another
``--workers``), and every slot it owns must be found.
"""

import contextlib
import os
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from tfaccel.compat.keras_zero import held_slots, is_sharded, load_held_slots, shard_layout, slots_apart
from tfaccel.errors import ConfigError
from tfaccel.precision import unwrap_loss_scale
from tfaccel.resilience.backup_guard import confined, fsync_path

__all__ = ["SHARDS_FIELD", "writes_shards", "write_shard", "shards_record", "check_shard_files", "load_shards",
           "loading_context", "saving_context", "agree_written"]

SHARDS_FIELD = "optimizer_shards"
# Each function below takes the model's optimizer and reads the one whose slots are sharded: under mixed_float16
# the one its LossScaleOptimizer wraps (the loss scale and step counter, the same on every worker, go to the
# weights file).


def writes_shards(optimizer: Any) -> bool:
    """Whether a backup of this optimizer is written by every worker (sharded over several processes)."""
    layout = shard_layout(unwrap_loss_scale(optimizer))
    return layout is not None and layout["processes"] > 1


def _shard_name(global_step: int, index: int, count: int) -> str:
    return f"backup-{global_step}.shard-{index}-of-{count}.npz"


def write_shard(backup_dir: str, optimizer: Any, global_step: int) -> str:
    """Writes this worker's slots as its shard of the backup at ``global_step`` (atomically); the file's name."""
    optimizer = unwrap_loss_scale(optimizer)
    layout = shard_layout(optimizer)
    name = _shard_name(global_step, layout["index"], layout["processes"])
    path = os.path.join(backup_dir, name)
    tmp = os.path.join(backup_dir, f".tmp-{name[:-len('.npz')]}-{os.getpid()}.npz")
    try:
        with open(tmp, "wb") as fh:
            np.savez(fh, **held_slots(optimizer))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        fsync_path(backup_dir)  # the rename is on disk before this worker reports its shard written
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return name


def agree_written(total: Callable[[float], float], *, written: bool, processes: int, backup_dir: str,
                  name: str) -> None:
    """The barrier after every worker's writes: ``total`` sums each worker's 1 (written) or 0 (failed).

    Raises:
        OSError: a worker could not write its files (on every worker: no pointer moves).
    """
    done = int(round(total(1.0 if written else 0.0)))
    if done != processes:
        raise OSError(f"backup_dir {backup_dir}: {processes - done} of {processes} workers could not write their "
                      f"shard of {name} (see their logs); the previous backup stays the one to resume from")


def shards_record(optimizer: Any, global_step: int) -> Optional[Dict[str, Any]]:
    """The pointer's ``optimizer_shards`` entry for a sharded optimizer (None for any other)."""
    layout = shard_layout(unwrap_loss_scale(optimizer))
    if layout is None:
        return None
    count = layout["processes"]
    files = [_shard_name(global_step, k, count) for k in range(count)] if count > 1 else []
    return {"count": layout["count"], "processes": count, "owners": layout["owners"], "files": files}


def _shard_paths(backup_dir: str, state: Any) -> List[str]:
    files = (state.get(SHARDS_FIELD) or {}).get("files") or []
    return [confined(backup_dir, name, what="backup_dir", field=f"{SHARDS_FIELD} 'files'") for name in files]


def check_shard_files(backup_dir: str, state: Any) -> None:
    """Refuses a pointer that names a shard file which is not there.

    Raises:
        ConfigError: the missing file named.
    """
    missing = [os.path.basename(p) for p in _shard_paths(backup_dir, state) if not os.path.exists(p)]
    if missing:
        raise ConfigError(f"backup_dir {backup_dir}: the backup {state['weights']} names the optimizer shard(s) "
                          f"{', '.join(missing)}, which are missing; restore them, or remove the directory to start "
                          "from scratch")


def loading_context(model: Any, state: Any, *, backup_dir: str) -> Any:
    """The context to load the backup's weights file in: slots left apart where shard files carry them.

    Raises:
        ConfigError: shard files, and a model whose optimizer is not sharded.
    """
    if not _shard_paths(backup_dir, state):
        return contextlib.nullcontext()
    if not is_sharded(unwrap_loss_scale(model.optimizer)):
        shards = state[SHARDS_FIELD]
        raise ConfigError(f"backup_dir {backup_dir}: {state['weights']} holds optimizer state sharded over "
                          f"{shards['processes']} workers (one shard file each); this job's optimizer "
                          f"{type(model.optimizer).__name__} is not sharded. Resume with shard_optimizer_state=True, "
                          "or give this job another backup_dir")
    return slots_apart(unwrap_loss_scale(model.optimizer))


def saving_context(model: Any) -> Any:
    """The context the chief writes a backup's weights file in when every worker writes its shard: the sharded
    slots left empty (the shard files carry them), no collective run."""
    return slots_apart(unwrap_loss_scale(model.optimizer))


def load_shards(model: Any, state: Any, *, backup_dir: str) -> None:
    """Assigns the slots this process owns from the backup's shard files (any number of them).

    Raises:
        ConfigError: a shard unreadable, or a slot in none of them or of another shape.
    """
    paths = _shard_paths(backup_dir, state)
    if not paths:
        return  # the weights file holds the whole state (mirrored)
    with contextlib.ExitStack() as stack:
        where: Dict[str, Any] = {}  # slot index -> the open shard holding it (each read when assigned)
        for path in paths:
            try:
                shard = stack.enter_context(np.load(path))
            except (OSError, ValueError) as exc:
                raise ConfigError(f"backup_dir {backup_dir}: the optimizer shard {os.path.basename(path)} is "
                                  f"unreadable ({str(exc)[:200]}); remove the directory to start from scratch") from exc
            where.update({key: shard for key in shard.files})
        problems = load_held_slots(unwrap_loss_scale(model.optimizer),
                                   lambda key: where[key][key] if key in where else None)
    if problems:
        raise ConfigError(f"backup_dir {backup_dir}: the optimizer shards of {state['weights']} do not fit this "
                              f"optimizer: {'; '.join(problems[:4])}. Resume with the model and optimizer that wrote "
                              "them, or give this job another backup_dir")
