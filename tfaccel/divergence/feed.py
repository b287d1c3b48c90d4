"""How a recorded run of ``tfaccel doctor`` is fed, and which examples each of its steps trained on.

A run is fed either the doctor's global batches (the same for every run compared), each cut over the strategy's
replicas as tf.distribute cuts a global batch (contiguous parts, the first ``B % N`` replicas one example more),
whatever the number of processes; or the user's own ``dataset_fn(input_context)``, through the strategy's
``distribute_datasets_from_function``, so that its sharding (or its lack of one) is what is compared. Each step's
examples are kept as a digest per example, so two runs can be told to have trained on other examples.
"""

import hashlib
from typing import Any, Callable, Iterator, List, Sequence, Tuple

import numpy as np
import tensorflow as tf

__all__ = ["batch_size_of", "replica_slices", "distributed_batches", "user_batches", "gathered_batch", "example_digests"]


def batch_size_of(batch: Any) -> int:
    """The number of examples in a (nested) batch: the length of its first leaf."""
    return len(tf.nest.flatten(batch)[0])


def replica_slices(size: int, replicas: int) -> List[slice]:
    """How tf.distribute cuts a global batch of ``size`` over ``replicas``: contiguous parts, the first
    ``size % replicas`` one example longer (a batch of 1 over 2 replicas leaves the second empty)."""
    bounds = [0]
    for replica in range(replicas):
        bounds.append(bounds[-1] + size // replicas + (1 if replica < size % replicas else 0))
    return [slice(a, b) for a, b in zip(bounds, bounds[1:])]


def _spec(batch: Any) -> Any:
    return tf.nest.map_structure(
        lambda part: tf.TensorSpec((None,) + np.shape(part)[1:], tf.as_dtype(np.asarray(part).dtype)), batch)


def distributed_batches(strategy: Any, batches: Sequence[Any]) -> Iterator[Any]:
    """The global batches, each cut over the strategy's replicas (every process of a multi-worker strategy gets
    its replicas' parts: each input pipeline yields its replicas' parts of every batch, in replica order)."""
    replicas = strategy.num_replicas_in_sync

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        local = replicas // context.num_input_pipelines
        mine = range(context.input_pipeline_id * local, (context.input_pipeline_id + 1) * local)

        def parts() -> Iterator[Any]:
            for batch in batches:
                cuts = replica_slices(batch_size_of(batch), replicas)
                for replica in mine:
                    yield tf.nest.map_structure(lambda p, cut=cuts[replica]: p[cut], batch)

        return tf.data.Dataset.from_generator(parts, output_signature=_spec(batches[0]))

    return iter(strategy.distribute_datasets_from_function(dataset_fn))


def user_batches(strategy: Any, dataset_fn: Callable[[Any], Any]) -> Iterator[Any]:
    """The user's ``dataset_fn(input_context)`` under the strategy, as ``tfaccel.fit`` feeds it."""
    return iter(strategy.distribute_datasets_from_function(dataset_fn))


def gathered_batch(strategy: Any, batch: Any) -> Any:
    """The global batch that a step of a run fed by the user's ``dataset_fn`` trained on: every replica's part, of
    every process (a collective under a multi-worker strategy: every process calls it at the same step)."""
    return tf.nest.map_structure(lambda part: np.asarray(strategy.gather(part, axis=0)), batch)


def example_digests(batch: Any) -> Tuple[str, ...]:
    """A short digest of each example of a global batch (all its parts' rows), sorted: equal tuples, the same
    examples (in any order within the batch)."""
    leaves = [np.ascontiguousarray(np.asarray(leaf)) for leaf in tf.nest.flatten(batch)]
    digests = []
    for row in range(batch_size_of(batch)):
        sha = hashlib.sha256()
        for leaf in leaves:
            sha.update(leaf[row].tobytes())
        digests.append(sha.hexdigest()[:10])
    return tuple(sorted(digests))
