"""Ending a process with a chosen exit status at once, or once Python's exit handlers ran, without its teardown.

A preempted task must end with its status (75) within the launcher's grace period, and TensorFlow's teardown of a
process that trained does not fit it (3.3 s measured between two idle MultiWorkerMirrored workers, 6.7 s under
load), so the process ends with ``os._exit``. Ending there must not skip what the exit handlers do: the user's
(``atexit.register`` in the training script: a last upload, a lock released) and AutoGraph's removal of its
temporary ``__autograph_generated_file*.py`` files. Python runs exit handlers last registered first, so the one
here is registered when ``tfaccel`` is imported (before TensorFlow, by :mod:`tfaccel`'s package file): every handler
registered after that import runs before it. This module imports nothing of TensorFlow.
"""

import atexit
import logging
import os
import sys
from typing import List

__all__ = ["exit_after_handlers", "flush_and_exit"]

_STATUS: List[int] = []  # the exit status asked for by exit_after_handlers (the last one asked wins)


def flush_and_exit(code: int) -> None:
    """Ends the process now with ``code``: tfaccel's and the root logger's handlers and standard output and error
    are flushed first; no exit handler runs (see :func:`exit_after_handlers` for that)."""
    for handler in list(logging.getLogger("tfaccel").handlers) + list(logging.getLogger().handlers):
        try:
            handler.flush()
        except Exception:  # noqa: BLE001 - a broken handler must not keep a preempted process alive
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def exit_after_handlers(code: int) -> None:
    """Asks the process to end with ``code`` when it exits, once the exit handlers registered after ``import
    tfaccel`` ran, without the interpreter's teardown."""
    _STATUS.append(code)


def _at_exit() -> None:
    if _STATUS:
        flush_and_exit(_STATUS[-1])


atexit.register(_at_exit)
