"""Keras 3 variables sharded by ``ParameterServerStrategy``'s ``variable_partitioner``.

Upstream: keras-team/keras#18624 (Keras 3 has no parameter-server support: "stick to tf.keras"). Seen with
Keras 3.15.1 on TensorFlow 2.21 (checked here). A Keras 3 variable created under a ``ParameterServerStrategy``
with a ``variable_partitioner`` wraps a ``tf.distribute`` ``ShardedVariable`` (one ``tf.Variable`` per shard, on
different ps tasks). Keras' TensorFlow variable (``keras/src/backend/tensorflow/core.py``) forwards ``handle`` to
its value, which a ``ShardedVariable`` does not have, so the first training step fails in ``GradientTape.gradient``
(and would fail again in the optimizer, which updates one ``tf.Variable`` per model variable)::

    AttributeError: 'ShardedVariable' object has no attribute 'handle'

The fix, in three parts:

* :func:`trainable_shards` hands the training step and the optimizer one Keras variable per *shard* (a Keras
  variable wrapping the shard's own ``tf.Variable``, no copy) instead of the sharded one. Gradients are taken per
  shard and the optimizer builds its slots per shard, colocated with it (Keras' TensorFlow optimizer creates
  slots under ``colocate_vars_with``), so each ps task updates only its own rows.
* :func:`apply` makes ``keras.layers.Embedding`` look up a sharded table with ``tf.nn.embedding_lookup`` over the
  shards ("div" partitioning, which is how the strategy splits rows), so only the rows of the batch leave the ps
  tasks and the gradient of each shard is an ``IndexedSlices`` (a sparse update per shard). Without it Keras'
  ``ops.take`` first concatenates the whole table (a ``ShardedVariable`` converts to a tensor by ``concat``).
* Checkpoints (also :func:`apply`): Keras' TF variable saves its value's own tensors, which a ``ShardedVariable``
  does not give (``AttributeError: 'ShardedVariable' object has no attribute 'device'`` in ``tf.train.Checkpoint.write``). A
  sharded variable is saved as one whole tensor under the usual key, so the checkpoint restores into any number
  of shards, or into the same model built without the strategy (the side-car evaluator); each shard restores its
  rows. The saving process reads the whole table (25.6 MB for 200k x 32 float32). ``np.asarray`` of the variable
  (what ``model.save("x.keras")`` reads) fails the same way (no ``__array__``) and reads the whole table too.

All are version-guarded (:data:`AFFECTED_VERSIONS`) and can be switched off with
``TFACCEL_DISABLE_COMPAT=keras_sharded`` (then the upstream failure comes back; the test checks it does).
"""

import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tfaccel.compat import VersionWindow, gate
from tfaccel.log import get_logger

__all__ = ["NAME", "UPSTREAM_ISSUES", "AFFECTED_VERSIONS", "why_not_needed", "is_needed", "sharded_value",
           "trainable_shards", "placements", "apply", "remove", "is_applied"]

NAME = "keras_sharded"
UPSTREAM_ISSUES = ("keras-team/keras#18624",)
# [first affected, first version not known to be affected): Keras 3.0 .. 3.15.x. Re-check upstream
# (tests/training/test_sharded_variables.py reproduces the failure with the fix off) before widening it.
AFFECTED_VERSIONS: VersionWindow = ((3, 0), (3, 16))

_lock = threading.Lock()
_originals: Dict[str, Any] = {}
_SHARDS_ATTR = "_tfaccel_shard_variables"


def why_not_needed() -> Optional[str]:
    """Why the fix should not be applied here, or None when it should.

    Returns:
        A reason (switched off, or Keras outside the affected versions), or None.
    """
    import keras

    return gate(NAME, "Keras", keras.__version__, AFFECTED_VERSIONS,
                f"training a sharded variable fails, see {', '.join(UPSTREAM_ISSUES)}")


def is_needed() -> bool:
    """True when the fix applies here (Keras in the affected versions, not switched off)."""
    return why_not_needed() is None


def sharded_value(variable: Any) -> Any:
    """The ``ShardedVariable`` behind a Keras variable (or the variable itself if it is one), else None."""
    from tensorflow.python.distribute.sharded_variable import ShardedVariable

    value = getattr(variable, "_value", variable)  # Keras' TF variable keeps its tf.Variable in _value
    return value if isinstance(value, ShardedVariable) else None


def _shard_views(variable: Any, sharded: Any) -> List[Any]:
    """One Keras variable per shard, wrapping the shard's tf.Variable (made once, kept on the variable)."""
    import keras

    views = getattr(variable, _SHARDS_ATTR, None)
    if views is None:
        name = getattr(variable, "name", "sharded")
        views = [keras.Variable(shard, trainable=variable.trainable, name=f"{name}_part_{i}")
                 for i, shard in enumerate(sharded.variables)]
        object.__setattr__(variable, _SHARDS_ATTR, views)
    return views


def trainable_shards(variables: Sequence[Any]) -> List[Any]:
    """The variables to differentiate and update: each sharded one replaced by one Keras variable per shard.

    Args:
        variables: the model's trainable variables.

    Returns:
        The same list when nothing is sharded or the fix is off; else the list with every sharded variable
        replaced, in place, by its shards in order (each wraps the shard's ``tf.Variable``: no copy).
    """
    if not any(sharded_value(v) is not None for v in variables) or not is_needed():
        return list(variables)
    out: List[Any] = []
    for variable in variables:
        sharded = sharded_value(variable)
        out += [variable] if sharded is None else _shard_views(variable, sharded)
    return out


