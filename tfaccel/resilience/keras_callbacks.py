"""The user's own Keras callbacks that write files (``BackupAndRestore``, ``ModelCheckpoint``, ``TensorBoard``,
``CSVLogger``) under several workers.

Under multi_worker (and Horovod) every worker runs the same script, so every worker's callbacks write the same
paths: two workers writing one HDF5 file fail with ``BlockingIOError: Unable to synchronously create file (unable to
lock file)``. tf_keras had the chief write the real path and the others a private temporary one; Keras 3 does not.
tfaccel restores that rule: on a worker other than the chief, each ``BackupAndRestore`` still *reads* the real
``backup_dir`` (every worker resumes from the chief's backup, which needs ``backup_dir`` on storage all workers see,
as tf_keras did) but writes into a private temporary directory, and each ``ModelCheckpoint``, ``TensorBoard`` and
``CSVLogger`` writes into one (the other workers' logs and rows would otherwise land beside the chief's: an
appending ``CSVLogger`` file got a second header and both workers' rows); they are removed when training ends (or,
after a crash, by the next worker process on that host). The user's objects are not changed: the other workers
train with copies. The chief keeps the user's callbacks as given.

The epoch a ``BackupAndRestore`` restores is read before training (:func:`keras_resume_epoch`), so tfaccel's
example order, a function of (seed, epoch), starts at that epoch as in an uninterrupted run.
"""

import copy
import os
import shutil
import tempfile
from typing import Any, List, Optional, Sequence

import keras

from tfaccel.compat.keras_backup_restore import restored_initial_epoch
from tfaccel.launch.procs import pid_alive
from tfaccel.log import get_logger

__all__ = ["worker_callbacks", "keras_resume_epoch"]

_PREFIX = "tfaccel-worker-"  # + "<pid>-": the owner, so a restarted worker can remove a dead one's directory


def _private_backup(user_cb: Any, directory: str) -> Any:
    """A BackupAndRestore that reads the user's ``backup_dir`` but writes into ``directory``."""
    class _PrivateBackupAndRestore(keras.callbacks.BackupAndRestore):
        def __init__(self) -> None:
            super().__init__(directory, save_freq=user_cb.save_freq, double_checkpoint=user_cb.double_checkpoint,
                             delete_checkpoint=True)
            self.reads_from = user_cb.backup_dir

        def on_train_begin(self, logs: Optional[dict] = None) -> None:
            reader = copy.copy(user_cb)  # the user's object stays untouched
            reader.set_model(self.model)
            reader.on_train_begin(logs)

    return _PrivateBackupAndRestore()


def _private_checkpoint(user_cb: Any, directory: str) -> Any:
    """A copy of the user's ModelCheckpoint whose files go into ``directory`` (same file names), silent: Keras'
    ``saving model to PATH`` would show the scratch path as if it were the user's checkpoint; this worker says once
    what it is instead (:func:`_say_scratch`), and the chief's own callback logs the user's path."""
    clone = copy.copy(user_cb)
    clone.filepath = os.path.join(directory, os.path.basename(user_cb.filepath))
    if getattr(user_cb, "verbose", 0):
        clone.verbose = 0
        _say_scratch(user_cb.filepath, clone.filepath)
    return clone


def _say_scratch(user_path: str, scratch_path: str) -> None:
    """One line on a worker other than the chief: where its ModelCheckpoint copy writes, and why."""
    get_logger().info("ModelCheckpoint(%r) is written by the chief; this worker (not the chief) saves its scratch copy "
                      "to %s, removed when training ends", user_path, scratch_path, extra={"all_tasks": True})


def _private_tensorboard(user_cb: Any, directory: str) -> Any:
    """A copy of the user's TensorBoard logging into ``directory`` (Keras opens its writers at train begin)."""
    clone = copy.copy(user_cb)
    clone.log_dir = directory
    return clone


def _private_csv(user_cb: Any, directory: str) -> Any:
    """A copy of the user's CSVLogger writing its rows into ``directory`` (same file name; Keras makes no folder)."""
    os.makedirs(directory, exist_ok=True)
    clone = copy.copy(user_cb)
    clone.filename = os.path.join(directory, os.path.basename(user_cb.filename))
    return clone


def _private_copies() -> dict:
    """Each Keras callback class that writes a user path -> the function making a copy that writes privately."""
    return {keras.callbacks.BackupAndRestore: _private_backup, keras.callbacks.ModelCheckpoint: _private_checkpoint,
            keras.callbacks.TensorBoard: _private_tensorboard, keras.callbacks.CSVLogger: _private_csv}


def _remover(directory: str) -> Any:
    class _RemovePrivateDir(keras.callbacks.Callback):
        def on_train_end(self, logs: Optional[dict] = None) -> None:
            shutil.rmtree(directory, ignore_errors=True)

    return _RemovePrivateDir()


def _private_root() -> str:
    """A new private directory in the temporary directory; first removes those of this host's dead processes
    (a worker SIGKILLed during training cannot remove its own)."""
    tmp = tempfile.gettempdir()
    for name in os.listdir(tmp):
        pid = name[len(_PREFIX):].split("-", 1)[0] if name.startswith(_PREFIX) else ""
        path = os.path.join(tmp, name)
        if pid.isdigit() and not pid_alive(int(pid)) and os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-")


def worker_callbacks(callbacks: Sequence[Any], *, backend: Any) -> List[Any]:
    """The callbacks this worker trains with: the user's on the chief, private-path copies on the others.

    Args:
        callbacks: the user's callbacks, as given to ``fit``.
        backend: this process's backend (``is_chief``, ``num_workers``).

    Returns:
        A new list; on a worker other than the chief, each ``BackupAndRestore``, ``ModelCheckpoint``,
        ``TensorBoard`` or ``CSVLogger`` is replaced by a copy writing into a private temporary directory, and a last
        callback removes it.
    """
    if backend.is_chief or backend.num_workers <= 1:
        return list(callbacks)
    copies = _private_copies()
    directory: Optional[str] = None
    out = []
    for cb in callbacks:
        private_copy = next((make for cls, make in copies.items() if isinstance(cb, cls)), None)
        if private_copy is not None:
            directory = directory or _private_root()
            cb = private_copy(cb, os.path.join(directory, str(len(out))))
        out.append(cb)
    return out + ([_remover(directory)] if directory else [])


def keras_resume_epoch(callbacks: Sequence[Any], *, model: Any, backend: Any) -> int:
    """The epoch the user's ``BackupAndRestore`` callbacks resume at (0 without a backup), restoring the model.

    Runs each one's ``on_train_begin`` inside the strategy scope (Keras builds the optimizer there when it loads a
    backup); Keras' ``fit`` runs it again at train begin and restores the same state.
    """
    epoch = 0
    for cb in callbacks:
        if isinstance(cb, keras.callbacks.BackupAndRestore):
            cb.set_model(model)
            with backend.scope():
                cb.on_train_begin()
            epoch = max(epoch, restored_initial_epoch(model) or 0)
    return epoch
