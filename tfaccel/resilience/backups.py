"""Callbacks compile_and_fit adds: step-granular atomic backups, chief-only checkpoints, throughput.

Backups are what a restarted job resumes from (``backup_dir``); checkpoints are what a user keeps
(``checkpoint_dir``). Both are written so that a crash never leaves a half-written state behind: data
files first under a temporary name, renamed into place, then a small JSON pointer replaced atomically.
"""

import contextlib
import functools
import json
import os
import shutil
import tempfile
from typing import Any, Callable, Dict, List, Optional

import keras
import tensorflow as tf

from tfaccel.compat.keras_weights_snapshot import snapshot_weights
from tfaccel.errors import ConfigError
from tfaccel.job_id import JOB_ID_ENV
from tfaccel.log import get_logger
from tfaccel.resilience.atomic_io import atomic_write_text, swap_prefix
from tfaccel.resilience.backup_check import check_weights_file
from tfaccel.resilience.backup_guard import confined, describe_job, fsync_path, job_alive, job_identity, same_job
from tfaccel.resilience.backup_writer import BackupWriter, save_weights_atomically, write_snapshot_atomically
from tfaccel.resilience.restarts import PROGRESS_FILE, RECORD_FILE
from tfaccel.resilience.shard_backup import (SHARDS_FIELD, agree_written, check_shard_files, load_shards,
                                             loading_context, saving_context, shards_record, write_shard,
                                             writes_shards)
from tfaccel.strategies.process_sum import strategy_sum

__all__ = ["BackupState", "read_backup", "load_backup_weights", "StepBackup", "ChiefCheckpoint",
           "PS_BACKUP_FORMAT", "write_checkpoint_backup", "restore_checkpoint_backup"]

_STATE_FILE = "tfaccel_backup.json"
_OWN_FILES = (_STATE_FILE, PROGRESS_FILE, RECORD_FILE)  # each written by atomic_write_text
_POINTER_MAX_BYTES = 1 << 20
# backup_dir (real path) -> the id of the ended job whose backup this process resumed from (read_backup): the
# only other job whose pointer this process may replace.
_ADOPTED: Dict[str, Any] = {}


class BackupState(dict):
    """``{"epoch": e, "step": s, "global_step": g, "weights": file}``: resume at step ``s`` of epoch ``e``."""

    @property
    def epoch(self) -> int:
        return int(self["epoch"])

    @property
    def step(self) -> int:
        return int(self["step"])


def _load_pointer(backup_dir: str, path: str) -> BackupState:
    try:
        if os.path.getsize(path) > _POINTER_MAX_BYTES:
            raise ValueError(f"{os.path.getsize(path)} bytes, more than a pointer's {_POINTER_MAX_BYTES}")
        with open(path, encoding="utf-8") as fh:
            state = BackupState(json.load(fh))
        state["weights_path"] = confined(backup_dir, state["weights"], what="backup_dir",
                                         field=f"{_STATE_FILE} 'weights'")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"backup_dir {backup_dir}: {_STATE_FILE} is unreadable ({str(exc)[:200]}); remove the "
                          "directory to start from scratch") from exc
    return state


def read_backup(backup_dir: Optional[str]) -> Optional[BackupState]:
    """The last complete backup in ``backup_dir``, or None when there is none.

    Raises:
        ConfigError: the pointer is unreadable, names something outside ``backup_dir`` or a missing file, or was
            written by another job that is still running (both jobs named).
    """
    if not backup_dir:
        return None
    path = os.path.join(backup_dir, _STATE_FILE)
    if not os.path.exists(path):
        return None
    state = _load_pointer(backup_dir, path)
    if not os.path.exists(state["weights_path"]):
        raise ConfigError(f"backup_dir {backup_dir}: {_STATE_FILE} names {state['weights']}, which is missing; "
                          "remove the directory to start from scratch")
    check_shard_files(backup_dir, state)
    mine, owner = job_identity(), state.get("job")
    if isinstance(owner, dict) and not same_job(owner, mine):
        if job_alive(owner):
            raise ConfigError(f"backup_dir {backup_dir} is in use by {describe_job(owner)}, which is still running; "
                              f"this is {describe_job(mine)}. Two jobs cannot share a backup_dir: give this one "
                              f"another backup_dir, or set {JOB_ID_ENV} to the same value on every task and restart "
                              "of one job")
        _ADOPTED[os.path.realpath(backup_dir)] = owner.get("id")  # a restart: this job carries on that one's work
    return state