def placements(variables: Sequence[Any], *, min_bytes: int = 256 << 10) -> List[Dict[str, Any]]:
    """How each large variable is placed: every sharded one, and unsharded ones of at least ``min_bytes``.

    Args:
        variables: Keras (or tf) variables, e.g. ``model.variables``.
        min_bytes: the size from which an unsharded variable is listed. Defaults to 256 KiB.

    Returns:
        One dict per variable: ``name``, ``shape``, ``shards`` (count), ``shard_shapes``, ``devices``.
    """
    out = []
    for variable in variables:
        sharded = sharded_value(variable)
        parts = list(sharded.variables) if sharded is not None else [getattr(variable, "_value", variable)]
        shape = [int(d) for d in (sharded.shape if sharded is not None else variable.shape)]
        if sharded is None and int(np.prod(shape)) * np.dtype(str(parts[0].dtype.name)).itemsize < min_bytes:
            continue
        out.append({"name": getattr(variable, "path", None) or variable.name, "shape": shape, "shards": len(parts),
                    "shard_shapes": [[int(d) for d in p.shape] for p in parts],
                    "devices": [getattr(p, "device", "") for p in parts]})
    return out


def _embedding_call(original: Any) -> Any:
    """``Embedding.call`` that looks rows up shard by shard when the table is sharded."""

    def call(self: Any, inputs: Any) -> Any:
        import tensorflow as tf
        from keras.src.backend.common.stateless_scope import get_stateless_scope

        table = getattr(self, "_embeddings", None)
        sharded = sharded_value(table) if table is not None else None
        scope = get_stateless_scope()
        mapped = scope is not None and scope.get_current_value(table) is not None
        if sharded is None or mapped or getattr(self, "quantization_mode", None) or getattr(self, "lora_enabled", 0):
            return original(self, inputs)
        ids = tf.cast(inputs, "int32") if inputs.dtype not in (tf.int32, tf.int64) else inputs
        outputs = tf.nn.embedding_lookup(list(sharded.variables), ids)  # "div", as the strategy splits
        return tf.cast(outputs, self.compute_dtype) if outputs.dtype != self.compute_dtype else outputs

    call._tfaccel_fix = NAME  # type: ignore[attr-defined]
    return call


def _serialize(original: Any) -> Any:
    """Keras' ``Variable._serialize_to_tensors`` that saves a sharded value as one whole tensor."""

    def _serialize_to_tensors(self: Any) -> Any:
        sharded = sharded_value(self)
        if sharded is None:
            return original(self)
        import tensorflow as tf

        # The whole table, read on the saving process: the checkpoint then restores into any number of shards
        # (one, in a model built without the strategy) and reads like an unsharded variable's.
        return {"VARIABLE_VALUE": tf.convert_to_tensor(sharded)}

    _serialize_to_tensors._tfaccel_fix = NAME  # type: ignore[attr-defined]
    return _serialize_to_tensors


def _restore(original: Any) -> Any:
    """Keras' ``Variable._restore_from_tensors`` that gives each shard its rows of the saved tensor."""

    def _restore_from_tensors(self: Any, restored_tensors: Any) -> Any:
        sharded = sharded_value(self)
        if sharded is None:
            return original(self, restored_tensors)
        return sharded.assign(restored_tensors["VARIABLE_VALUE"])  # ShardedVariable.assign slices per shard

    _restore_from_tensors._tfaccel_fix = NAME  # type: ignore[attr-defined]
    return _restore_from_tensors


def _array(original: Any) -> Any:
    """Keras' ``Variable.__array__`` (``.keras`` saving, ``np.asarray``) that reads a sharded value whole."""

    def __array__(self: Any, dtype: Any = None, *args: Any, **kwargs: Any) -> Any:
        sharded = sharded_value(self)
        if sharded is None:
            return original(self, dtype, *args, **kwargs)
        import tensorflow as tf

        return np.asarray(tf.convert_to_tensor(sharded).numpy(), dtype=dtype)

    __array__._tfaccel_fix = NAME  # type: ignore[attr-defined]
    return __array__


def _patches() -> Dict[str, Tuple[Any, str, Any]]:
    """name -> (class, attribute, wrapper factory) of every patch."""
    import keras
    from keras.src.backend.tensorflow.core import Variable

    return {"Embedding.call": (keras.layers.Embedding, "call", _embedding_call),
            "Variable._serialize_to_tensors": (Variable, "_serialize_to_tensors", _serialize),
            "Variable._restore_from_tensors": (Variable, "_restore_from_tensors", _restore),
            "Variable.__array__": (Variable, "__array__", _array)}


def apply(*, force: bool = False) -> bool:
    """Patches ``keras.layers.Embedding.call`` and the checkpointing of Keras' TF variable (idempotent).

    :func:`trainable_shards` needs no patch.

    Args:
        force: apply even when :func:`why_not_needed` gives a reason. Defaults to False.

    Returns:
        True when the patch is in place after the call.
    """
    reason = why_not_needed()
    if reason and not force:
        get_logger().debug("compat fix %s not applied: %s", NAME, reason)
        return False
    with _lock:
        for name, (owner, attr, wrap) in _patches().items():
            if name not in _originals:  # (own attribute or None: inherited, e.g. __array__ from KerasVariable)
                _originals[name] = (owner.__dict__.get(attr), getattr(owner, attr))
                setattr(owner, attr, wrap(_originals[name][1]))
    return True


def remove() -> bool:
    """Restores Keras' own methods; returns whether anything was restored."""
    with _lock:
        restored = False
        for name, (owner, attr, _) in _patches().items():
            if name not in _originals:
                continue
            own, _ = _originals.pop(name)
            if own is None:
                delattr(owner, attr)
            else:
                setattr(owner, attr, own)
            restored = True
        return restored


def is_applied() -> bool:
    """True while the patches are in place."""
    return bool(_originals)
