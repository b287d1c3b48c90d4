"""The Keras ``fit`` loop: the user's compiled model trained by ``model.fit`` itself.

Used for tpu, horovod (the optimizer wrapped in place, weights broadcast and metrics averaged by the backend's
callbacks), mirrored and multi_worker (with the keras-team/keras#20585 fix in tfaccel.compat) whenever the
multi-step loop does not apply (one step per execution for per-batch callbacks, datasets, ...), and on one
device whenever the compiled loop cannot train exactly like ``fit``.

Arrays go to ``fit`` unchanged on one process, so Keras' own batching, shuffling and weighting apply. Where
several processes must agree on the order of the examples, or a job resumes in the middle of an epoch, they
go through ``tfaccel.train.data.example_stream`` instead, whose order is a function of ``(seed, epoch)``.
"""

from typing import Any, Dict, List, Optional, Sequence, Tuple

import keras
import tensorflow as tf

from tfaccel.compat import keras_internals, keras_mwms, tf_generator_alias
from tfaccel.errors import ConfigError
from tfaccel.train.data import FitData, example_stream, is_python_iterator
from tfaccel.train.fit_context import FitContext
from tfaccel.train.loops.base import Loop, LoopResult, steps_per_execution

__all__ = ["KerasFitLoop", "uses_stream", "run_keras_fit", "fix_symbolic_build", "copy_generator_batches",
           "build_without_reading"]


def uses_stream(data: FitData, *, backend: Any, backups: bool) -> bool:
    """Whether arrays must go through tfaccel's ordered stream rather than straight to ``fit``."""
    return data.kind == "arrays" and (backend.num_workers > 1 or backups)


def _distributed(x: Any, backend: Any) -> Any:
    """A ``dataset_fn(input_context)`` made into what ``fit`` takes (a distributed dataset, or this rank's)."""
    if not callable(x):
        return x  # already a tf.distribute.DistributedDataset

    if backend.traits.shards_by_rank:
        return x(tf.distribute.InputContext(backend.num_workers, backend.worker_index, backend.num_replicas_in_sync))
    return backend.strategy.distribute_datasets_from_function(x)


