"""Elastic jobs, the training side: a job restarted from a backup with another number of workers trains on.

``tfaccel launch --workers MIN:MAX`` restarts a job whose worker cannot be brought back with the workers it has
(and grows it back when capacity returns); every process of such a job sees ``TFACCEL_ELASTIC=MIN:MAX`` and,
after a change of size, ``TFACCEL_RESIZE_REASON``. A restart continues *the same training* because the batch is
the global batch and the example order a function of (seed, epoch): each step's gradient is the mean over the
same examples, whoever computes it. Keras averages the per-replica means of a batch, which is the mean over its
examples only when the batch splits evenly over the replicas; so :func:`check_elastic_batch` stops, before
training, a job whose batches (the last, partial one included) do not split evenly over every world size it may
run on, naming the sizes that do.

The backup records the world size and the logs of every finished epoch (:func:`journal_callback`), so a resumed
job reports each epoch of the whole job once (``FitResult.history``) and every change of size
(``FitResult.details["world_size"]``: ``{"from", "to", "epoch", "step", "reason"}`` per change, oldest first).
"""

import math
from typing import Any, Dict, List, Mapping, Optional, Tuple

import keras
import numpy as np

from tfaccel.compat.keras_internals import flatten_layers
from tfaccel.errors import ConfigError
from tfaccel.log import get_logger
from tfaccel.resilience.contract import (ELASTIC_ENV, RESIZE_FROM_ENV, RESIZE_REASON_ENV, elastic_range,
                                         parse_workers_range)

__all__ = ["ELASTIC_ENV", "RESIZE_REASON_ENV", "RESIZE_FROM_ENV", "parse_workers_range", "elastic_range",
           "check_elastic_batch", "per_replica_statistics", "world_size_changes", "journal_callback", "merged_history"]

def _splits(count: int, sizes: range, replicas_per_worker: int) -> List[int]:
    return [n for n in sizes if count % (n * replicas_per_worker) == 0]


def check_elastic_batch(*, batch_size: Optional[int], num_examples: Optional[int], what: str,
                        workers: Tuple[int, int], replicas_per_worker: int = 1) -> None:
    """Stops an elastic job whose training would depend on its world size.

    Args:
        batch_size: the global batch (None: the data carries its own batches).
        num_examples: the training examples (arrays), or None.
        what: what the data is, for the message.
        workers: ``(MIN, MAX)`` workers the job may run on.
        replicas_per_worker: replicas each worker holds (its GPUs; 1 on a CPU).

    Raises:
        ConfigError: the data is not arrays with a global batch, the global batch does not split evenly over
            every world size in the range, or the last (partial) batch of an epoch does not; names the sizes that
            do and how to fix it.
    """
    sizes = range(workers[0], workers[1] + 1)
    field = f"--workers {workers[0]}:{workers[1]}"
    if not batch_size or not num_examples:
        raise ConfigError(f"{field}: elastic restarts continue the same training only where tfaccel batches and "
                          f"orders the examples (in-memory arrays with a global batch_size); received {what}. "
                          "Pass arrays, or launch a fixed number of workers (--workers N)")
    fits = _splits(batch_size, sizes, replicas_per_worker)
    if len(fits) < len(sizes):
        raise ConfigError(f"{field}: the global batch {batch_size} does not split evenly over "
                          f"{_replicas(sorted(set(sizes) - set(fits)), replicas_per_worker)}; it does over "
                          f"{_replicas(fits, replicas_per_worker) or 'none of them'}. Use a batch that every world "
                          f"size divides (e.g. {_lcm_multiple(batch_size, sizes, replicas_per_worker)}) or a "
                          "range of the sizes that divide it")
    last = num_examples % batch_size
    fits = _splits(last, sizes, replicas_per_worker) if last else list(sizes)
    if len(fits) < len(sizes):
        raise ConfigError(f"{field}: the last batch of every epoch holds {last} examples ({num_examples} examples, "
                          f"batch {batch_size}), which does not split evenly over "
                          f"{_replicas(sorted(set(sizes) - set(fits)), replicas_per_worker)} (it does over "
                          f"{_replicas(fits, replicas_per_worker) or 'none of them'}); Keras averages the replicas' "
                          "means, so that step would depend on the world size. Train on a whole number of batches "
                          f"(the first {num_examples - last} examples, e.g. x[:{num_examples - last}]) or on sizes "
                          "that divide the last batch")


def _replicas(sizes: List[int], per_worker: int) -> str:
    if per_worker == 1:
        return ", ".join(f"{n} worker{'s' if n > 1 else ''}" for n in sizes)
    return ", ".join(f"{n} workers ({n * per_worker} replicas)" for n in sizes)


