"""Exception types raised by tfaccel.

Every tfaccel error is a ``TfaccelError``. Errors about user input (a cluster file, an option) are also
``ValueError`` so that callers who catch the standard type keep working.
"""

from typing import Iterable, Optional

EXIT_PREEMPTED = 75
"""The exit status of a process that stopped because it was preempted (SIGTERM, or ``TFACCEL_PREEMPTION_SIGNAL``)
after every worker agreed on a step and the chief wrote a backup there (or found nothing to save: no ``backup_dir``).

75 is sysexits.h's EX_TEMPFAIL, "a temporary failure; the user is invited to retry": ``tfaccel launch`` restarts
such a job from its backup without counting it against ``--max-restarts`` (``--count-preemptions`` counts it), and
a scheduler can requeue on it (a Kubernetes Job's ``podFailurePolicy`` ``onExitCodes: [75]``, SLURM ``scontrol
requeue``)."""


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
