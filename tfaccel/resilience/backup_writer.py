"""The backup writer: the step loop hands it a backup and trains on while a thread writes the files.

A backup is taken in two parts. The caller snapshots the state at its step (host copies, in the step loop: the pause
it causes), then :meth:`BackupWriter.submit` hands the writing to one background thread: data files written under a
temporary name, fsynced, renamed, the directory fsynced, and only then the pointer moved
(``tfaccel.resilience.backups.commit_backup``). A crash at any moment leaves the previous backup whole.

At most one backup is in flight. A backup due while the previous one is still being written **waits** for it
before its snapshot (:meth:`BackupWriter.make_room`; counted in :attr:`BackupWriter.waits` and
:attr:`BackupWriter.wait_seconds`, and logged at debug level); none is skipped, so every backup the job asks for is
written, in order, and one snapshot at most is held in memory. :meth:`BackupWriter.wait` blocks until the backup in
flight is durable: a preemption stop and the end of training call it, so a job never exits 75 or removes its
``backup_dir`` while a write is pending. A failed write raises in the training thread at the next :meth:`submit` or :meth:`wait`.

``TFACCEL_ASYNC_BACKUP=0`` writes every backup in the step loop instead (to debug; the default is ``1``).
"""

import contextlib
import functools
import os
import threading
import time
from typing import Any, Callable, Dict, Optional

from tfaccel.compat.keras_weights_snapshot import WeightsSnapshot, write_weights
from tfaccel.errors import ConfigError
from tfaccel.log import get_logger
from tfaccel.resilience.backup_guard import fsync_path

__all__ = ["ASYNC_ENV", "async_backups", "BackupWriter", "save_weights_atomically", "write_snapshot_atomically"]

ASYNC_ENV = "TFACCEL_ASYNC_BACKUP"


def async_backups() -> bool:
    """Whether backups are written in the background (``TFACCEL_ASYNC_BACKUP``, ``1`` by default).

    Raises:
        ConfigError: the variable is set to something other than ``0`` or ``1``.
    """
    raw = os.environ.get(ASYNC_ENV, "").strip()
    if raw not in ("", "0", "1"):
        raise ConfigError(f"{ASYNC_ENV} must be 1 (write backups in a background thread, the default) or 0 (write "
                          f"them in the step loop, to debug); received {raw[:40]!r}. Unset it for the default")
    return raw != "0"


class BackupWriter:
    """Writes one backup at a time in a background thread (or in the caller's, when not ``asynchronous``).

    Args:
        asynchronous: write in a background thread. Defaults to :func:`async_backups` (the environment).
    """

    def __init__(self, *, asynchronous: Optional[bool] = None) -> None:
        self.asynchronous = async_backups() if asynchronous is None else asynchronous
        self.waits = 0  # backups that waited for the previous one's write
        self.wait_seconds = 0.0  # the step loop's time in those waits
        self.write_seconds = 0.0  # in the background thread, all backups together
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None

    def make_room(self) -> None:
        """Waits for the backup in flight, if any (counted: a backup was due while it was being written), so that
        the next snapshot neither competes with its write nor doubles the memory held. Raises what it raised."""
        if not self.pending:
            self.wait()  # a finished write's error, if any
            return
        self.wait_seconds += self.wait()
        self.waits += 1
        get_logger().debug("backup: waited for the previous backup's write (%d so far, %.2f s in all)", self.waits,
                           self.wait_seconds)

    def submit(self, write: Callable[[], None]) -> None:
        """Writes a backup: ``write()`` (files, fsync, pointer) runs in the background thread.

        Calls :meth:`make_room` first (a no-op after the caller's own call). Raises what a previous write raised.
        """
        self.make_room()
        if not self.asynchronous:
            self._timed(write)
            return
        self._thread = threading.Thread(target=self._run, args=(write,), name="tfaccel-backup-writer")
        self._thread.start()  # not a daemon: an interpreter that exits waits for the write (a durable backup)

    def wait(self) -> float:
        """Blocks until the backup in flight is durable; the seconds waited (0.0 when none was in flight).

        Raises:
            BaseException: what the background write raised (once).
        """
        waited = 0.0
        thread, self._thread = self._thread, None
        if thread is not None:
            began = time.perf_counter()
            thread.join()
            waited = time.perf_counter() - began
        error, self._error = self._error, None
        if error is not None:
            raise error
        return waited

    @property
    def pending(self) -> bool:
        """Whether a backup is being written now."""
        return self._thread is not None and self._thread.is_alive()

    def details(self) -> Dict[str, object]:
        """What ``details["backup_writer"]`` reports: the mode, the waits and the time the writes took."""
        return {"mode": "async" if self.asynchronous else f"sync ({ASYNC_ENV}=0)", "waited": self.waits,
                "wait_seconds": round(self.wait_seconds, 4), "write_seconds": round(self.write_seconds, 4)}

    def _run(self, write: Callable[[], None]) -> None:
        try:
            self._timed(write)
        except BaseException as exc:  # noqa: BLE001 - handed to the training thread, raised there
            self._error = exc

    def _timed(self, write: Callable[[], None]) -> None:
        began = time.perf_counter()
        try:
            write()
        finally:
            self.write_seconds += time.perf_counter() - began


def save_weights_atomically(model: Any, path: str) -> None:
    """Writes the weights under a temporary name, fsyncs, then renames; a failed write leaves no half file."""
    _write_atomically(path, model.save_weights)


def write_snapshot_atomically(snapshot: WeightsSnapshot, path: str) -> None:
    """:func:`save_weights_atomically` of values snapshotted earlier (``snapshot_weights``): the same file."""
    _write_atomically(path, functools.partial(write_weights, snapshot))


def _write_atomically(path: str, write: Callable[..., None]) -> None:
    tmp = f"{path[:-len('.weights.h5')]}.tmp-{os.getpid()}.weights.h5"
    try:
        write(tmp)
        fsync_path(tmp)  # the data reaches the disk before any pointer can name it
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
