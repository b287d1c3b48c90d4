"""Exception types raised by tfaccel.

Every tfaccel error is a ``TfaccelError``. Errors about user input (a cluster file, an option) are also
``ValueError`` so that callers who catch the standard type keep working.
"""

import contextlib
import os
import sys
from typing import Any, Iterable, Optional

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
    """Builds the standard "unknown choice" error: names the thing, shows what was received, lists what is valid.

    Args:
        what: the name of the option or field, e.g. ``"strategy"``.
        received: the value that was given.
        valid: the accepted values.
        hint: an optional suggestion appended to the message.

    Returns:
        A ``ConfigError`` ready to raise.
    """
    msg = f"{what}: unknown value {received!r}; valid values are: {', '.join(repr(v) for v in valid)}"
    if hint:
        msg += f". {hint}"
    return ConfigError(msg)


def exit_on_config_error() -> None:
    """Makes a ``ConfigError`` that reaches the top level end this process with :data:`EXIT_CONFIG` (2), not 1.

    Python's own hook prints the traceback first, as always; then standard output and error are flushed and the
    process ends with status 2 (``os._exit``: the interpreter's clean-up, TensorFlow's included, is skipped; nothing
    is left to save after a configuration error). Any other exception keeps Python's exit status 1. ``import
    tfaccel`` installs it in the tasks that ``tfaccel launch`` starts (:data:`LAUNCHED_ENV`), so that the launcher
    can tell a configuration error from a crash and does not restart the job. Installing it twice is a no-op.
    """
    previous = sys.excepthook
    if getattr(previous, "_tfaccel_config_exit", False):
        return

    def hook(exc_type: type, exc: BaseException, tb: Any) -> None:
        previous(exc_type, exc, tb)
        if isinstance(exc_type, type) and issubclass(exc_type, ConfigError):
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(EXIT_CONFIG)

    hook._tfaccel_config_exit = True  # type: ignore[attr-defined]
    sys.excepthook = hook
