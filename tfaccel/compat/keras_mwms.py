"""Keras 3 ``model.fit`` under ``MultiWorkerMirroredStrategy``.

Upstream: keras-team/keras#20585, tensorflow/tensorflow#72388, ray-project/ray#47464. Seen on Keras 3.0
through 3.15.1 with TensorFlow 2.21 (checked here with 3.15.1). With two or more worker processes,
``model.fit`` fails before the first step with::

    ValueError: Attempt to convert a value (PerReplica:{ 0: <tf.Tensor ...> }) with an unsupported type
    (<class 'tensorflow.python.distribute.values.PerReplica'>) to a Tensor.

Two places in ``keras/src/backend/tensorflow/trainer.py`` are at fault, and this fix replaces exactly them,
only changing behaviour under a multi-worker collective strategy:

* ``TensorFlowTrainer._maybe_symbolic_build`` reduces the first distributed batch eagerly with
  ``strategy.reduce("MEAN", batch)``, which a multi-worker strategy cannot do outside ``strategy.run``.
  The batch is only needed for its shapes, so we build from the first local replica's values instead.
* ``reduce_per_replica`` reduces every metric with ``strategy.reduce("MEAN", v, axis=0)``; the metrics are
  scalars, which have no axis 0. Scalars are reduced with ``axis=None`` (a cross-replica mean). A metric whose
  ``result()`` returns its state variable itself (keras-io's ``CategoricalTruePositives`` in
  guides/training_with_built_in_methods.py) comes out of ``strategy.run`` as that variable, which
  ``strategy.reduce`` cannot take ("Cannot convert `input_tensor` to a `PerReplica` object because it doesn't
  have device set"); a metric variable is synchronized (its updates are summed over every replica of every
  worker), so it is returned as it is, as Keras' own ``reduce_per_replica`` does under one-worker strategies.

The first half serves every strategy, ``MirroredStrategy`` too: there the eager cross-replica ``reduce`` of the
first batch fails whenever the replicas' parts cannot be summed, with ``AddN`` on strings (keras-io's
structured-data examples with ``StringLookup``) or on parts of different sizes (a global batch of 21 over 2
replicas: ``Input 0: [11,4] != input 1: [10,4]``). ``tfaccel.train.loops.keras_fit`` applies the fix for every job
of Keras fit over several replicas.

The replaced ``_maybe_symbolic_build`` also starts no iterator of the training data where none is needed (no
upstream report found, searched keras-team/keras issues 2026-12-01; seen with Keras 3.15.1). Keras reads its first
batch from an iterator of the distributed dataset that ``fit`` then throws away (``epoch_iterator.reset()``):

* that iterator's prefetching pulls batches from a Python generator that the training iterator never sees. Plain
  Keras under ``MirroredStrategy`` trained a 5-step epoch on the generator's batches 0, 1, 6, 7, 8 (its two first
  batches, which the adapter had peeked and yields again, then what the prefetching had left; how many it takes
  depends on timing, so the history changed from run to run), where Keras on one device trains on 0-4;
* creating it draws an order: a shuffled ``PyDataset``'s epochs then each trained on the order one device trains
  the *next* epoch on, and a seeded ``dataset.shuffle`` (each new iterator takes the next of its seeds) on orders
  one device never trains (16 examples, ``shuffle(16, seed=0).batch(4)``, 2 epochs: one device trained the 1st and
  3rd of the dataset's orders, mirrored the 2nd and 4th).

So the model is built from the data's spec (a ``tf.data.Dataset``'s element spec, or the signature Keras' adapter
took from a ``PyDataset``'s or a generator's first batches) where every shape but the batch axis is known, as one
device builds it when it traces the train function; not at all where the model is already built (an
``evaluate``'s build, every validation run); else from the batches Keras' adapter had already peeked (a generator
yields only those while the model is built). (A validation generator still loses batches between validation runs,
on one device too: each run starts a new iterator, and what the last one had prefetched is gone; measured with
``validation_steps=3``: 0, 1, 2 then 0, 1, 4 on one device.)

The fix is applied by the ``multi_worker`` strategy factory, is idempotent and reversible
(:func:`remove`), and can be switched off with ``TFACCEL_DISABLE_COMPAT=keras_mwms``.

Not patched: Keras' multi-step loop (``steps_per_execution`` > 1), which still fails under the strategy with
``You must feed a value for placeholder tensor .../while/cond/Placeholder`` (it iterates the distributed dataset
with ``get_next_as_optional`` inside its ``tf.while_loop``). Rewriting that private loop would copy most of it;
tfaccel runs several steps per call with its own loop instead (``tfaccel.train.loops.multi_step``, Orbit's
``strategy.run`` in ``tf.range``, no distributed iterator), and Keras ``fit`` here runs one step per call.
"""

