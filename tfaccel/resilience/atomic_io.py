"""The one atomic writer of tfaccel's small files (backup pointers, progress and restart records, reports).

A file is written under a temporary name in its own directory, flushed to disk, then renamed over the old one, so
a reader (or a process restarted after a crash) sees the old content or the new one, never a mix. A write killed
before its rename leaves the temporary file (:func:`swap_prefix` names it, so that ``remove_backup`` knows it).
"""

import contextlib
import json
import os
import tempfile
from typing import Any

__all__ = ["atomic_write_text", "atomic_write_json", "swap_prefix"]


def swap_prefix(name: str) -> str:
    """How the temporary file of a write of ``name`` (a base name) starts: ``.tmp-NAME-``."""
    return f".tmp-{name}-"


def atomic_write_text(path: str, text: str) -> None:
    """Writes ``text`` to ``path`` so readers see the old or the new content, never a mix (fsynced before the
    rename); the temporary file is removed when the write fails."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=swap_prefix(os.path.basename(path)), dir=directory)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_json(path: str, value: Any) -> None:
    """:func:`atomic_write_text` of ``value`` as JSON."""
    atomic_write_text(path, json.dumps(value))
