"""Process launching: local loopback clusters, one host's task, horovodrun, Ray Train.

Example:
    >>> from tfaccel.launch import run_local
    >>> result = run_local(["python", "train.py"], workers=2)  # doctest: +SKIP
    >>> result.returncode, [(t.name, t.returncode) for t in result.tasks]  # doctest: +SKIP
    (0, [('worker:0', 0), ('worker:1', 0)])

Importing this package does not import TensorFlow.
"""

from tfaccel._lazy import lazy_exports

__all__ = ["run_local", "run_host", "run_ray", "LaunchResult", "TaskOutcome", "LaunchTask"]

_LAZY = {"run_local": "tfaccel.launch.local", "run_host": "tfaccel.launch.host", "run_ray": "tfaccel.launch.ray",
         "LaunchResult": "tfaccel.launch.outcome", "TaskOutcome": "tfaccel.launch.outcome",
         "LaunchTask": "tfaccel.launch.outcome"}


__getattr__, __dir__ = lazy_exports("tfaccel.launch", globals(), _LAZY, __all__)
