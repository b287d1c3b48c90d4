"""Optimizer-state sharding (ZeRO-1) over Horovod ranks: ``tfaccel.fit(..., shard_optimizer_state=True)`` under the
``horovod`` backend.

Each rank owns the trainable variables ``tfaccel.memory.shards.partition_by_bytes`` gives it (the same sizes, so the
same owners on every rank) and holds their optimizer slots only; the gradients are averaged with one grouped
all-reduce, the owner runs the user's own optimizer update, and the updated values reach every rank through one
all-gather (the mechanism: :mod:`tfaccel.compat.keras_zero_ranks`). Measured on this 2-core machine, Gloo over
loopback (docs/guides/horovod.md): Horovod 0.28.1's reduce-scatter of a flat buffer laid out by owner cost 4-9x the
grouped all-reduce, and one all-gather of a flat buffer less than a broadcast per variable from its owner.

Under mixed_float16 the ``LossScaleOptimizer``'s inner optimizer is the one sharded, and the ranks sum the count of
ranks whose gradients overflowed before its finite check (``tfaccel.compat.keras_loss_scale.apply_over_ranks``, one
scalar all-reduce a step), so every rank skips or applies the same steps.

What the backend adds to ``tfaccel.train.zero``'s refusals, before training: ``checkpoint_dir`` (rank 0 alone writes
it, and its files would hold only its own slots), and Horovod's fp16 gradient compression (the all-reduce would not
average what ``model.fit`` averages). Embedding tables stay unsharded, as under mirrored: their sparse gradients are
all-gathered and every rank updates its full copy. Backups (``backup_dir``) hold every rank's shard, as under
multi_worker (``tfaccel.resilience.shard_backup``): every rank writes its own, rank 0 the weights and the pointer once
all are written (Horovod's all-reduce is the agreement), and a resumed job takes each slot from whichever shard holds
it; ``backup_dir`` must be a directory every rank reads and writes (a shared file system across hosts).
"""

from typing import Any, List, Optional

import numpy as np
import tensorflow as tf

from tfaccel.compat import keras_loss_scale
from tfaccel.compat.keras_zero_ranks import shard_over_ranks
from tfaccel.errors import ConfigError
from tfaccel.memory.shards import partition_by_bytes
from tfaccel.precision import unwrap_loss_scale
from tfaccel.strategies.horovod.optimizer import allreduce_gradients

__all__ = ["HorovodCollectives", "shard_optimizer"]

_FIX = "train with shard_optimizer_state=False (the default)"


class HorovodCollectives:
    """The collectives of the sharded update over Horovod ranks. Horovod matches an op across ranks by its graph
    name, scope included; the ranks' train functions differ (each updates its own variables), so TensorFlow numbers
    their scopes differently (``while/cond/then/_111/...`` on one rank, ``_95`` on the other: the job hangs). Hence a
    fixed name and ``ignore_name_scope=True``.

    Args:
        hvd: the ``horovod.tensorflow`` module, initialised.
    """

    def __init__(self, hvd: Any) -> None:
        self.hvd = hvd
        self.rank, self.size = int(hvd.rank()), int(hvd.size())

    def average(self, tensors: List[Any]) -> List[Any]:
        """Each gradient averaged over the ranks: one grouped all-reduce of the dense ones, an all-gather of each
        sparse one's slices (an Embedding table's, kept sparse as ``model.fit`` keeps them)."""
        return allreduce_gradients(self.hvd, tensors, compression=self.hvd.Compression.none,
                                   name="tfaccel_zero_gradients")

    def gather(self, tensor: Any) -> Any:
        """Every rank's updated variables (one flat buffer each), in rank order: one all-gather."""
        return self.hvd.allgather(tensor, name="tfaccel_zero_values", ignore_name_scope=True)

    def sum(self, value: np.ndarray) -> np.ndarray:
        """``value`` summed over the ranks (saving a slot: its owner's value plus the others' zeros)."""
        return np.asarray(self.hvd.allreduce(tf.constant(value), op=self.hvd.Sum, name="tfaccel_zero_save"))

    def count_bad(self, local_bad: Any) -> Any:
        """The ranks whose gradients are not finite (each adds its 0 or 1; inside the train function)."""
        return self.hvd.allreduce(local_bad, op=self.hvd.Sum, name="tfaccel_zero_finite", ignore_name_scope=True)


def _refuse(reason: str, fix: str = _FIX) -> ConfigError:
    return ConfigError(f"shard_optimizer_state=True under Horovod: {reason}; {fix}")


def _check(*, size: int, compression: str, checkpoint_dir: Optional[str]) -> None:
    if size < 2:
        raise _refuse("there is one rank, so nothing to shard",
                      f"launch several ranks (tfaccel launch --backend horovod -np 2 -- ...), or {_FIX}")
    if compression != "none":
        raise _refuse(f"compression={compression!r} sends float16 gradients, so the owners would not update with "
                      "the average model.fit computes", f"use compression='none', or {_FIX}")
    if checkpoint_dir:
        raise _refuse(f"checkpoint_dir={checkpoint_dir!r}: rank 0 alone writes it, and each rank holds only its shard "
                      "of the optimizer state, so the file would lose the other ranks' slots",
                      "keep backup_dir (its backups save every rank's shard), save with "
                      "keras.callbacks.ModelCheckpoint or model.save(...) called on every rank (the .keras file then "
                      f"holds every slot), or {_FIX}")


def shard_optimizer(model: Any, *, hvd: Any, compression: str, checkpoint_dir: Optional[str] = None) -> str:
    """Swaps the class of ``model.optimizer`` (not built) for its subclass sharded over the Horovod ranks, in place.

    ``tfaccel.train.zero.shard_optimizer_state`` calls it (the ``horovod`` backend's ``shard_optimizer``) after its
    own checks (precision, accumulation, ``use_ema``, the model's own ``train_step``, a built optimizer).

    Args:
        model: the compiled model.
        hvd: the ``horovod.tensorflow`` module, initialised.
        compression: the backend's gradient compression (refused unless ``"none"``).
        checkpoint_dir: the job's (refused: rank 0 alone writes it).

    Returns:
        What was done, for the plan.

    Raises:
        ConfigError: what cannot be trained exactly, or saved whole, with the reason and the fix.
    """
    collectives = HorovodCollectives(hvd)
    _check(size=collectives.size, compression=compression, checkpoint_dir=checkpoint_dir)
    optimizer, scaled = unwrap_loss_scale(model.optimizer), ""
    shard_over_ranks(optimizer, partition_by_bytes, collectives)
    if optimizer is not model.optimizer:  # mixed_float16: one decision over the ranks whether a step is finite
        keras_loss_scale.apply_over_ranks(model.optimizer, collectives.count_bad)
        scaled = ("; the LossScaleOptimizer skips a step when any rank's gradients overflow (the count summed over "
                  "the ranks), so every rank skips or applies the same steps")
    return (f"optimizer {type(optimizer).__name__}: state sharded over {collectives.size} Horovod ranks "
            "(ZeRO-1: each variable's slots on one rank, gradients averaged by one grouped all-reduce, the owners' "
            f"updates all-gathered){scaled}")
