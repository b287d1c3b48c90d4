"""What ``tfaccel launch`` (and the schedulers' scripts) and the training processes agree on through the environment.

The preemption signal and timeout (read by the training processes, set by the launcher, the Kubernetes manifest and
SLURM's ``--signal``) and the elastic range of workers (set by ``tfaccel launch --workers MIN:MAX``). The launcher
and ``tfaccel k8s manifest`` import this module, so it must not import TensorFlow or Keras.
"""

import os
import signal
from typing import Mapping, Optional, Tuple

from tfaccel.errors import ConfigError

__all__ = ["SIGNAL_ENV", "TIMEOUT_ENV", "CHECK_EVERY_ENV", "DEFAULT_TIMEOUT_S", "env_number", "preemption_signals",
           "ELASTIC_ENV", "RESIZE_REASON_ENV", "RESIZE_FROM_ENV", "parse_workers_range", "elastic_range"]

SIGNAL_ENV = "TFACCEL_PREEMPTION_SIGNAL"
TIMEOUT_ENV = "TFACCEL_PREEMPTION_TIMEOUT"
CHECK_EVERY_ENV = "TFACCEL_PREEMPTION_CHECK_EVERY"
# Seconds from the signal to an agreed, saved step before the process gives up (GCE spot and Kubernetes give 30 s).
DEFAULT_TIMEOUT_S = 25.0

ELASTIC_ENV = "TFACCEL_ELASTIC"  # "MIN:MAX", set by `tfaccel launch --workers MIN:MAX` in every task
RESIZE_REASON_ENV = "TFACCEL_RESIZE_REASON"  # why this attempt runs on another number of workers than the last
RESIZE_FROM_ENV = "TFACCEL_RESIZE_FROM"  # the workers of the last attempt (for a restart before any backup)


def parse_workers_range(text: str, *, field: str = "--workers") -> Tuple[int, int]:
    """``"2:3"`` -> ``(2, 3)``; ``"3"`` -> ``(3, 3)``.

    Raises:
        ConfigError: not ``N`` or ``MIN:MAX`` with 1 <= MIN <= MAX (names ``field`` and what was received).

    Example:
        >>> parse_workers_range("2:4")
        (2, 4)
    """
    parts = str(text).strip().split(":")
    try:
        low, high = (int(parts[0]), int(parts[-1])) if len(parts) in (1, 2) else (0, -1)
    except ValueError:
        low, high = 0, -1
    if not 1 <= low <= high:
        raise ConfigError(f"{field}: expected a number of workers N or a range MIN:MAX with 1 <= MIN <= MAX; "
                          f"received {str(text)[:40]!r}; e.g. {field} 2:4 (start on 4, go on with no fewer than 2)")
    return low, high


def elastic_range(environ: Optional[Mapping[str, str]] = None) -> Optional[Tuple[int, int]]:
    """The ``(MIN, MAX)`` workers of an elastic job from ``TFACCEL_ELASTIC``, or None outside one."""
    value = (os.environ if environ is None else environ).get(ELASTIC_ENV)
    return parse_workers_range(value, field=ELASTIC_ENV) if value else None


def env_number(name: str, default: float, *, low: float, whole: bool) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw) if whole else float(raw)
    except ValueError:
        value = low - 1
    if value < low:
        kind = "a whole number" if whole else "a number of seconds"
        raise ConfigError(f"{name} must be {kind} >= {low:g}; received {raw[:40]!r}. Unset it for the default "
                          f"({default:g})")
    return value


def preemption_signals() -> Tuple[int, ...]:
    """SIGTERM, plus the signal ``TFACCEL_PREEMPTION_SIGNAL`` names (``USR1``, ``SIGUSR1`` or a number).

    Raises:
        ConfigError: the variable names no catchable signal (received value and examples shown).
    """
    raw = os.environ.get(SIGNAL_ENV, "").strip()
    if not raw:
        return (int(signal.SIGTERM),)
    name = raw.upper() if raw.upper().startswith("SIG") else f"SIG{raw.upper()}"
    try:
        sig = signal.Signals(int(raw)) if raw.isdigit() else signal.Signals[name]
    except (KeyError, ValueError):
        sig = None
    if sig is None or sig in (signal.SIGKILL, signal.SIGSTOP):
        raise ConfigError(f"{SIGNAL_ENV} must name a signal tfaccel can catch; received {raw[:40]!r}. Valid: a name "
                          "such as USR1, SIGUSR2, INT, or its number (not KILL or STOP); e.g. with SLURM's "
                          f"--signal=USR1@60 set {SIGNAL_ENV}=USR1")
    return tuple(sorted({int(signal.SIGTERM), int(sig)}))
