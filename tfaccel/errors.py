"""Exception types raised by tfaccel.

Every tfaccel error is a ``TfaccelError``. Errors about user input (a cluster file, an option) are also
``ValueError`` so that callers who catch the standard type keep working.
"""

from typing import Iterable, Optional


class TfaccelError(Exception):
    """Base class of every error tfaccel raises on purpose."""


class ConfigError(TfaccelError, ValueError):
    """Bad user input: an option, a cluster description, a TF_CONFIG, an environment variable."""


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
