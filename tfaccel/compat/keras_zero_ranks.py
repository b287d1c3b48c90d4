"""Optimizer-state sharding (ZeRO-1) where every process is one replica and the collectives are given (Horovod).

The sharded optimizer of :mod:`tfaccel.compat.keras_zero` with three parts replaced (Keras 3.15.1 / TensorFlow
2.21.0): the owners are the ranks (``partition`` over ``size`` ranks, the same on every rank); the slots of a
variable this rank does not own are empty stand-ins, made without a ``tf.distribute`` placement (the process runs
TensorFlow's default strategy); and the update, for the gradients of one step:

* every gradient is averaged over the ranks with one grouped all-reduce (``collectives.average``; measured cheaper
  here than Horovod's reduce-scatter of a flat buffer laid out by owner, see docs/guides/horovod.md; a sparse one,
  an Embedding table's, all-gathered as slices), so the optimizer's own ``_clip_gradients`` sees every averaged
  gradient: ``clipnorm`` per variable and ``global_clipnorm`` over the global norm, as ``model.fit`` clips;
* a variable left unsharded (``keras_zero.leave_unsharded``: an Embedding table) keeps its full slots on every rank,
  and every rank updates it;
* the owner runs the optimizer's own ``update_step`` on its variables (learning rate and iteration counter computed
  the same on every rank);
* each rank's updated variables, flattened into one buffer per dtype, are all-gathered (``collectives.gather``,
  rank order) and every rank assigns the others' values.

Every collective is named, so that ranks whose graphs differ (each updates its own variables) still match them.
``model.save`` of such an optimizer is a collective (every rank calls it: the file holds every slot, summed from
the owners by ``collectives.sum``), as under multi_worker. It overrides tfaccel's own hooks of
``ShardOptimizerState`` and reads Keras' private ``_var_key`` and ``_clip_gradients`` (through the base class);
tests/horovod/test_horovod_zero.py fails when one of them moves.
"""

import contextlib
from typing import Any, Callable, List, Optional, Protocol, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tfaccel.compat.keras_zero import ShardOptimizerState, is_sharded, sharded_class

__all__ = ["RankCollectives", "shard_over_ranks", "unsharded_variables", "over_ranks"]


class RankCollectives(Protocol):
    """The collectives of a job whose processes are its replicas (every rank calls each one, in the same order)."""

    rank: int
    size: int

    def average(self, tensors: List[Any]) -> List[Any]:
        """Each tensor averaged over the ranks (inside the train function)."""

    def gather(self, tensor: Any) -> Any:
        """Every rank's 1-D ``tensor`` concatenated in rank order (inside the train function)."""

    def sum(self, value: np.ndarray) -> np.ndarray:
        """``value`` summed over the ranks (eagerly: saving)."""


class _RankShardState(ShardOptimizerState):
    """Mixed in before the user's optimizer class by :func:`shard_over_ranks` (see the module doc)."""

    tfaccel_collectives: RankCollectives

    def _tfaccel_placement(self) -> Tuple[List[str], int, int]:
        # One replica per process, on TensorFlow's default device (the default strategy has no worker_devices).
        return [""], self.tfaccel_collectives.size, self.tfaccel_collectives.rank

    def _tfaccel_slot_scope(self, device: str) -> Any:
        return contextlib.nullcontext()  # one device in this process: every slot made here is held here

    def _tfaccel_sum(self, value: np.ndarray) -> np.ndarray:
        return self.tfaccel_collectives.sum(value)

    def build(self, variables: Any) -> None:
        super().build(variables)
        plain = getattr(self, "_tfaccel_unsharded", set())  # left unsharded: every rank holds and updates them
        sharded = [v for v in variables if self._var_key(v) not in plain]
        self._tfaccel_rank_owner = {self._var_key(v): o for v, o in zip(sharded, self._tfaccel_layout["owners"])}

    def _tfaccel_update(self, distribution: Any, grads: List[Any], tvars: List[Any], learning_rate: Any) -> None:
        coll = self.tfaccel_collectives
        grads = super(ShardOptimizerState, self)._clip_gradients(coll.average(list(grads)))  # Keras' own clipping
        for grad, var in zip(grads, tvars):
            owner = self._tfaccel_rank_owner.get(self._var_key(var))
            if owner is None or owner == coll.rank:  # None: left unsharded, every rank updates its full copy
                self.update_step(grad, var, learning_rate)
        self._tfaccel_share(distribution, [v for v in tvars if self._var_key(v) in self._tfaccel_rank_owner])

    def _tfaccel_share(self, distribution: Any, tvars: Sequence[Any], label: Optional[str] = "all_gather") -> None:
        # Horovod's gathers are named collectives, counted by no exchange_bytes: label is unused here
        shared = [(v, self._tfaccel_rank_owner[self._var_key(v)]) for v in tvars]
        for dtype in sorted({v.dtype for v, _ in shared}, key=lambda d: d.name):  # one buffer per dtype
            _share(self.tfaccel_collectives, [(v, o) for v, o in shared if v.dtype == dtype], dtype)


def _share(coll: RankCollectives, chosen: Sequence[Tuple[Any, int]], dtype: Any) -> None:
    """All-gathers each owner's updated variables (one flat buffer per rank) and assigns the others' values."""
    mine = [tf.reshape(v.read_value(), [-1]) for v, o in chosen if o == coll.rank]
    flat = coll.gather(tf.concat(mine, 0) if mine else tf.zeros([0], dtype))
    offset = 0
    for rank in range(coll.size):  # the buffer: rank 0's variables in order, then rank 1's, ...
        for var, owner in chosen:
            if owner != rank:
                continue
            count = int(tf.TensorShape(var.shape).num_elements())
            if owner != coll.rank:
                var.assign(tf.reshape(flat[offset:offset + count], var.shape))
            offset += count


def shard_over_ranks(optimizer: Any, partition: Callable[[Sequence[int], int], List[int]],
                     collectives: RankCollectives) -> Any:
    """Swaps the class of ``optimizer`` (not built) for its rank-sharded subclass, in place; returns it."""
    if not is_sharded(optimizer):
        optimizer.__class__ = sharded_class(type(optimizer), partition, _RankShardState)
    optimizer.tfaccel_collectives = collectives
    return optimizer


def unsharded_variables(optimizer: Any) -> List[Any]:
    """The optimizer's variables whose shape is the same on every rank (all but its sharded slots): what a
    broadcast from rank 0 may carry."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)  # mixed_float16: the LossScaleOptimizer's is sharded
    slots = getattr(inner, "_tfaccel_slots", {}) if is_sharded(inner) else {}
    return [v for v in optimizer.variables if id(v) not in slots]


def over_ranks(optimizer: Any) -> bool:
    """Whether ``optimizer`` is sharded over Horovod ranks (by :func:`shard_over_ranks`)."""
    return isinstance(optimizer, _RankShardState)