def load_backup_weights(model: Any, state: BackupState, *, backup_dir: str) -> None:
    """Loads the backup's weights and optimizer state into ``model`` after checking the file fits it (and the
    optimizer's slots from its shard files, where sharded state was written by several workers).

    Raises:
        ConfigError: the file is unreadable, or its layers and shapes are not this model's (names what differs).
    """
    with loading_context(model, state, backup_dir=backup_dir):
        check_weights_file(model, state["weights_path"], backup_dir=backup_dir, name=state["weights"])
        model.load_weights(state["weights_path"])
    load_shards(model, state, backup_dir=backup_dir)


class StepBackup(keras.callbacks.Callback):
    """The Keras callback that backs up model + optimizer every ``save_freq`` steps and each epoch end.

    Only the chief writes (Keras 3 reads mirrored variables locally, so saving needs no collective and the
    other workers have nothing to contribute), except for optimizer state sharded over several workers: each writes
    its shard, and the chief moves the pointer once all are written (``tfaccel.resilience.shard_backup``).
    ``step_offset`` lets a resumed partial epoch report its true position; ``record(epoch, step)`` returns more
    fields for the backup's pointer (the world size, the finished epochs' logs:
    ``tfaccel.resilience.elastic.journal_callback``); ``total`` sums a value over the processes for the workers'
    agreement on sharded state (the backend's, e.g. Horovod's all-reduce; None: the strategy's). ``saves`` counts
    the backups written.

    A save copies the values to host memory in the step loop and hands the file, its fsync and the pointer to
    ``writer`` (a :class:`~tfaccel.resilience.backup_writer.BackupWriter`: a background thread unless
    ``TFACCEL_ASYNC_BACKUP=0``); training goes on meanwhile. ``on_train_end`` and :meth:`save_durably` (the
    preemption stop) wait until the backup is on disk. Sharded optimizer state is written in the step loop (the
    workers agree, through a collective, that every shard is on disk before the chief moves the pointer).
    """

    def __init__(self, backup_dir: str, *, save_freq: Optional[int], is_chief: bool, step_offset: int = 0,
                 steps_per_epoch: int, record: Optional[Callable[[int, int], Dict[str, Any]]] = None,
                 writer: Optional[BackupWriter] = None, total: Optional[Callable[[float], float]] = None) -> None:
        super().__init__()
        self.backup_dir, self.save_freq, self.is_chief = backup_dir, save_freq, is_chief
        self.steps_per_epoch, self.record = steps_per_epoch, record
        self.writer = writer if writer is not None else BackupWriter()
        self.epoch = 0
        self.step_offset = step_offset
        self.last_saved: Optional[tuple] = None
        self.saves = 0
        self._total = total  # None: the strategy's all-reduce, made at the first sharded backup

    def on_epoch_begin(self, epoch: int, logs: Optional[Dict] = None) -> None:
        self.epoch = epoch

    def on_train_batch_end(self, batch: int, logs: Optional[Dict] = None) -> None:
        step = self.step_offset + batch + 1
        if self.save_freq and step % self.save_freq == 0 and step < self.steps_per_epoch:
            self.save(self.epoch, step)

    def on_epoch_end(self, epoch: int, logs: Optional[Dict] = None) -> None:
        self.step_offset = 0  # only the first (resumed) epoch starts mid-way
        self.save(epoch + 1, 0)

    def on_train_end(self, logs: Optional[Dict] = None) -> None:
        self.writer.wait()  # fit returns with its last backup on disk (or raises why it is not)

    def save(self, epoch: int, step: int) -> None:
        """Backs up (epoch, step) on the chief (a no-op elsewhere, or where it was written): the values are
        copied now, the files written by ``writer``; every worker writes its shard of sharded optimizer state."""
        optimizer = self.model.optimizer
        apart = writes_shards(optimizer)
        if not (self.is_chief or apart) or self.last_saved == (epoch, step):
            return
        os.makedirs(self.backup_dir, exist_ok=True)
        global_step = epoch * self.steps_per_epoch + step
        name = f"backup-{global_step}.weights.h5"
        shards = shards_record(optimizer, global_step)
        state = {**(self.record(epoch, step) if self.record and self.is_chief else {}), "epoch": epoch,
                 "step": step, "global_step": global_step, "weights": name, "steps_per_epoch": self.steps_per_epoch,
                 **({SHARDS_FIELD: shards} if shards else {})}
        self.writer.make_room()  # the previous backup's write ends before this one's snapshot
        if apart:  # in the step loop: its agreement is a collective of every worker
            self._save_apart(name, global_step)
            if self.is_chief:
                commit_backup(self.backup_dir, state)
        else:
            path = os.path.join(self.backup_dir, name)
            if self.writer.asynchronous:
                data = functools.partial(write_snapshot_atomically, snapshot_weights(self.model), path)
            else:  # TFACCEL_ASYNC_BACKUP=0: the file written from the live variables, in the step loop
                data = functools.partial(save_weights_atomically, self.model, path)
            self.writer.submit(functools.partial(_write_and_commit, data, self.backup_dir, state))
        self.last_saved = (epoch, step)
        self.saves += 1

    def save_durably(self, epoch: int, step: int) -> None:
        """:meth:`save`, then waits until that backup is on disk (a preemption stop: the process exits next)."""
        self.save(epoch, step)
        self.writer.wait()

    def _save_apart(self, name: str, global_step: int) -> None:
        """Every worker writes its shard (the chief also the weights file, slots left apart), then all agree."""
        model, written = self.model, False
        try:
            write_shard(self.backup_dir, model.optimizer, global_step)
            if self.is_chief:
                with saving_context(model):
                    save_weights_atomically(model, os.path.join(self.backup_dir, name))
            written = True
        except Exception as exc:  # noqa: BLE001 - said, then every worker raises after the barrier below
            get_logger().error("backup_dir %s: this worker's part of %s was not written: %s", self.backup_dir, name,
                               exc)
        self._total = self._total or strategy_sum(model.distribute_strategy)
        agree_written(self._total, written=written, processes=shards_record(model.optimizer, 0)["processes"],
                      backup_dir=self.backup_dir, name=name)


