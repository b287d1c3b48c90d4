"""The seed of the example order: checked as given, or drawn (``seed=None``) and agreed on by every process of the
job, so that every worker orders the examples the same way (:func:`tfaccel.train.data.example_order`)."""

import random
import secrets
from typing import Any, Optional, Tuple

import numpy as np
import tensorflow as tf

from tfaccel.compat.keras_internals import global_random_seed
from tfaccel.errors import ConfigError
from tfaccel.log import get_logger

__all__ = ["check_seed", "agree_on_seed"]


def check_seed(seed: Any) -> Optional[int]:
    """``seed`` as an int, or None.

    Raises:
        ConfigError: not a whole number.
    """
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ConfigError(f"seed must be a whole number or None; received {seed!r}")
    return int(seed)


def agree_on_seed(seed: Optional[int], *, backend: Any, announce: bool = True) -> int:
    """The seed of the example order, the same in every process of the job.

    ``None`` draws a fresh seed on the first worker (logged at INFO where ``announce``, else at DEBUG: ``fit``'s
    ``verbose=0``; ``FitResult.details["seed"]`` holds it either way) and shares it with the others: a
    MultiWorkerMirrored all-reduce, or a Horovod broadcast.
    """
    if seed is not None:
        return int(seed)
    fresh, source = _fresh_seed()
    fresh = fresh if backend.worker_index == 0 else 0
    if backend.num_workers > 1 and backend.broadcast is not None:  # processes outside tf.distribute (Horovod)
        fresh = int(backend.broadcast(fresh, "tfaccel_seed"))
    elif backend.num_workers > 1:
        strategy = backend.strategy
        def first_replica_only() -> Any:  # the first replica of the whole job is on worker 0
            first = tf.equal(tf.distribute.get_replica_context().replica_id_in_sync_group, 0)
            return tf.where(first, tf.constant(fresh, tf.int64), tf.constant(0, tf.int64))

        shared = strategy.run(first_replica_only)
        fresh = int(strategy.reduce(tf.distribute.ReduceOp.SUM, shared, axis=None))
    if backend.is_chief:
        say = get_logger().info if announce else get_logger().debug
        say("seed=None: drew seed %d for the example order%s (pass seed=%d to repeat it)", fresh, source, fresh)
    return fresh


def _fresh_seed() -> Tuple[int, str]:
    """A seed for ``seed=None``: after ``keras.utils.set_random_seed(s)``, drawn from Python's ``random`` (which it
    seeds), so a rerun of the script repeats the order and a second ``fit`` gets another one, as Keras' own
    ``shuffle=True`` does; else a fresh one. Returns (seed, where it came from, for the log line)."""
    keras_seed = global_random_seed()
    if keras_seed is not None:
        return random.randrange(2**31 - 1), f" from keras.utils.set_random_seed({keras_seed})"
    return secrets.randbelow(2**31 - 1), ""
