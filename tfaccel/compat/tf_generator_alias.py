"""A ``PyDataset`` or a generator under several replicas: TensorFlow writes into the arrays it yields.

Upstream: not reported that we could find (searched tensorflow/tensorflow and keras-team/keras issues for in-place
writes through ``from_generator`` under ``MirroredStrategy``, 2026-11-30). Seen on TensorFlow 2.21.0 with Keras
3.15.1, here.

Keras' fit reads a ``keras.utils.PyDataset`` and a Python generator through ``tf.data.Dataset.from_generator``,
which turns the numpy arrays the user's code returns into tensors without copying them. Under a strategy of
several replicas the distributed dataset splits each batch along axis 0; the first replica's part stays a view of
that same memory, and ops in the step that may reuse an input's buffer for their output (TensorFlow's buffer
forwarding) then write into it. The user's own arrays change: with ``__getitem__`` returning ``y[i*8:(i+1)*8]``,
the first replica's rows of every other batch held intermediate values of the loss after fit (rows 0-3, 16-19,
32-35 of 40 in one run, 8-11 and 24-27 in another, none in a third), and the next epochs trained on them. Plain
``fit`` under ``tf.distribute.MirroredStrategy`` gave a different history from run to run because of it (3 outcomes
in 6 runs), and so does TensorFlow alone (``from_generator`` yielding views, ``experimental_distribute_dataset``,
``strategy.run`` of ``tf.square(y - 1.0)``). One replica never showed it (no split).

The fix copies every numpy array of a batch, as the adapters hand it to TensorFlow: ``PyDatasetAdapter`` (its
``_standardize_batch``, which every ``PyDataset`` batch goes through) and ``GeneratorDataAdapter`` (the generator
it reads). A batch that is already a copy costs one more copy (a memcpy per batch). Not covered: a
``tf.data.Dataset.from_generator`` of the user's own, which tfaccel does not build; its generator should yield
copies (``docs/guides/keras-parity.md``). ``tfaccel.train.loops.keras_fit`` applies it for every Keras fit over
several replicas; ``TFACCEL_DISABLE_COMPAT=tf_generator_alias`` switches it off.
"""

import threading
from typing import Any, Callable, Dict, Iterator, Optional

import keras
import numpy as np
import tensorflow as tf
from keras.src.trainers.data_adapters import generator_data_adapter, py_dataset_adapter

from tfaccel.compat import VersionWindow, gate, switched_off
from tfaccel.log import get_logger

__all__ = ["NAME", "UPSTREAM_ISSUES", "AFFECTED_VERSIONS", "why_not_needed", "is_needed", "apply", "remove",
           "is_applied", "copy_arrays"]

NAME = "tf_generator_alias"
UPSTREAM_ISSUES = ()  # none found; the module's docstring says what was searched
# [first affected, first version not known to be affected) of TensorFlow: seen on 2.21 only.
AFFECTED_VERSIONS: VersionWindow = ((2, 21), (2, 22))
_MARK = "_tfaccel_copies_batches"

_lock = threading.Lock()
_originals: Dict[str, Any] = {}


def _adapters() -> Any:
    """Keras' two adapters that feed ``from_generator``."""
    return py_dataset_adapter.PyDatasetAdapter, generator_data_adapter.GeneratorDataAdapter


def copy_arrays(batch: Any) -> Any:
    """``batch`` with every numpy array in it replaced by a copy that owns its memory (other leaves as they are)."""
    return keras.tree.map_structure(lambda leaf: np.array(leaf, copy=True) if isinstance(leaf, np.ndarray) else leaf,
                                    batch)


def why_not_needed() -> Optional[str]:
    """Why the fix is left alone here (switched off, another TensorFlow, the adapters changed), or None."""
    reason = gate(NAME, "TensorFlow", tf.__version__, AFFECTED_VERSIONS,
                  "a PyDataset's arrays change during fit under several replicas, see tfaccel.compat.tf_generator_alias")
    if reason is not None:
        return reason
    py_dataset, generator = _adapters()
    if "_standardize_batch" not in py_dataset.__dict__ or "get_tf_dataset" not in generator.__dict__:
        return ("keras/src/trainers/data_adapters no longer has PyDatasetAdapter._standardize_batch or "
                "GeneratorDataAdapter.get_tf_dataset; the code this fix wraps has changed, not patching")
    return None


def is_needed() -> bool:
    """True when the installed TensorFlow and Keras are ones this fix is known to be needed on."""
    return why_not_needed() is None


def is_applied() -> bool:
    """True while the fix is in place."""
    return bool(_originals)


def _make_standardize(original: Callable) -> Callable:
    def _standardize_batch(self: Any, batch: Any) -> Any:
        return copy_arrays(original(self, batch))

    _standardize_batch.__doc__ = f"tfaccel fix {NAME}: copies the arrays of each batch (see tfaccel.compat.{NAME})."
    return _standardize_batch


def _copying(generator: Callable[[], Iterator[Any]]) -> Callable[[], Iterator[Any]]:
    def batches() -> Iterator[Any]:
        for batch in generator():
            yield copy_arrays(batch)

    setattr(batches, _MARK, True)
    return batches


def _make_get_tf_dataset(original: Callable) -> Callable:
    def get_tf_dataset(self: Any) -> Any:
        if not getattr(self.generator, _MARK, False):
            self.generator = _copying(self.generator)
        return original(self)

    get_tf_dataset.__doc__ = f"tfaccel fix {NAME}: the generator's batches are copied (see tfaccel.compat.{NAME})."
    return get_tf_dataset


def apply() -> bool:
    """Puts the fix in place (idempotent).

    Returns:
        True when the fix is in place after the call, False when it was not applied (the reason is logged).
    """
    with _lock:
        if _originals:
            return True
        reason = why_not_needed()
        if reason is not None:
            level = get_logger().warning if reason.startswith(switched_off(NAME)) else get_logger().info
            level("compat fix %s not applied: %s", NAME, reason)
            return False
        py_dataset, generator = _adapters()
        _originals["_standardize_batch"] = py_dataset.__dict__["_standardize_batch"]
        _originals["get_tf_dataset"] = generator.__dict__["get_tf_dataset"]
        py_dataset._standardize_batch = _make_standardize(_originals["_standardize_batch"])
        generator.get_tf_dataset = _make_get_tf_dataset(_originals["get_tf_dataset"])
        return True


def remove() -> bool:
    """Restores Keras' own methods; True when something was restored."""
    with _lock:
        if not _originals:
            return False
        py_dataset, generator = _adapters()
        py_dataset._standardize_batch = _originals.pop("_standardize_batch")
        generator.get_tf_dataset = _originals.pop("get_tf_dataset")
        return True
