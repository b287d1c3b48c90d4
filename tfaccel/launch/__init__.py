"""Process launching: local loopback clusters, one host's task, horovodrun.

Example:
    >>> from tfaccel.launch import run_local
    >>> result = run_local(["python", "train.py"], workers=2)  # doctest: +SKIP
    >>> result.returncode, [(t.name, t.returncode) for t in result.tasks]  # doctest: +SKIP
    (0, [('worker:0', 0), ('worker:1', 0)])

Importing this package does not import TensorFlow.
"""

from typing import Any

__all__ = ["run_local", "run_host", "LaunchResult", "TaskOutcome", "LaunchTask"]

_LAZY = {"run_local": "tfaccel.launch.local", "run_host": "tfaccel.launch.host",
         "LaunchResult": "tfaccel.launch.supervisor", "TaskOutcome": "tfaccel.launch.supervisor",
         "LaunchTask": "tfaccel.launch.supervisor"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tfaccel.launch' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(__all__)