def _write_and_commit(write_data: Callable[[], None], backup_dir: str, state: Dict[str, Any]) -> None:
    write_data()
    commit_backup(backup_dir, state)


def commit_backup(backup_dir: str, state: Dict[str, Any]) -> None:
    """Makes ``state`` the backup to resume from, then removes the data of the one it replaces.

    ``state["weights"]`` names data already complete in ``backup_dir`` (a ``.weights.h5`` file from StepBackup, a
    ``tf.train.Checkpoint`` directory from the parameter-server loop). The data and the directory are fsynced,
    the JSON pointer (which records this job) is replaced atomically and the directory fsynced again; only then
    is the previous backup removed. A crash at any point leaves the previous backup or the new one, both whole.

    Raises:
        ConfigError: the current pointer was written by another job (neither this one nor the ended job it
            resumed from): both named, the other job's data left untouched, this save's data removed.
    """
    mine, pointer = job_identity(), os.path.join(backup_dir, _STATE_FILE)
    previous = _load_pointer(backup_dir, pointer) if os.path.exists(pointer) else None
    owner = (previous or {}).get("job")
    if isinstance(owner, dict) and not same_job(owner, mine) and \
            owner.get("id") != _ADOPTED.get(os.path.realpath(backup_dir)):
        _remove_data(confined(backup_dir, state["weights"], what="backup_dir", field="the new backup"))
        raise ConfigError(f"backup_dir {backup_dir}: {describe_job(owner)} wrote a backup there while "
                          f"{describe_job(mine)} was training; two jobs cannot share a backup_dir. Its backup was left "
                          f"as it is; give each job its own backup_dir (or set {JOB_ID_ENV} to one value per job)")
    fsync_path(backup_dir)  # the new data's directory entry is on disk before the pointer names it
    atomic_write_text(os.path.join(backup_dir, _STATE_FILE), json.dumps({**state, "job": mine}))
    fsync_path(backup_dir)  # the pointer's rename is on disk before the data it replaced goes
    if previous and previous["weights"] != state["weights"]:
        _remove_data(previous["weights_path"])
        for shard in (previous.get(SHARDS_FIELD) or {}).get("files") or []:
            _remove_data(confined(backup_dir, shard, what="backup_dir", field=f"{SHARDS_FIELD} 'files'"))