import contextlib
import threading
from typing import Any, Callable, Dict, Iterator, Optional

from tfaccel.compat import VersionWindow, is_disabled, outside_versions, switched_off
from tfaccel.compat.keras_internals import needs_symbolic_build
from tfaccel.errors import ConfigError
from tfaccel.log import get_logger

__all__ = ["NAME", "UPSTREAM_ISSUES", "AFFECTED_VERSIONS", "is_needed", "why_not_needed", "apply", "remove",
           "is_applied"]

NAME = "keras_mwms"
UPSTREAM_ISSUES = ("keras-team/keras#20585", "tensorflow/tensorflow#72388", "ray-project/ray#47464")
# [first affected, first version not known to be affected): 3.0 .. 3.15.x. Outside the range the fix is not
# applied; re-check upstream (tests/strategies/test_compat_keras_mwms.py reproduces the failure) and widen it.
AFFECTED_VERSIONS: VersionWindow = ((3, 0), (3, 16))

_lock = threading.Lock()
_originals: Dict[str, Any] = {}


def _trainer_module() -> Any:
    from keras.src.backend.tensorflow import trainer

    return trainer


def _is_variable(value: Any) -> bool:
    """A Keras (or TensorFlow) variable, deferred like ``_trainer_module``: the fix is only loaded with Keras."""
    import keras
    import tensorflow as tf

    return isinstance(value, (keras.Variable, tf.Variable))


def why_not_needed() -> Optional[str]:
    """Why the fix should not be applied here, or None when it should.

    Returns:
        A reason (Keras version outside the affected range, or the patched functions are gone), or None.
    """
    import keras

    outside = outside_versions("Keras", keras.__version__, AFFECTED_VERSIONS,
                               f"model.fit fails under MultiWorkerMirroredStrategy, see {', '.join(UPSTREAM_ISSUES)}")
    if outside is not None:
        return outside
    try:
        module = _trainer_module()
    except ImportError as exc:
        return f"keras.src.backend.tensorflow.trainer cannot be imported ({exc}); not patching"
    missing = [name for name in ("reduce_per_replica", "_collective_all_reduce_multi_worker",
                                 "_is_per_replica_instance", "tree")
               if not hasattr(module, name)]
    if not hasattr(getattr(module, "TensorFlowTrainer", None), "_maybe_symbolic_build"):
        missing.append("TensorFlowTrainer._maybe_symbolic_build")
    if missing:
        return (f"Keras {keras.__version__}: keras/src/backend/tensorflow/trainer.py no longer has "
                f"{', '.join(missing)}; the code this fix replaces has changed, not patching")
    return None


def is_needed() -> bool:
    """True when the installed Keras is one this fix is known to be needed on."""
    return why_not_needed() is None


def is_applied() -> bool:
    """True while the fix is in place."""
    return bool(_originals)


@contextlib.contextmanager
def _peeked_batches_only(iterator: Any) -> Iterator[None]:
    """While the model is built: a Python generator's adapter (Keras' ``GeneratorDataAdapter``, the one adapter with
    ``_first_batches``) yields only the batches it peeked, not the user's generator (the build's iterator is thrown
    away, and its prefetching would take batches training never sees). No step runs on the build's batch, so
    nothing writes into those arrays (tfaccel.compat.tf_generator_alias)."""
    adapter = getattr(iterator, "data_adapter", None)
    peeked = getattr(adapter, "_first_batches", None)
    if not peeked or not callable(getattr(adapter, "generator", None)):
        yield
        return
    generator = adapter.generator
    adapter.generator = lambda: iter(peeked)
    try:
        yield
    finally:
        adapter.generator = generator


