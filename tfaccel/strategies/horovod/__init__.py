"""The ``horovod`` backend: ring all-reduce through Horovod's low-level TensorFlow collectives, for Keras 3.

Horovod 0.28.1 (June 2023, the newest release) predates Keras 3. Its Keras integration
(``horovod.tensorflow.keras.DistributedOptimizer``) hooks Keras 2's ``_aggregate_gradients``, which Keras 3
never calls, so under Keras 3 it *silently does not average gradients* (ranks diverge); its
``BroadcastGlobalVariablesCallback`` fails with ``'Variable' object has no attribute 'ref'`` on TF >= 2.16
(horovod#4290). Both were seen on TF 2.21 / Keras 3.15. This module therefore uses only
``horovod.tensorflow``'s collectives:

* :func:`distributed_optimizer` subclasses the user's Keras 3 optimizer so that ``apply()`` first averages
  the gradients over all ranks with one grouped all-reduce (optionally fp16-compressed);
* :class:`BroadcastVariablesCallback` builds the optimizer and broadcasts model and optimizer variables from
  rank 0 at train begin, on the underlying ``tf.Variable``s (broadcasting Keras 3 variables directly fails
  with ``'SymbolicTensor' object has no attribute 'assign'``);
* :class:`GlobalMetricsCallback` sums the ranks' metric states, so every rank's logs are the global batch's;
* :func:`check_optimizer` refuses an optimizer already wrapped by ``horovod.tensorflow.keras``;
* :func:`agree_on_backup` makes every rank resume from rank 0's backup (``backup_dir``, issue 9 R1).

Batch semantics: Horovod has no ``tf.distribute`` strategy spreading a batch; each rank runs the default
strategy on its own shard. A tfaccel ``global_batch_size`` still means the global batch: each rank gets
``global_batch_size // backend.num_workers`` examples per step from shard ``backend.input_shard``.

The parts: :mod:`.runtime` (loading Horovod, rank detection, GPU pinning), :mod:`.optimizer`, :mod:`.callbacks`
and :mod:`.backend` (the registry entry). Build Horovod first with ``bash scripts/install_horovod.sh .venv`` and
start ranks with ``tfaccel launch --backend horovod -np 2 -- python train.py``.
"""

from tfaccel.strategies.horovod.backend import make_backend
from tfaccel.strategies.horovod.callbacks import (BroadcastVariablesCallback, GlobalMetricsCallback,
                                                  StopTogetherCallback, agree_on_backup)
from tfaccel.strategies.horovod.optimizer import (COMPRESSION_NAMES, check_optimizer, distribute_in_place,
                                                  distributed_optimizer, is_distributed_optimizer)
from tfaccel.strategies.horovod.runtime import INSTALL_HINT, import_horovod, launched_by_horovod, pin_gpu_to_local_rank

__all__ = [
    "COMPRESSION_NAMES",
    "INSTALL_HINT",
    "BroadcastVariablesCallback",
    "GlobalMetricsCallback",
    "StopTogetherCallback",
    "agree_on_backup",
    "check_optimizer",
    "distributed_optimizer",
    "distribute_in_place",
    "import_horovod",
    "is_distributed_optimizer",
    "launched_by_horovod",
    "make_backend",
    "pin_gpu_to_local_rank",
]

