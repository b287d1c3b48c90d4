"""What of the launcher's environment reaches processes that run elsewhere or whose command line others can read.

A Ray Train run carries the job's variables inside Ray's ``train_loop_config`` (kept by Ray, sent to every node),
and a private local Ray instance's workers inherit the driver's environment; ``horovodrun`` writes every variable
of its own environment onto each rank's command line (``env K=V ... CMD``, readable by every user of the host
through ``ps``, and sent over ssh to other hosts). So these launches pass an *allowlist*, never the whole
environment: ``TFACCEL_*`` and ``TF_*`` (but not ``TF_CONFIG``, set per task), the variables the launch sets
itself, and the names the user gives with ``--env NAME``. Secrets such as ``AWS_SECRET_ACCESS_KEY`` stay home
unless named. Processes that must run on this machine also keep what running a program needs (``PATH``,
``HOME``, ``PYTHONPATH``, ``LD_LIBRARY_PATH``, locale, ``CUDA_*`` ...): :func:`runtime_env`.
"""

import os
import re
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from tfaccel.errors import ConfigError

__all__ = ["JOB_PREFIXES", "RUNTIME_NAMES", "RUNTIME_PREFIXES", "check_env_names", "job_env", "runtime_env",
           "left_out"]

JOB_PREFIXES: Tuple[str, ...] = ("TFACCEL_", "TF_")
NEVER_FORWARDED = frozenset({"TF_CONFIG"})  # every task gets its own
# What a program needs to start and find its libraries on this machine (never credentials).
RUNTIME_NAMES = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP",
                           "TMP", "PYTHONPATH", "PYTHONHOME", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE",
                           "PYTHONHASHSEED",
                           "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "LD_LIBRARY_PATH", "HOSTNAME", "TERM",
                           "PWD"})
RUNTIME_PREFIXES: Tuple[str, ...] = ("LC_", "CUDA_", "NVIDIA_", "XLA_", "OMP_", "MKL_", "KMP_", "NCCL_")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def check_env_names(names: Iterable[str], environ: Optional[Mapping[str, str]] = None, *,
                    option: str = "--env") -> Tuple[str, ...]:
    """Validates the names given with ``--env NAME``: well-formed, set here, not TF_CONFIG.

    Raises:
        ConfigError: a name is malformed, not set in ``environ`` or is TF_CONFIG.

    Example:
        >>> check_env_names(["EPOCHS"], {"EPOCHS": "2"})
        ('EPOCHS',)
    """
    env = os.environ if environ is None else environ
    out: List[str] = []
    for name in names:
        if not isinstance(name, str) or not _NAME_RE.match(name):
            shown = repr(name)[:80]
            raise ConfigError(f"{option} {shown}: not an environment variable name; valid: letters, digits and '_', "
                              "not starting with a digit, e.g. --env WANDB_API_KEY")
        if name in NEVER_FORWARDED:
            raise ConfigError(f"{option} {name}: the launcher gives every task its own TF_CONFIG; drop it")
        if name not in env:
            raise ConfigError(f"{option} {name}: not set in this environment, so there is nothing to pass on; "
                              f"export {name}=... first, or drop {option} {name}")
        if name not in out:
            out.append(name)
    return tuple(out)


def job_env(environ: Optional[Mapping[str, str]] = None, names: Sequence[str] = (),
            defaults: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The job's variables that travel with it: ``TFACCEL_*``, ``TF_*`` (not TF_CONFIG), ``defaults`` (the launch's
    own, overridden by the environment's) and ``names``.

    Example:
        >>> job_env({"TF_CPP_MIN_LOG_LEVEL": "2", "AWS_SECRET_ACCESS_KEY": "s", "EPOCHS": "2", "PATH": "/bin"},
        ...         names=["EPOCHS"])
        {'TF_CPP_MIN_LOG_LEVEL': '2', 'EPOCHS': '2'}
    """
    env = os.environ if environ is None else environ
    out = dict(defaults or {})
    for key, value in env.items():
        if (key.startswith(JOB_PREFIXES) and key not in NEVER_FORWARDED) or key in names or key in out:
            out[key] = value
    return out


def runtime_env(environ: Optional[Mapping[str, str]] = None, names: Sequence[str] = (),
                defaults: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """:func:`job_env` plus what a process needs to run on this machine (:data:`RUNTIME_NAMES`, ``LC_*``,
    ``CUDA_*`` ...): the environment of a process started here that passes its own on (a private Ray instance,
    ``horovodrun``).

    Example:
        >>> sorted(runtime_env({"PATH": "/bin", "HF_TOKEN": "t", "LC_ALL": "C", "TFACCEL_X": "1"}))
        ['LC_ALL', 'PATH', 'TFACCEL_X']
    """
    env = os.environ if environ is None else environ
    out = {k: v for k, v in env.items() if k in RUNTIME_NAMES or k.startswith(RUNTIME_PREFIXES)}
    out.update(job_env(env, names, defaults))
    return out


def left_out(environ: Mapping[str, str], kept: Mapping[str, str], limit: int = 6) -> str:
    """``"3 variable(s) (AWS_SECRET_ACCESS_KEY, EPOCHS, HF_TOKEN)"``: the names of ``environ`` not in ``kept``
    (names only, never values), for a log line; empty when none is left out."""
    names = sorted(k for k in environ if k not in kept and k not in NEVER_FORWARDED)
    if not names:
        return ""
    shown = ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")
    return f"{len(names)} variable(s) ({shown})"