def _data_spec(iterator: Any) -> Any:
    """The spec of a batch of the data behind Keras' epoch iterator (a ``tf.data.Dataset``'s element spec, or the
    signature Keras' adapter took from a ``PyDataset``'s or a generator's first batches), where each leaf's shape
    is known but for its first axis (a batch's shapes are all the build needs); None otherwise. Building from it
    starts no iterator: one that Keras starts and drops draws an order of a seeded ``shuffle`` or a shuffled
    ``PyDataset``, so the epochs trained on other orders than on one device."""
    import tensorflow as tf

    adapter = getattr(iterator, "data_adapter", None)
    dataset = getattr(adapter, "_dataset", None)
    spec = dataset.element_spec if isinstance(dataset, tf.data.Dataset) else getattr(adapter, "_output_signature",
                                                                                     None)
    leaves = tf.nest.flatten(spec)
    if not leaves or not all(isinstance(leaf, tf.TensorSpec) and leaf.shape.rank
                             and leaf.shape[1:].is_fully_defined() for leaf in leaves):
        return None
    return spec


def _first_batch(iterator: Any, data_batch: Any, strategy: Any, module: Any) -> Any:
    """The first batch of Keras' epoch iterator (a generator's peeked batches only), one replica's part of it."""
    import tensorflow as tf

    with _peeked_batches_only(iterator):
        for _, _, it in iterator:
            batch = next(it)
            break
        else:
            batch = data_batch
    distributed = module.tree.map_structure(lambda x: isinstance(x, tf.distribute.DistributedValues), batch)
    if all(module.tree.flatten(distributed)):
        # Only the shapes matter for building; an eager cross-worker reduce is what fails upstream.
        return module.tree.map_structure(lambda v: strategy.experimental_local_results(v)[0], batch)
    return batch


def _build(model: Any, strategy: Any, data_batch: Any, share: Callable[[], Any]) -> None:
    """Keras' symbolic build from ``data_batch`` in the strategy's scope; a model with its own ``train_step`` that
    cannot be built there is refused (:func:`split_batch_refusal`, shown ``share()``: one replica's share of the
    first batch, read only then, as training will not start)."""
    with strategy.scope():
        try:
            model._symbolic_build(data_batch=data_batch)
        except ValueError as exc:
            refusal = split_batch_refusal(model, strategy, share(), exc)
            if refusal is None:
                raise
            raise refusal from exc


def _make_symbolic_build(original: Callable, module: Any) -> Callable:
    def _maybe_symbolic_build(self: Any, iterator: Any = None, data_batch: Any = None) -> None:
        strategy = self._distribute_strategy
        if strategy is None or iterator is None:
            return original(self, iterator=iterator, data_batch=data_batch)
        # No iterator where no batch is needed: the model is built, or the data's spec gives the shapes (batch axis
        # unknown, as on one device, where Keras builds the model in the train function traced from that spec).
        # No retry from a batch where that build fails: a failed build can leave the model marked built.
        needed = needs_symbolic_build(self)
        spec = _data_spec(iterator) if needed else None
        if not needed or spec is not None:
            _build(self, strategy, spec, lambda: _first_batch(iterator, data_batch, strategy, module))
        else:
            batch = _first_batch(iterator, data_batch, strategy, module)
            _build(self, strategy, batch, lambda: batch)

    _maybe_symbolic_build.__doc__ = f"tfaccel fix for {UPSTREAM_ISSUES[0]} (see tfaccel.compat.keras_mwms)."
    _maybe_symbolic_build._tfaccel_fix = NAME  # type: ignore[attr-defined]
    return _maybe_symbolic_build


