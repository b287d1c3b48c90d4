"""tfaccel: take a Keras model from one CPU to many GPUs, many hosts or a TPU without rewriting it.

Importing tfaccel is cheap: TensorFlow is imported only when a name that needs it is first used.

Example:
    >>> import tfaccel
    >>> tfaccel.__version__  # doctest: +SKIP
    '0.1.0'
"""

from tfaccel._lazy import lazy_exports
from tfaccel._version import __version__
from tfaccel.errors import (EXIT_CONFIG, EXIT_PREEMPTED, BackendUnavailableError, ConfigError, DeviceError, Preempted,
                            TfaccelError, install_task_excepthook)
from tfaccel.resilience import exiting as _exiting  # noqa: F401 - its exit handler first: it runs after the others

# Public name -> module that defines it (loaded on first use, so `import tfaccel` does not import TensorFlow).
_LAZY = {
    "env_report": "tfaccel.report",
    "configure_devices": "tfaccel.devices",
    "detect_devices": "tfaccel.devices",
    "DeviceInfo": "tfaccel.devices",
    "get_logger": "tfaccel.log",
    "is_chief": "tfaccel.log",
    "configure_logging": "tfaccel.log",
    "ClusterSpec": "tfaccel.cluster",
    "TaskInfo": "tfaccel.cluster",
    "ClusterConfigError": "tfaccel.cluster",
    "task_from_env": "tfaccel.cluster",
    "get_strategy": "tfaccel.strategies",
    "get_backend": "tfaccel.strategies",
    "set_precision": "tfaccel.precision",
    "Plan": "tfaccel.plan",
    "resolve_plan": "tfaccel.plan",
    "load_dataset": "tfaccel.datasets",
    "DATASET_NAMES": "tfaccel.datasets",
    "get_model_builder": "tfaccel.models",
    "MODEL_NAMES": "tfaccel.models",
    "estimate_memory": "tfaccel.memory",
    "scope": "tfaccel.train.scope",
    "fit": "tfaccel.train.api",
    "compile_and_fit": "tfaccel.train.api",
    "FitResult": "tfaccel.train.api",
    "doctor": "tfaccel.divergence.api",
}

__all__ = ["__version__", "TfaccelError", "ConfigError", "DeviceError", "BackendUnavailableError", "Preempted",
           "EXIT_PREEMPTED", "EXIT_CONFIG", *_LAZY]

# Under `tfaccel launch` only: a tfaccel error is one line per worker, not a traceback, and a ConfigError exits 2
# (the launcher never restarts it).
install_task_excepthook()
__getattr__, __dir__ = lazy_exports("tfaccel", globals(), _LAZY, __all__)
