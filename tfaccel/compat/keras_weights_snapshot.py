"""Keras' ``.weights.h5`` file in two halves: every value copied to host memory, then the file written from the copy.

``model.save_weights(path)`` reads each variable and writes it to the file in one pass, so the training step waits for
the disk. An asynchronous backup needs the reading (quick, at the step the backup belongs to) apart from the writing
(slow, in a background thread while training goes on). Keras 3 has no public way to split them, so
:func:`snapshot_weights` walks the model with Keras' own ``saving_lib._save_state`` (the walk ``save_weights`` does:
layers, the optimizer, nested saveables, each entry's name metadata) into a store that keeps copies, and
:func:`write_weights` replays the copies into Keras' ``H5IOStore``: the same groups, datasets and attributes as
``save_weights`` writes, which ``load_weights`` reads. Checked on Keras 3.15.1 (``CHECKED_ON``);
tests/strategies/test_compat_keras_weights_snapshot.py fails when those internals move or the file differs from
``save_weights``'.

A variable's value is kept as the tensor TensorFlow reads (no copy: TensorFlow's variables copy their buffer before an
update while a read of it is alive, so the tensor keeps the value of the moment it was read); the arrays Keras makes
for the save (the optimizer's ``variable.numpy()``, a copy) are kept as they are, other values copied.

Keras 3.15.1's ``get_attr_skipset`` caches each skip set under a key it never reads (it stores
``saving_attr_skipset_<type>`` and looks up ``saving_attr_skiplist_<type>``), so every saveable of every save builds
a throwaway ``Layer`` to learn which attributes to skip: about 1 s of a 1.5 s ResNet50 walk here. No upstream issue
names it (searched 2026-11-28). :func:`snapshot_weights` stores each set under the key Keras reads: the sets are the
ones Keras computes, only the rebuilding is saved (``save_weights`` gains the same).
"""

from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf
from keras import Variable, ops
from keras.src.backend.common import global_state
from keras.src.saving import saving_lib

__all__ = ["CHECKED_ON", "WeightsSnapshot", "snapshot_weights", "write_weights"]

CHECKED_ON = {"keras": "3.15.1"}
# The saveable types get_attr_skipset knows (Keras 3.15.1's list).
_SKIPSET_TYPES = ("Operation", "Layer", "Functional", "Sequential", "Metric", "Optimizer", "Loss", "Cross", "Feature")


class WeightsSnapshot:
    """The values ``save_weights`` would write, as host copies taken at one moment (``nbytes``: their size)."""

    def __init__(self) -> None:
        self.entries: List[Tuple[str, Optional[Dict[str, Any]], List[Tuple[str, Any]]]] = []

    @property
    def nbytes(self) -> int:
        return sum(value.nbytes if isinstance(value, np.ndarray) else int(np.prod(value.shape)) * value.dtype.size
                   for _, _, values in self.entries for _, value in values)


class _Entry:
    """What a layer's ``save_own_variables(store)`` writes into: ``store[key] = value`` keeps a copy."""

    def __init__(self, values: List[Tuple[str, Any]]) -> None:
        self._values = values

    def __setitem__(self, key: str, value: Any) -> None:
        if isinstance(value, (Variable, tf.Variable)):
            self._values.append((key, tf.convert_to_tensor(value)))  # a read: the value now, whatever comes next
        elif isinstance(value, np.ndarray):  # made for this save (the optimizer's variable.numpy(): a copy)
            self._values.append((key, value))
        else:
            self._values.append((key, np.array(ops.convert_to_numpy(value))))

    def __len__(self) -> int:
        return len(self._values)

    def __contains__(self, key: str) -> bool:
        return any(name == key for name, _ in self._values)

    def keys(self) -> List[str]:
        return [name for name, _ in self._values]


class _Recorder(saving_lib.H5IOStore):
    """A write-mode store without a file: ``_save_state`` accepts only H5IOStore-like stores (an isinstance check)."""

    def __init__(self, snapshot: WeightsSnapshot) -> None:  # no super().__init__: it would open an h5 file
        self.mode, self.snapshot = "w", snapshot

    def __bool__(self) -> bool:
        return True

    def make(self, path: str, metadata: Optional[Dict[str, Any]] = None) -> Any:
        values: List[Tuple[str, Any]] = []
        self.snapshot.entries.append((path, dict(metadata) if metadata else None, values))
        return _Entry(values)

    def close(self) -> None:
        pass


def snapshot_weights(model: Any) -> WeightsSnapshot:
    """Copies every value ``model.save_weights`` would write (weights, optimizer state) into host memory.

    Raises:
        ValueError: Keras' own, for a model that is not built.
    """
    if not model.built:
        raise ValueError("You are saving a model that has not yet been built. Try building the model first by "
                         "calling it on some data or by using `build()`.")
    _cache_skipsets()
    snapshot = WeightsSnapshot()
    saving_lib._save_state(model, weights_store=_Recorder(snapshot), assets_store=None, inner_path="",
                           visited_saveables=set())
    return snapshot


def _cache_skipsets() -> None:
    """Stores each skip set where Keras 3.15.1 looks it up (see the module doc); a no-op once done."""
    for obj_type in _SKIPSET_TYPES:
        if global_state.get_global_attribute(f"saving_attr_skiplist_{obj_type}", None) is None:
            global_state.set_global_attribute(f"saving_attr_skiplist_{obj_type}",
                                              saving_lib.get_attr_skipset(obj_type))


def write_weights(snapshot: WeightsSnapshot, path: str) -> None:
    """Writes ``snapshot`` to ``path`` (a ``.weights.h5`` file) exactly as ``save_weights`` lays it out."""
    store = saving_lib.H5IOStore(path, mode="w")
    try:
        for inner_path, metadata, values in snapshot.entries:
            entry = store.make(inner_path, metadata=metadata)
            for key, value in values:
                entry[key] = np.asarray(value)  # a tensor's own buffer, no copy (it lives until the write ends)
    finally:
        store.close()