def split_batch_refusal(model: Any, strategy: Any, replica_batch: Any, exc: Exception) -> Optional[ConfigError]:
    """The refusal for a model with its own ``train_step`` that cannot be built on one replica's share of a batch.

    Under several replicas Keras builds the model on one replica's share of the first batch (split along axis 0)
    before the first step; on one device it never does. keras-io's metric learning feeds batches whose axis 0 is
    (anchors, positives), not examples: each replica would get only the anchors, and Keras' input-shape check
    fails (plain Keras under ``MirroredStrategy`` too). None where it does not apply (one replica, Keras' own step).
    """
    import keras

    replicas = strategy.num_replicas_in_sync
    if replicas < 2 or type(model).train_step is keras.Model.train_step:
        return None
    shapes = [tuple(getattr(v, "shape", ())) for v in _flatten(replica_batch)]
    reason = " ".join(str(exc).split())[:300]
    return ConfigError(
        f"fit: {type(model).__name__} has its own train_step, and under {replicas} replicas every batch is split "
        f"along axis 0 (one replica's share here: {', '.join(map(str, shapes))}); Keras could not build the model "
        f"on that share before training ({reason}). A train_step whose batch's axis 0 is not examples (keras-io's "
        "metric learning: axis 0 = anchors, positives) cannot be split across replicas. Fix: give every input "
        "its examples on axis 0 (e.g. yield the anchors and the positives as two arrays) and make the train_step "
        'work on any share of them, or train it on one replica with tfaccel.scope(strategy="default")')


def _flatten(structure: Any) -> list:
    """The leaves of a nested batch (Keras' own tree, as the trainer uses)."""
    return _trainer_module().tree.flatten(structure)


def _make_reduce_per_replica(original: Callable, module: Any) -> Callable:
    def reduce_per_replica(values: Any, strategy: Any, reduction: str) -> Any:
        if not module._collective_all_reduce_multi_worker(strategy) or reduction not in ("auto", "mean"):
            return original(values, strategy, reduction)

        def _reduce(value: Any) -> Any:
            if _is_variable(value):  # a synchronized metric variable: the same on every replica and worker
                return value
            first = (strategy.experimental_local_results(value)[0] if module._is_per_replica_instance(value)
                     else value)
            if getattr(getattr(first, "shape", None), "rank", None) == 0:
                return strategy.reduce("MEAN", value, axis=None)  # a scalar has no axis 0
            return original(value, strategy, reduction)

        return module.tree.map_structure(_reduce, values)

    reduce_per_replica.__doc__ = f"tfaccel fix for {UPSTREAM_ISSUES[0]} (see tfaccel.compat.keras_mwms)."
    reduce_per_replica._tfaccel_fix = NAME  # type: ignore[attr-defined]
    return reduce_per_replica


def apply(*, force: bool = False) -> bool:
    """Puts the fix in place (idempotent).

    Args:
        force: patch even when ``TFACCEL_DISABLE_COMPAT`` lists this fix. Defaults to False.

    Returns:
        True when the fix is in place after the call, False when it was not applied (the reason is logged).
    """
    logger = get_logger()
    with _lock:
        if _originals:
            return True
        if not force and is_disabled(NAME):
            logger.warning("compat fix %s: %s; Keras model.fit under MultiWorkerMirroredStrategy is expected to "
                           "fail (%s)", NAME, switched_off(NAME), UPSTREAM_ISSUES[0])
            return False
        reason = why_not_needed()
        if reason is not None:
            logger.info("compat fix %s not applied: %s", NAME, reason)
            return False
        module = _trainer_module()
        trainer_cls = module.TensorFlowTrainer
        _originals["_maybe_symbolic_build"] = trainer_cls.__dict__["_maybe_symbolic_build"]
        _originals["reduce_per_replica"] = module.reduce_per_replica
        trainer_cls._maybe_symbolic_build = _make_symbolic_build(_originals["_maybe_symbolic_build"], module)
        module.reduce_per_replica = _make_reduce_per_replica(_originals["reduce_per_replica"], module)
        logger.debug("compat fix %s applied (%s)", NAME, ", ".join(UPSTREAM_ISSUES))
        return True


def remove() -> bool:
    """Restores Keras' own functions.

    Returns:
        True when something was restored, False when the fix was not in place.
    """
    with _lock:
        if not _originals:
            return False
        module = _trainer_module()
        module.TensorFlowTrainer._maybe_symbolic_build = _originals.pop("_maybe_symbolic_build")
        module.reduce_per_replica = _originals.pop("reduce_per_replica")
        return True
