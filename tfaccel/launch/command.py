"""The command and environment of a launched task: an argv (never a shell), the server command of ps tasks, and
the environment every task starts from."""

import os
import re
import shlex
import shutil
import sys
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from tfaccel.errors import LAUNCHED_ENV, ConfigError
from tfaccel.job_id import JOB_ID_ENV, launch_job_id
from tfaccel.log import get_logger

__all__ = ["CHILD_DEFAULT_ENV", "server_command", "normalize_command", "script_operand", "child_base_env",
           "warn_inherited_tf_config", "export_job_id"]


# Set in every child unless the caller's environment already has them.
# PYTHONUNBUFFERED: lines reach the launcher as they are written. TFACCEL_OUTPUT_PREFIXED: the launcher
# prefixes every line with the task, so tfaccel's logger in the task does not add a second prefix.
# TFACCEL_EXIT_ON_CONFIG_ERROR: a ConfigError ends the task with exit 2, which the launcher never restarts.
CHILD_DEFAULT_ENV = {"PYTHONUNBUFFERED": "1", "TFACCEL_OUTPUT_PREFIXED": "1", LAUNCHED_ENV: "1"}


def server_command() -> Tuple[str, ...]:
    """The argv of a server task (ps, or worker of a parameter-server cluster)."""
    return (sys.executable, "-m", "tfaccel.launch.server")


def normalize_command(cmd: Union[str, Sequence[str]], *, check_exists: bool = False,
                      env: Optional[Mapping[str, str]] = None) -> Tuple[Tuple[str, ...], List[str]]:
    """Turns a command into an argv (never a shell) and says what it filled in.

    A string is split like a shell would (``shlex``) but never run by one; a first word ending in ``.py`` is run
    with this Python (``sys.executable``).

    Args:
        cmd: the command.
        check_exists: raise when the program is not found here (on ``PATH`` of ``env``, or as a path).
            Defaults to False (e.g. a command for other hosts). An interpreter's script operand is checked too
            (``python nosuch.py``, ``.venv/bin/python3 -u train.py``, ``bash run.sh``; see ``script_operand``).
        env: the environment whose ``PATH`` is searched. Defaults to this process's.

    Returns:
        ``(argv, notes)`` where notes describe what was filled in.

    Raises:
        ConfigError: the command is empty, or (``check_exists``) its program or script is not found.
    """
    argv = shlex.split(cmd) if isinstance(cmd, str) else [str(part) for part in cmd]
    notes = []
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise ConfigError("command: received an empty command; put the program after `--`, e.g. "
                          "`tfaccel launch --workers 2 -- python train.py`")
    if argv[0].endswith(".py"):
        if check_exists and not os.path.isfile(argv[0]):
            raise ConfigError(f"command: script {argv[0]!r} not found (received {shlex.join(argv)!r}, working "
                              f"directory {os.getcwd()}); check the path")
        notes.append(f"{argv[0]} is run with this Python ({sys.executable})")
        argv = [sys.executable] + argv
    elif check_exists:
        path = (env if env is not None else os.environ).get("PATH", os.defpath)
        found = shutil.which(argv[0], path=path) is not None
        if not found and argv[0] in ("python", "python3"):
            # e.g. a PATH with python3 only (no `python` outside a virtual environment): the Python running tfaccel
            notes.append(f"{argv[0]!r} is not on PATH: the script runs with this Python ({sys.executable})")
            argv = [sys.executable] + argv[1:]
        elif not found:
            where = "not an executable file" if os.sep in argv[0] else "not found on PATH"
            raise ConfigError(f"command: program {argv[0]!r} {where} (received {shlex.join(argv)!r}); give its full "
                              "path or install it")
    if check_exists:
        _check_script(argv)
    return tuple(argv), notes


# Interpreters whose first operand is a script file, and their options that take the next word as a value.
_PYTHON_RE = re.compile(r"python(\d+(\.\d+)?)?$")
_SHELLS = ("bash", "sh", "dash", "zsh")
_VALUE_OPTIONS = {"python": ("-W", "-X", "--check-hash-based-pycs"), "shell": ("-o", "+o", "-O", "+O")}


def script_operand(argv: Sequence[str]) -> Optional[str]:
    """The script file an interpreter command runs (``python [options] SCRIPT ...``, ``bash [options] SCRIPT ...``),
    or None: another program, ``python -m MODULE`` / ``-c CODE`` (a module is found by the task's own Python), a
    script read from stdin, or no operand at all."""
    name = os.path.basename(argv[0])
    kind = "python" if _PYTHON_RE.match(name) else "shell" if name in _SHELLS else None
    if kind is None:
        return None
    words = iter(argv[1:])
    for word in words:
        inline = word.startswith(("-c", "-m")) if kind == "python" else (word[:1] == "-" and "c" in word[1:])
        if word in ("-", "--") or inline:
            return None  # stdin, end of options (rare), a module, inline code (`bash -ec '...'` too)
        if word in _VALUE_OPTIONS[kind]:
            next(words, None)
        elif not word.startswith(("-", "+")):
            return word
    return None


def _check_script(argv: Sequence[str]) -> None:
    """Refuses ``python nosuch.py`` (and other interpreters' script operands) before any task starts."""
    script = script_operand(argv)
    if script is not None and not os.path.isfile(script):
        raise ConfigError(f"command: script {script!r} not found (received {shlex.join(argv)!r}, working directory "
                          f"{os.getcwd()}); check the path")


def child_base_env(env: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The environment every task starts from: this process's, without TF_CONFIG, plus defaults and ``env``."""
    base = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    for key, value in CHILD_DEFAULT_ENV.items():
        base.setdefault(key, value)
    base.update(env or {})
    if "TF_CONFIG" in (env or {}):
        raise ConfigError("env: TF_CONFIG cannot be set through env; the launcher gives every task its own. "
                          "Pass a cluster (--cluster FILE) instead")
    return base


def warn_inherited_tf_config() -> None:
    """Says that the launcher's own TF_CONFIG is not passed on (every task gets its own from the cluster)."""
    inherited = os.environ.get("TF_CONFIG")
    if inherited:
        get_logger().warning("launch: TF_CONFIG is set in the launcher's environment (%s); it is not passed on: "
                             "every task gets its own from the cluster. To launch the cluster it describes, save "
                             "its \"cluster\" part to a file and pass --cluster FILE", inherited[:120])


def export_job_id(env: Dict[str, str], job_id: Optional[str], default: Callable[[], str], *,
                  source: Optional[Mapping[str, str]] = None, announce: bool = True) -> str:
    """Sets the launch's job id in ``env`` as ``TFACCEL_JOB_ID``: every task started from ``env`` gets it, every
    restart too (see :mod:`tfaccel.job_id` for where it comes from).

    Args:
        env: the environment the tasks start from (changed in place).
        job_id: the launch's own (``--job-id``), or None.
        default: makes the launcher's own id when neither ``job_id`` nor the environment gives one.
        source: the environment whose ``TFACCEL_JOB_ID`` / ``SLURM_JOB_ID`` count. Defaults to ``env``.
        announce: log the id. Defaults to True.

    Returns:
        The id.

    Raises:
        ConfigError: ``job_id`` or the environment's id is malformed.
    """
    env[JOB_ID_ENV] = launch_job_id(job_id, env if source is None else source, default)
    if announce:
        get_logger().info("launch: job id %s (%s of every task, kept across restarts: backups and the evaluator "
                          "tell jobs apart by it)", env[JOB_ID_ENV], JOB_ID_ENV)
    return env[JOB_ID_ENV]
