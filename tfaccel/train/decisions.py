"""The decision cache: figures ``"auto"`` measured on a job, kept on disk so the next run of it decides at once.

One JSON file per key (the model's signature, the strategy and its devices, the batch size, the loop, and the
TensorFlow and Keras versions), in ``$TFACCEL_CACHE_DIR/decisions/`` (default ``~/.cache/tfaccel/decisions/``).
Files are written atomically; a file that cannot be read as a record is ignored with a warning (and replaced by
the next record). Clear it with ``tfaccel cache clear`` or ``rm -r ~/.cache/tfaccel/decisions``.
"""

import hashlib
import json
import os
from typing import Any, Dict, Optional

import keras
import tensorflow as tf

from tfaccel.compat.keras_internals import flatten_layers
from tfaccel.devices import detect_devices
from tfaccel.log import get_logger
from tfaccel.resilience.atomic_io import atomic_write_text

__all__ = ["CACHE_ENV", "cache_dir", "job_key", "read_record", "write_record", "clear"]

CACHE_ENV = "TFACCEL_CACHE_DIR"
_FORMAT = 1


def cache_dir() -> str:
    """``$TFACCEL_CACHE_DIR/decisions``, else ``~/.cache/tfaccel/decisions``."""
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "tfaccel")
    return os.path.join(root, "decisions")


def job_key(model: Any, *, backend: Any, batch_size: int, loop: str) -> Optional[Dict[str, Any]]:
    """What a record is measured on; None where the model has no weights yet (nothing to tell it by).

    The model's signature is its class, its layers' classes, each weight's shape and dtype, and its optimizer's class.
    """
    weights = [(tuple(int(d) for d in w.shape), str(w.dtype)) for w in model.weights]
    if not weights:
        return None
    layers = [type(layer).__qualname__ for layer in flatten_layers(model)]  # not their names: Keras numbers them
    signature = json.dumps([type(model).__qualname__, layers, weights, type(model.optimizer).__name__])
    devices = detect_devices()
    return {"model": hashlib.sha256(signature.encode()).hexdigest()[:24], "model_class": type(model).__qualname__,
            "strategy": backend.describe(), "replicas": backend.num_replicas_in_sync, "gpus": devices.num_gpus,
            "cpus": os.cpu_count(), "batch_size": batch_size, "loop": loop, "tensorflow": tf.__version__,
            "keras": keras.__version__, "format": _FORMAT}


def _path(key: Dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return os.path.join(cache_dir(), f"{digest}.json")


def read_record(key: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The figures cached for ``key``; None where there are none, or the file is not a record (a warning)."""
    if key is None:
        return None
    path = _path(key)
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        figures = data["figures"]
        if data.get("key") != key or not all(isinstance(figures[k][f], (int, float)) for k in ("jit_off", "jit_on")
                                             for f in ("overhead_s", "step_s")):
            raise ValueError("its key or figures are not this job's")
        return figures
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        get_logger().warning("decision cache: ignoring %s, which is not a readable record (%s); it will be "
                             "replaced by this job's figures", path, str(exc)[:200])
        return None


def write_record(key: Optional[Dict[str, Any]], figures: Dict[str, Any]) -> Optional[str]:
    """Writes ``figures`` for ``key`` atomically; returns the file's path (None: not written, with a warning)."""
    if key is None:
        return None
    path = _path(key)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write_text(path, json.dumps({"key": key, "figures": figures}, indent=1, sort_keys=True))
    except OSError as exc:
        get_logger().warning("decision cache: could not write %s (%s); the next run measures again", path, exc)
        return None
    return path


def clear() -> int:
    """Removes every record of the decision cache; returns how many files were removed."""
    directory, removed = cache_dir(), 0
    if not os.path.isdir(directory):
        return 0
    for name in os.listdir(directory):
        if name.endswith(".json") or name.startswith(".tmp-"):
            os.unlink(os.path.join(directory, name))
            removed += 1
    return removed
