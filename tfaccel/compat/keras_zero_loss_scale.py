"""Saving mixed_float16's ``LossScaleOptimizer`` whose inner optimizer is sharded (``tfaccel.train.zero``).

Keras 3.15's ``LossScaleOptimizer.variables`` is its own variables (the loss scale, its step counter) followed by
the inner optimizer's, and it saves and loads them all itself, under ``optimizer/vars``, besides the inner optimizer
saving its own under ``optimizer/inner_optimizer/vars`` (seen on Keras 3.15.1 / TensorFlow 2.21.0). The inner
optimizer's sharded saving (:mod:`tfaccel.compat.keras_zero`: every slot gathered from its owner for ``model.save``,
or left empty within ``slots_apart`` for tfaccel's backups) is then bypassed for ``optimizer/vars``: under
multi_worker the chief's file held its own slots and empty stand-ins for the other workers', and a backup's weights
file did not load on another worker (measured: ``optimizer/vars/10 has shape (32, 16) in the backup, (0,) in this
model``).

The subclass swapped onto the instance here (same name and module, so a saved ``.keras`` file names Keras' class)
saves and loads its own variables as Keras does and hands the inner optimizer's part of ``optimizer/vars`` to the
inner optimizer's own ``save_own_variables`` / ``load_own_variables``, so both paths of the file hold what the
sharded optimizer writes: the whole state in a ``.keras`` file that plain Keras loads, the slots left apart in a
backup. It reads the private ``_variables``; tests/training/test_zero_workers.py fails when it moves.
"""

from typing import Any, Dict, List

import keras

__all__ = ["save_through_inner", "saves_through_inner"]

_PATCHED: Dict[type, type] = {}


class _Shifted:
    """The inner optimizer's part of the ``LossScaleOptimizer``'s store: key ``k`` is the store's ``offset + k``."""

    def __init__(self, store: Any, offset: int, count: int) -> None:
        self.store, self.offset, self.count = store, offset, count

    def keys(self) -> List[str]:
        return [str(k) for k in range(self.count)]

    def __getitem__(self, key: str) -> Any:
        return self.store[str(self.offset + int(key))]


class _SavesThroughInner:
    """Mixed in before ``LossScaleOptimizer`` (see the module doc)."""

    def save_own_variables(self, store: Any) -> None:
        own = list(self._variables)  # type: ignore[attr-defined]
        for i, variable in enumerate(own):
            store[str(i)] = variable.numpy()
        inner: Dict[str, Any] = {}
        self.inner_optimizer.save_own_variables(inner)  # type: ignore[attr-defined]
        for key, value in inner.items():
            store[str(len(own) + int(key))] = value

    def load_own_variables(self, store: Any) -> None:
        own = list(self._variables)  # type: ignore[attr-defined]
        inner = self.inner_optimizer  # type: ignore[attr-defined]
        if len(store.keys()) != len(own) + len(inner.variables):
            super().load_own_variables(store)  # type: ignore[misc]  # Keras' own warning when the count differs
            return
        for i, variable in enumerate(own):
            variable.assign(store[str(i)])
        inner.load_own_variables(_Shifted(store, len(own), len(inner.variables)))


def save_through_inner(optimizer: Any) -> None:
    """Swaps the subclass onto ``optimizer`` (a ``LossScaleOptimizer`` whose inner optimizer is sharded), in place."""
    if not isinstance(optimizer, keras.optimizers.LossScaleOptimizer) or saves_through_inner(optimizer):
        return
    base = type(optimizer)
    if base not in _PATCHED:
        _PATCHED[base] = type(base.__name__, (_SavesThroughInner, base),
                              {"__module__": base.__module__, "__qualname__": base.__qualname__})
    optimizer.__class__ = _PATCHED[base]


def saves_through_inner(optimizer: Any) -> bool:
    """Whether :func:`save_through_inner` was applied to ``optimizer``."""
    return isinstance(optimizer, _SavesThroughInner)
