"""Exception types raised by tfaccel.

Every tfaccel error is a ``TfaccelError``. Errors about user input (a cluster file, an option) are also
``ValueError`` so that callers who catch the standard type keep working.
"""

import difflib
import os
import sys
import traceback
from types import TracebackType
from typing import Iterable, Optional, Type

from tfaccel.resilience.exiting import flush_and_exit

EXIT_PREEMPTED = 75
"""The exit status of a process that stopped because it was preempted (SIGTERM, or ``TFACCEL_PREEMPTION_SIGNAL``)
after every worker agreed on a step and the chief wrote a backup there (or found nothing to save: no ``backup_dir``).

75 is sysexits.h's EX_TEMPFAIL, "a temporary failure; the user is invited to retry": ``tfaccel launch`` restarts
such a job from its backup without counting it against ``--max-restarts`` (``--count-preemptions`` counts it), and
a scheduler can requeue on it (a Kubernetes Job's ``podFailurePolicy`` ``onExitCodes: [75]``, SLURM ``scontrol
requeue``)."""

EXIT_CONFIG = 2
"""The exit status of a process that stopped on a configuration error (a :class:`ConfigError`): the ``tfaccel`` CLI
and ``scripts/train.py`` exit with it, and so does a program that ``tfaccel launch`` started when a ``ConfigError``
reaches its top level (:func:`exit_on_config_error`). The launcher never restarts a job after it, whatever
``--max-restarts`` says: the same options would fail the same way on every attempt."""

LAUNCHED_ENV = "TFACCEL_EXIT_ON_CONFIG_ERROR"
"""Set to ``1`` by ``tfaccel launch`` in every task: ``import tfaccel`` there installs :func:`exit_on_config_error`."""


class TfaccelError(Exception):
    """Base class of every error tfaccel raises on purpose."""


class ConfigError(TfaccelError, ValueError):
    """Bad user input: an option, a cluster description, a TF_CONFIG, an environment variable."""


class Preempted(SystemExit):
    """The job was preempted: training stopped at a step every worker agreed on, the backup (if any) is written.

    A ``SystemExit`` with code :data:`EXIT_PREEMPTED` (``except Exception`` does not catch it): ``finally`` blocks and
    exit handlers run, then the process ends with that status, without TensorFlow's slow teardown, also when the
    program caught it (training stopped early: a restart must resume it). Attributes: ``epoch``, ``step`` (the
    position the backup holds; where a restart resumes) and ``saved`` (False without ``backup_dir``: nothing kept).
    """

    def __init__(self, *, epoch: int, step: int, saved: bool) -> None:
        super().__init__(EXIT_PREEMPTED)
        self.epoch, self.step, self.saved = epoch, step, saved

    def __str__(self) -> str:
        kept = "backup written there" if self.saved else "nothing saved (no backup_dir)"
        return f"preempted at epoch {self.epoch}, step {self.step}: {kept}; exit status {EXIT_PREEMPTED}"


class DeviceError(TfaccelError, RuntimeError):
    """Devices cannot be configured as asked (too late, index out of range, ...)."""


class BackendUnavailableError(TfaccelError, RuntimeError):
    """A backend was asked for but cannot run here (not installed, not built, no hardware)."""


def invalid_choice(what: str, received: object, valid: Iterable[str], hint: Optional[str] = None) -> ConfigError:
    """Builds the standard "unknown choice" error: names the thing, shows what was received, lists what is valid,
    and suggests the closest valid value to a misspelt one (``did you mean 'mirrored'?``).

    Args:
        what: the name of the option or field, e.g. ``"strategy"``.
        received: the value that was given.
        valid: the accepted values.
        hint: an optional suggestion appended to the message.

    Returns:
        A ``ConfigError`` ready to raise.
    """
    valid = list(valid)
    msg = f"{what}: unknown value {received!r}; valid values are: {', '.join(repr(v) for v in valid)}"
    close = (difflib.get_close_matches(received.lower(), [str(v) for v in valid], n=1, cutoff=0.6)
             if isinstance(received, str) else [])
    if close:
        msg += f"; did you mean {close[0]!r}?"
    if hint:
        msg += f"{' ' if close else '. '}{hint}"
    return ConfigError(msg)


TRACEBACK_ENV = "TFACCEL_TRACEBACK"


def _user_frame(tb: Optional[TracebackType]) -> str:
    """``file:line`` of the innermost frame outside tfaccel's package (the user's call), or ``""``."""
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    where = ""
    for frame in traceback.extract_tb(tb):
        if not os.path.abspath(frame.filename).startswith(package):
            where = f"{frame.filename}:{frame.lineno}"
    return where


def _short_line(kind: Type[BaseException], exc: BaseException, tb: Optional[TracebackType]) -> str:
    where = _user_frame(tb)
    return (f"tfaccel.{kind.__name__}{f' at {where}' if where else ''}: {exc} ({TRACEBACK_ENV}=1 shows the "
            "traceback)\n")


def install_task_excepthook(environ: Optional[dict] = None) -> bool:
    """The top-level error handling of a task that ``tfaccel launch`` started (:data:`LAUNCHED_ENV` is ``1``).

    An uncaught ``TfaccelError`` is one line (its type, the user's line that called tfaccel, the message) instead of
    a traceback through tfaccel's internals printed by every worker; ``TFACCEL_TRACEBACK=1`` keeps Python's
    traceback. A ``ConfigError`` then ends the process with :data:`EXIT_CONFIG` (2), after flushing the log handlers,
    standard output and error (``os._exit``: nothing is left to save after a configuration error), so that the
    launcher tells it from a crash and never restarts the job. Other exceptions keep the previous hook and Python's
    exit status 1. ``import tfaccel`` installs it; installing it twice is a no-op.

    Returns:
        Whether the hook is installed.
    """
    env = os.environ if environ is None else environ
    if env.get(LAUNCHED_ENV) != "1":
        return False
    previous = sys.excepthook
    if getattr(previous, "_tfaccel_task_hook", False):
        return True

    def hook(kind: Type[BaseException], exc: BaseException, tb: Optional[TracebackType]) -> None:
        if isinstance(exc, TfaccelError) and os.environ.get(TRACEBACK_ENV, "") in ("", "0"):
            sys.stderr.write(_short_line(kind, exc, tb))
        else:
            previous(kind, exc, tb)
        if isinstance(exc, ConfigError):
            flush_and_exit(EXIT_CONFIG)

    hook._tfaccel_task_hook = True  # type: ignore[attr-defined]
    sys.excepthook = hook
    return True
