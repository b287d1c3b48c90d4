"""Per-worker input for the parameter-server loop: each worker iterates its own pipeline, built on the worker.

``ClusterCoordinator.create_per_worker_dataset`` traces the dataset function once, on the coordinator, and creates
the same dataset on every worker; ParameterServerStrategy hands it an ``InputContext`` with one input pipeline and
id 0 (TF 2.21, ``parameter_server_strategy_v2._distribute_datasets_from_function``). So by itself no worker can
read "its" files. Here one per-worker dataset is made for each worker index ``k`` (``InputContext(N, k)``) and
worker ``k`` gets the iterator of the ``k``-th: ``PerWorkerValues`` holds one ``RemoteValue`` per worker, in worker
order, and TensorFlow has no public accessor for them (``_values``, TF 2.21; read in one place, here). Every worker
also holds the other ``N - 1`` iterators, created but never read: a ``tf.data`` iterator starts no reading
(prefetch, interleave threads) before its first ``get_next``.

The same trick gives each closure the index of the worker it runs on (a per-worker dataset of that one number), so
the coordinator loop can say how many updates and examples each worker contributed.
"""

from typing import Any, Callable

import tensorflow as tf

from tfaccel.compat import keras_internals

__all__ = ["per_worker_choice", "worker_index_iterator", "sharded_dataset_iterator"]


def per_worker_choice(coordinator: Any, make_dataset_fn: Callable[[int], Callable[[], Any]], num_workers: int) -> Any:
    """A per-worker iterator whose worker ``k`` iterates the dataset of ``make_dataset_fn(k)()``.

    Args:
        coordinator: the ``ClusterCoordinator``.
        make_dataset_fn: ``k -> (() -> dataset)``, the dataset function of worker ``k``.
        num_workers: worker tasks of the cluster.

    Returns:
        A ``tf.distribute.experimental.coordinator.PerWorkerValues`` of iterators, to pass to ``schedule``.
    """
    if num_workers == 1:
        return iter(coordinator.create_per_worker_dataset(make_dataset_fn(0)))
    picked = []
    for k in range(num_workers):
        every_worker = iter(coordinator.create_per_worker_dataset(make_dataset_fn(k)))
        picked.append(keras_internals.per_worker_value(every_worker, k))  # the k-th worker's RemoteValue
    return tf.distribute.experimental.coordinator.PerWorkerValues(tuple(picked))


def worker_index_iterator(coordinator: Any, num_workers: int) -> Any:
    """A per-worker iterator that yields, on worker ``k``, the int32 scalar ``k`` forever."""
    def make(k: int) -> Callable[[], Any]:
        return lambda: tf.data.Dataset.from_tensors(tf.constant(k, tf.int32)).repeat()

    return per_worker_choice(coordinator, make, num_workers)


def sharded_dataset_iterator(coordinator: Any, strategy: Any, dataset_fn: Callable[[Any], Any],
                             num_workers: int) -> Any:
    """Worker ``k`` iterates ``dataset_fn(InputContext(num_workers, k))`` repeated, distributed over its replicas.

    Args:
        coordinator, strategy: the ``ClusterCoordinator`` and its ``ParameterServerStrategy``.
        dataset_fn: the user's ``dataset_fn(input_context)``; ``input_context.input_pipeline_id`` is the worker's
            index and ``num_input_pipelines`` the number of workers (shard files with them, e.g.
            ``tfaccel.datasets.tfrecord_dataset(..., input_context=ctx)``).
        num_workers: worker tasks of the cluster.
    """
    def make(k: int) -> Callable[[], Any]:
        context = tf.distribute.InputContext(num_input_pipelines=num_workers, input_pipeline_id=k,
                                             num_replicas_in_sync=strategy.num_replicas_in_sync)
        return lambda: strategy.distribute_datasets_from_function(lambda _: dataset_fn(context).repeat())

    return per_worker_choice(coordinator, make, num_workers)