def _phases(data: FitData, *, backend: Any, epochs: int, initial_epoch: int, start_step: int,
            stream: bool) -> List[Dict[str, Any]]:
    """The ``fit`` calls to make: one, or two when a resumed job starts in the middle of an epoch."""
    if not stream:
        if data.kind == "keras":  # Keras' own data adapter reads it, with every argument as given
            return [dict(x=data.x, y=data.y, sample_weight=data.sample_weight, batch_size=data.batch_size,
                         class_weight=data.class_weight, initial_epoch=initial_epoch, epochs=epochs,
                         steps_per_epoch=data.steps_per_epoch, shuffle=data.shuffle)]
        if data.kind != "arrays":
            return [dict(x=_distributed(data.x, backend) if data.kind == "distributed" else data.x,
                         initial_epoch=initial_epoch, epochs=epochs, steps_per_epoch=data.steps_per_epoch,
                         class_weight=data.class_weight, shuffle=data.shuffle)]
        return [dict(x=data.x, y=data.y, sample_weight=data.sample_weight, batch_size=data.batch_size,
                     initial_epoch=initial_epoch, epochs=epochs, shuffle=data.shuffle,
                     steps_per_epoch=None if data.steps_per_epoch == -(-data.num_examples // data.batch_size)
                     else data.steps_per_epoch)]
    shards, index = backend.input_shard if backend.traits.shards_by_rank else (1, 0)
    phases = []
    first_end = initial_epoch + 1 if start_step else epochs
    ds, steps = example_stream(data, epochs=first_end, initial_epoch=initial_epoch, start_step=start_step,
                               shards=shards, shard_index=index)
    phases.append(dict(x=ds, initial_epoch=initial_epoch, epochs=first_end, steps_per_epoch=steps - start_step,
                       shuffle=False))
    if start_step and first_end < epochs:
        ds, steps = example_stream(data, epochs=epochs, initial_epoch=first_end, shards=shards, shard_index=index)
        phases.append(dict(x=ds, initial_epoch=first_end, epochs=epochs, steps_per_epoch=steps, shuffle=False))
    return phases


def run_keras_fit(model: Any, *, data: FitData, backend: Any, epochs: int, initial_epoch: int, start_step: int,
                  backups: bool, callbacks: Sequence[Any], verbose: Any, validation_steps: Optional[int],
                  validation_batch_size: Optional[int], validation_freq: Any, step_counter: Any) -> LoopResult:
    """Trains with ``model.fit``; returns Keras' history of every phase, the epoch times and the steps run.

    Args:
        step_counter: tfaccel's ``Throughput`` callback (already in ``callbacks``): epoch times and steps.
    """
    stream = uses_stream(data, backend=backend, backups=backups)
    history: Dict[str, List[float]] = {}
    val: Dict[str, Any] = {}
    if data.validation is not None:
        vx, vy, vsw = data.validation
        val = dict(validation_data=(vx, vy, vsw) if vy is not None or vsw is not None else vx,
                   validation_steps=validation_steps, validation_batch_size=validation_batch_size,
                   validation_freq=validation_freq)
    for phase in _phases(data, backend=backend, epochs=epochs, initial_epoch=initial_epoch, start_step=start_step,
                         stream=stream):
        hist = model.fit(callbacks=list(callbacks), verbose=verbose, **phase, **val)
        for key, values in hist.history.items():
            history.setdefault(key, []).extend(float(v) for v in values)
        if model.stop_training:
            break
    return LoopResult(history=history, epoch_seconds=list(step_counter.epoch_seconds),
                      steps=int(sum(step_counter.epoch_steps)))


def _read_from_generator(x: Any) -> bool:
    """Whether Keras' fit reads ``x`` through ``from_generator``: a ``PyDataset``, or a Python generator/iterator."""
    return isinstance(x, keras.utils.PyDataset) or is_python_iterator(x)


def copy_generator_batches(data: FitData, *, replicas: int) -> Optional[str]:
    """Copies each batch a ``PyDataset`` or a generator yields before TensorFlow reads it, over several replicas.

    TensorFlow 2.21 writes into those arrays when a batch is split over replicas (``tfaccel.compat.tf_generator_alias``):
    the user's data changes and the next epochs train on it. Returns what was done, for the plan (None when the
    data is neither, or on one replica, or when the fix is off: its log line says why).
    """
    validation = data.validation[0] if data.validation is not None else None
    if replicas <= 1 or not any(map(_read_from_generator, (data.x, validation))) or not tf_generator_alias.apply():
        return None
    return (f"each batch of the PyDataset / generator is copied before it is split over {replicas} replicas, "
            f"which write into the arrays otherwise ({tf_generator_alias.NAME})")


def build_without_reading(model: Any, data: FitData) -> Optional[str]:
    """Keeps Keras from reading the training data to build the model under a strategy.

    Keras 3.15's fit and evaluate under a strategy (one replica too) build the model from a batch of an iterator
    they throw away. Its prefetching takes a timing-dependent number of a Python generator's batches that training
    never sees; creating it draws an order of a seeded ``dataset.shuffle`` or a shuffled ``PyDataset``, so the epochs
    train on other orders than on one device. ``tfaccel.compat.keras_mwms`` builds from the data's spec instead, or
    from the batches Keras' adapter peeked. Returns what was done, for the plan; None without a strategy, for
    arrays (tfaccel's own loops), or when the fix is off (its log line says why).
    """
    if (keras_internals.model_strategy(model) is None or data.kind not in ("dataset", "py_dataset", "keras")
            or not keras_mwms.apply()):
        return None
    return ("the model is built from the data's spec (else from the batches Keras' adapter had already read), not "
            "from an iterator Keras would throw away, whose prefetching takes a generator's batches and which draws "
            f"a shuffled order one device does not draw ({keras_mwms.NAME})")


def fix_symbolic_build(model: Any, *, replicas: int, keras_loop: str) -> Optional[str]:
    """Lets Keras fit build the model over several replicas from one replica's batch, or refuses before training.

    Keras 3.15's fit under MirroredStrategy / MultiWorkerMirroredStrategy sums the first distributed batch across
    the replicas (``strategy.reduce("MEAN", batch)`` in ``TensorFlowTrainer._maybe_symbolic_build``) to build the
    model, which fails on strings (``AddN`` has no string kernel) and on a global batch that does not split evenly
    (``AddN`` of [11, 4] and [10, 4]). ``tfaccel.compat.keras_mwms`` builds from the first replica's batch instead.

    Returns:
        What was done, for the plan; None on one replica.

    Raises:
        ConfigError: the fix cannot be applied here (switched off, another Keras version) and the model takes strings.
    """
    if replicas <= 1:
        return None
    if keras_mwms.apply():
        return f"Keras fit over {replicas} replicas builds the model from one replica's batch ({keras_mwms.NAME})"
    names = [getattr(t, "name", "?") for t in getattr(model, "inputs", None) or []
             if str(getattr(t, "dtype", "")) == "string"]
    if not names:
        return None
    raise ConfigError(
        f"fit: model input(s) {', '.join(names)} take strings, and this job runs Keras fit over {replicas} replicas "
        f"({keras_loop}) without tfaccel's fix {keras_mwms.NAME}; Keras 3 fit reduces the first batch across "
        "replicas to build the model, which fails on strings (AddN). Pass the string features as arrays or tensors "
        "(x=tf.constant(strings), y=...) so tfaccel's multi-step loop trains them, or leave the fix switched on")


class KerasFitLoop(Loop):
    """Keras ``fit`` itself: every job the loops before it cannot train exactly, and whatever asks for it."""

    name = "keras_fit"

    def serves(self, ctx: "FitContext") -> bool:
        return ctx.backend.uses_keras_fit

    def blockers(self, ctx: "FitContext") -> List[str]:
        return [] if self.serves(ctx) else ["Keras 3 fit does not run this strategy"]

    def describe(self, ctx: "FitContext", rejected: List[Tuple[Loop, List[str]]]) -> str:
        """``Keras fit (asked for)``, else the reasons of the first of tfaccel's loops that serves this backend (of
        the last of them when none does)."""
        if ctx.request.loop.loop == "keras":
            return "Keras fit (asked for)"
        own = [(loop, reasons) for loop, reasons in rejected if loop.own]
        reasons = next((reasons for loop, reasons in own if loop.serves(ctx)), own[-1][1] if own else [])
        return "Keras fit (" + "; ".join(reasons) + ")"

    def steps_per_execution(self, ctx: "FitContext") -> Optional[Tuple[int, str]]:
        return steps_per_execution(ctx, keras_fit=True)

    def orders_examples(self, ctx: "FitContext") -> bool:
        return uses_stream(ctx.data, backend=ctx.backend, backups=bool(ctx.request.backups.backup_dir))

    def run(self, ctx: "FitContext") -> LoopResult:
        # the model's own strategy: a Horovod rank trains one replica per process under the default strategy
        replicas = ctx.model.distribute_strategy.num_replicas_in_sync
        note = fix_symbolic_build(ctx.model, replicas=replicas, keras_loop=ctx.details.get("loop", "Keras fit"))
        if note:
            ctx.details["symbolic_build"] = note
        kept = build_without_reading(ctx.model, ctx.data)
        if kept:
            ctx.details["build_data"] = kept
        copies = copy_generator_batches(ctx.data, replicas=replicas)
        if copies:
            ctx.details["batch_copies"] = copies
        validation = ctx.request.validation
        return run_keras_fit(ctx.model, data=ctx.data, backend=ctx.backend, epochs=ctx.request.epochs,
                             initial_epoch=ctx.start_epoch, start_step=ctx.start_step,
                             backups=bool(ctx.request.backups.backup_dir), callbacks=ctx.callbacks,
                             verbose=ctx.verbose, validation_steps=validation.steps,
                             validation_batch_size=validation.batch_size, validation_freq=validation.freq,
                             step_counter=ctx.named["timer"])