def _remove_data(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.unlink(path)


def is_backup_data(name: str) -> bool:
    """Whether ``name`` (in a backup_dir) is backup data tfaccel wrote, or a temporary one a crash left behind."""
    return name.startswith(("backup-", ".tmp-backup-")) and name.endswith((".weights.h5", ".ckpt", ".npz"))


def remove_backup(backup_dir: str) -> None:
    """Removes the files tfaccel's backups wrote (only those), and the directory if it is then empty."""
    if not os.path.isdir(backup_dir):
        return
    for name in os.listdir(backup_dir):
        ours = name in _OWN_FILES or is_backup_data(name) \
            or name.startswith(tuple(swap_prefix(own) for own in _OWN_FILES))  # killed swaps
        if ours and not os.path.islink(os.path.join(backup_dir, name)):
            _remove_data(os.path.join(backup_dir, name))
    with contextlib.suppress(OSError):
        os.rmdir(backup_dir)


class ChiefCheckpoint(keras.callbacks.Callback):
    """The callback that writes ``tf.train.Checkpoint``s of model + optimizer at each epoch end (``saved``: their
    paths).

    The chief writes into ``checkpoint_dir``. Under MultiWorkerMirroredStrategy every worker saves (TF's
    rule for collective-backed variables); non-chief workers write into a private temporary directory
    that is removed right after.
    """

    def __init__(self, checkpoint_dir: str, *, is_chief: bool, every_worker_saves: bool, max_to_keep: int = 3) -> None:
        super().__init__()
        self.checkpoint_dir, self.is_chief, self.every_worker_saves = checkpoint_dir, is_chief, every_worker_saves
        self.max_to_keep = max_to_keep
        self.saved: List[str] = []
        self._manager: Any = None

    def _ckpt(self) -> Any:
        return tf.train.Checkpoint(model=self.model, optimizer=self.model.optimizer)

    def on_epoch_end(self, epoch: int, logs: Optional[Dict] = None) -> None:
        if self.is_chief:
            if self._manager is None:
                self._manager = tf.train.CheckpointManager(self._ckpt(), self.checkpoint_dir,
                                                           max_to_keep=self.max_to_keep, checkpoint_name="ckpt")
            self.saved.append(self._manager.save(checkpoint_number=epoch + 1))
        elif self.every_worker_saves:
            tmp = tempfile.mkdtemp(prefix="tfaccel-worker-ckpt-")
            try:
                self._ckpt().write(os.path.join(tmp, "ckpt"))
            finally:
                shutil.rmtree(tmp, ignore_errors=True)


def log_progress(message: str) -> None:
    get_logger().info(message)


# ------------------------------------------------------------------------------------------ parameter server
# The "format" a parameter-server backup names in tfaccel_backup.json (StepBackup's .weights.h5 has none): the
# variables live on the ps tasks and only the coordinator knows how far training got, so the coordinator writes a
# tf.train.Checkpoint of model, optimizer and step counter after coordinator.join().
PS_BACKUP_FORMAT = "tf.train.Checkpoint"
_CKPT_PREFIX = "ckpt"


def write_checkpoint_backup(backup_dir: str, checkpoint: Any, *, epoch: int, step: int,
                            steps_per_epoch: int) -> str:
    """Writes ``checkpoint`` as the backup to resume at step ``step`` of epoch ``epoch``; returns its directory.

    The checkpoint is written into a temporary directory, renamed to ``backup-<global step>.ckpt``, and only then
    named by ``tfaccel_backup.json`` (replaced atomically): a save that fails or is killed at any point leaves the
    previous backup whole and still the one a restart resumes from.
    """
    os.makedirs(backup_dir, exist_ok=True)
    global_step = epoch * steps_per_epoch + step
    name = f"backup-{global_step}.ckpt"
    final = os.path.join(backup_dir, name)
    previous = read_backup(backup_dir)
    if previous is not None and previous["weights"] == name:
        return final  # this very point is the current backup already (positions only grow within a run)
    tmp = tempfile.mkdtemp(prefix=".tmp-backup-", suffix=".ckpt", dir=backup_dir)
    renamed = False
    try:
        checkpoint.write(os.path.join(tmp, _CKPT_PREFIX))
        fsync_path(tmp)
        if os.path.exists(final):  # left by a job killed after the rename, before the pointer named it
            shutil.rmtree(final)
        os.replace(tmp, final)
        renamed = True
        commit_backup(backup_dir, {"epoch": epoch, "step": step, "global_step": global_step, "weights": name,
                                   "format": PS_BACKUP_FORMAT, "steps_per_epoch": steps_per_epoch})
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if renamed:  # the pointer was not replaced: nothing names this directory
            shutil.rmtree(final, ignore_errors=True)
        raise
    return final


def restore_checkpoint_backup(state: Any, checkpoint: Any, *, backup_dir: str) -> None:
    """Loads the backup ``state`` (from ``read_backup``) into ``checkpoint``'s objects; every value must match."""
    if state.get("format") != PS_BACKUP_FORMAT:
        raise ConfigError(
            f"backup_dir {backup_dir}: holds {state['weights']}, a backup of the Keras training path; a "
            f"parameter_server job resumes only from its own {PS_BACKUP_FORMAT} backups. Resume it with the strategy "
            "that wrote it, or give this job another backup_dir")
    status = checkpoint.read(os.path.join(state["weights_path"], _CKPT_PREFIX))
    try:
        status.assert_consumed()
    except (AssertionError, ValueError) as exc:
        status.expect_partial()  # the error says it; no second warning when the objects are deleted
        why = " ".join(str(exc).split())
        raise ConfigError(f"backup_dir {backup_dir}: {state['weights']} does not match this model and optimizer "
                          f"({why[:300]}); the model changed since it was written. Remove the directory to start "
                          "from scratch") from exc