def _lcm_multiple(batch: int, sizes: range, per_worker: int) -> int:
    step = 1
    for n in sizes:
        step = step * n * per_worker // math.gcd(step, n * per_worker)
    return max(step, -(-batch // step) * step)


def per_replica_statistics(model: Any) -> List[str]:
    """The names of the model's layers that normalize with each replica's own batch statistics
    (``BatchNormalization`` without ``synchronized=True``): their training depends on the per-replica batch."""
    return [layer.name for layer in flatten_layers(model)
            if isinstance(layer, keras.layers.BatchNormalization) and not getattr(layer, "synchronized", False)]


def world_size_changes(state: Optional[Mapping[str, Any]], *, workers: int, reason: Optional[str] = None,
                       previous: Optional[int] = None) -> List[Dict[str, Any]]:
    """The job's changes of world size: the backup's, plus this start's when it runs on another number of workers.

    Args:
        state: the backup this process resumes from (None: a fresh start).
        workers: the workers of this start.
        reason: why the size changed (the launcher's ``TFACCEL_RESIZE_REASON``). Defaults to a plain phrase.
        previous: the workers of the launcher's last attempt (``TFACCEL_RESIZE_FROM``), which counts where no
            backup was written yet. Defaults to None.
    """
    if not state:
        state = {"epoch": 0, "step": 0, "workers": previous}
    changes = [dict(c) for c in state.get("world_size_changes", [])]
    before = state.get("workers")
    if before is not None and int(before) != workers:
        changes.append({"from": int(before), "to": workers, "epoch": int(state["epoch"]), "step": int(state["step"]),
                        "reason": reason or f"restarted with {workers} workers"})
    return changes


def merged_history(before: Mapping[str, List[float]], ran: Mapping[str, List[float]]) -> Dict[str, List[float]]:
    """The history of the whole job: the finished epochs a backup recorded, then those this run trained."""
    keys = list(before) + [k for k in ran if k not in before]
    return {k: [float(v) for v in before.get(k, [])] + [float(v) for v in ran.get(k, [])] for k in keys}


def journal_callback(state: Optional[Mapping[str, Any]], *, workers: int, replicas: int,
                     changes: List[Dict[str, Any]], save_freq: Optional[int] = None, steps_per_epoch: int = 0,
                     metric_state: bool = True) -> Any:
    """A Keras callback that keeps what a backup records for the next start (``.record(epoch, step)``): the world
    size, its changes, the logs of every finished epoch and, at a backup in the middle of an epoch, the state of
    the model's metrics (read at the backup callback's steps, recorded only for a backup at that step); and the
    history a resumed run adds to its own (``.before``).

    Where a resumed run starts in the middle of an epoch, it puts the metrics' state back at that epoch's start,
    so the epoch's logs cover all its steps, as in an uninterrupted run. It must run before the backup callback
    (an epoch's backup then holds that epoch's logs), on every worker (reading the metrics sums them over every
    replica, a collective).

    Args:
        state: the backup this run resumes from, or None.
        workers, replicas: this run's world size. changes: from :func:`world_size_changes`.
        save_freq, steps_per_epoch: the backup callback's (the metrics are read at the steps it backs up).
        metric_state: whether the metrics read here are the whole job's (False where each process keeps its own,
            as Horovod's ranks do: then a resumed epoch's logs cover the steps after the resume). Defaults to True.
    """
    start_epoch, start_step = (int(state["epoch"]), int(state["step"])) if state else (0, 0)
    before = {k: list(v)[:start_epoch] for k, v in (state or {}).get("history", {}).items()}
    saved = (state or {}).get("metrics") if metric_state and start_step else None

    class _Journal(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.before = before
            self.history: Dict[str, List[float]] = {k: list(v) for k, v in before.items()}
            self.metrics: Optional[Tuple[int, int, List[Any]]] = None  # (epoch, step, values) of the last read
            self.offset, self.epoch = start_step, start_epoch

        def on_epoch_begin(self, epoch: int, logs: Optional[Dict] = None) -> None:
            self.epoch = epoch
            if saved is not None and epoch == start_epoch and self.offset == start_step:
                _assign_metrics(self.model, saved)

        def on_train_batch_end(self, batch: int, logs: Optional[Dict] = None) -> None:
            step = self.offset + batch + 1
            if metric_state and save_freq and step % save_freq == 0 and step < steps_per_epoch:
                self.metrics = (self.epoch, step, [v.numpy().tolist() for v in self.model.metrics_variables])

        def on_epoch_end(self, epoch: int, logs: Optional[Dict] = None) -> None:
            self.offset, self.metrics = 0, None
            for key, value in (logs or {}).items():
                self.history.setdefault(key, []).append(float(value))

        def record(self, epoch: int, step: int) -> Dict[str, Any]:
            """The fields for a backup at (epoch, step): the metrics only where they were read at that step."""
            read = self.metrics is not None and self.metrics[:2] == (epoch, step)
            return {"workers": workers, "replicas": replicas, "world_size_changes": changes,
                    "history": self.history, **({"metrics": self.metrics[2]} if read else {})}

    return _Journal()


def _assign_metrics(model: Any, values: List[Any]) -> None:
    """Puts the metrics' state a backup read back (a sum over replicas is spread over this run's replicas by
    ``assign`` in cross-replica context)."""
    variables = list(model.metrics_variables)
    if len(variables) != len(values):
        get_logger().warning("resume: the backup holds %d metric values, the model has %d metric variables; the "
                             "resumed epoch's logs cover only the steps after the resume", len(values),
                             len(variables))
        return
    for variable, value in zip(variables, values):
        variable.assign(np.asarray(value, dtype=variable.dtype))
