"""What keeps a backup directory safe: names confined to it, writes made durable, and one job per directory.

* **Confinement**: a name read from a pointer or progress file (``tfaccel_backup.json``'s ``weights``, a progress
  file's checkpoints) must be one plain entry of its directory: no separator, no ``..``, not absolute, no link
  leading out. Anything else is refused with a ConfigError and nothing is opened or removed.
* **Durability**: data files and the directory that holds them are fsynced before the pointer that names them
  is replaced, and the pointer's directory after, so a host crash leaves the old backup or the new one.
* **Job identity**: every pointer and progress file carries the job that wrote it: the id the environment gives
  (``TFACCEL_JOB_ID``, exported by every tfaccel launcher to every task and kept across restarts, else
  ``slurm-<SLURM_JOB_ID>``; see :mod:`tfaccel.job_id`), else this process (host, pid, pid start time). A
  directory whose pointer names another job that is still running on this host is refused, naming both jobs; a
  job that ended (a restart) is taken over.
"""

import contextlib
import os
import socket
import time
import uuid
from typing import Any, Dict, Optional

from tfaccel.errors import ConfigError
from tfaccel.job_id import environment_job_id

__all__ = ["confined", "fsync_path", "job_identity", "job_alive", "describe_job", "same_job", "pid_start"]

_PROCESS_TOKEN = uuid.uuid4().hex[:12]  # this process's part of its job id when the environment names none


def _show(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


def confined(directory: str, name: Any, *, what: str, field: str) -> str:
    """The path of ``name`` inside ``directory``, refusing anything that could lead outside it.

    Args:
        directory: the directory the name must stay in (``backup_dir``, ``checkpoint_dir``).
        name: the name read from a file tfaccel wrote there (untrusted: the file may have been edited).
        what: the option that names ``directory``, for the message (``"backup_dir"``).
        field: where ``name`` came from, for the message (``"tfaccel_backup.json 'weights'"``).

    Returns:
        ``os.path.join(directory, name)``.

    Raises:
        ConfigError: ``name`` is not one plain entry of ``directory``, or is a link that resolves outside it.
    """
    bad = not isinstance(name, str) or not name or name in (".", "..") or "\x00" in name \
        or os.sep in name or (os.altsep and os.altsep in name) or os.path.isabs(name)
    path = os.path.join(directory, name) if not bad else ""
    if not bad:
        real_dir = os.path.realpath(directory)
        bad = os.path.dirname(os.path.realpath(path)) != real_dir
    if bad:
        raise ConfigError(f"{what} {directory}: {field} must name a file inside {what}; received {_show(name)}. "
                          "tfaccel writes only plain names there: the file was edited or belongs to something else. "
                          f"Nothing outside {what} was touched; remove {what} to start from scratch")
    return path


def fsync_path(path: str) -> None:
    """Flushes ``path`` (a file, or a directory and the files directly in it) to stable storage."""
    if os.path.isdir(path):
        for name in os.listdir(path):
            child = os.path.join(path, name)
            if os.path.isfile(child) and not os.path.islink(child):
                with contextlib.suppress(FileNotFoundError):  # renamed meanwhile (another worker's shard): not ours
                    _fsync_one(child, os.O_RDONLY)
        _fsync_one(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    else:
        _fsync_one(path, os.O_RDONLY)


def _fsync_one(path: str, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse fsync on directories (EINVAL): nothing more can be done there
        if not os.path.isdir(path):
            raise
    finally:
        os.close(fd)


def pid_start(pid: int) -> Optional[str]:
    """The start time of process ``pid`` (clock ticks since boot, from /proc), or None where unknown.

    With the pid it tells a process from a later one that reuses its number.
    """
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def job_identity() -> Dict[str, Any]:
    """The job this process belongs to: ``{"id", "host", "pid", "pid_start"}``.

    Raises:
        ConfigError: ``TFACCEL_JOB_ID`` (or ``SLURM_JOB_ID``) is set but is not 1-128 characters of letters, digits
            and ``._:@+-``.
    """
    given = environment_job_id()
    host, pid = socket.gethostname(), os.getpid()
    return {"id": given or f"{host}-{pid}-{_PROCESS_TOKEN}", "host": host, "pid": pid, "pid_start": pid_start(pid),
            "written_at": round(time.time(), 3)}


def same_job(a: Any, b: Any) -> bool:
    """Whether two job records (from ``job_identity``) name the same job."""
    return isinstance(a, dict) and isinstance(b, dict) and a.get("id") == b.get("id")


def job_alive(job: Any) -> bool:
    """Whether the job of a record written by another process is known to still run (same host, same process).

    A record from another host cannot be checked from here and counts as ended: only a shared job id (what
    every tfaccel launcher exports) or this host's process table can tell jobs apart.
    """
    if not isinstance(job, dict) or job.get("host") != socket.gethostname():
        return False
    pid = job.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or pid == os.getpid():
        return pid == os.getpid()
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, under another user
    started = pid_start(pid)
    return started is None or job.get("pid_start") in (None, started)


def describe_job(job: Any) -> str:
    """``job <id> (host h, pid p)`` for messages."""
    if not isinstance(job, dict):
        return "an unnamed job (a pointer written before job ids)"
    return f"job {_show(job.get('id'), 80)} (host {_show(job.get('host'), 60)}, pid {_show(job.get('pid'), 20)})"
