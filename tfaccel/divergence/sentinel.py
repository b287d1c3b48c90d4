"""The NaN/Inf sentinel (``tfaccel doctor --nan``): the first step of a run with a non-finite value, and the first
layer that produced one on that step's batch."""

from typing import Any, Dict, List, Optional, Sequence

import keras
import numpy as np

__all__ = ["first_nonfinite_step", "nan_origin"]


def first_nonfinite_step(steps: Sequence[Any]) -> Optional[int]:
    """The first recorded step with a non-finite log, gradient or variable value; None when there is none."""
    for facts in steps:
        logs_bad = any(not np.isfinite(v) for v in facts.logs.values())
        if logs_bad or facts.nonfinite_grads or facts.nonfinite_values:
            return facts.step
    return None


def _count(value: Any) -> int:
    array = np.asarray(value)
    return int(np.sum(~np.isfinite(array))) if np.issubdtype(array.dtype, np.floating) else 0


def _layer_outputs(model: Any, x: Any) -> Optional[List[tuple]]:
    """``(layer name, its output on x)`` for each layer of a Sequential or functional model; None otherwise."""
    inputs = getattr(model, "inputs", None)
    if not inputs:
        return None
    layers = [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]
    probe = keras.Model(inputs, [layer.output for layer in layers])
    outputs = probe(x if isinstance(x, (list, tuple, dict)) else [x], training=True)
    outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    return [(layer.name, out) for layer, out in zip(layers, outputs)]


def nan_origin(model: Any, before: Sequence[np.ndarray], batch: tuple, step: int) -> Dict[str, Any]:
    """Where the first non-finite value of ``step`` comes from: the model is given the variables' values from
    before that step and its layers are run one by one on the step's global batch (training mode).

    Returns:
        ``{"step", "layer", "what"}``: ``layer`` is the first layer whose output holds NaN/Inf, or None when the
        forward pass is finite (then the loss or the gradients are not) or the model is subclassed.
    """
    for variable, value in zip(model.variables, before):
        variable.assign(value)
    x, y = batch[0], batch[1] if len(batch) > 1 else None
    outputs = _layer_outputs(model, x)
    if outputs is None:
        return {"step": step, "layer": None, "what": "a subclassed model: its layers cannot be run one by one; run "
                                                     "the step under tf.debugging.enable_check_numerics()"}
    for name, out in outputs:
        bad = _count(out)
        if bad:
            return {"step": step, "layer": name, "what": f"the output of layer {name} holds {bad} NaN/Inf values"}
    loss = model.compute_loss(x=x, y=y, y_pred=outputs[-1][1], training=True) if y is not None else None
    if loss is not None and _count(loss):
        return {"step": step, "layer": None, "what": "every layer's output is finite, the loss is not"}
    return {"step": step, "layer": None, "what": "the forward pass and the loss are finite: the gradients are not "
                                                 "(a sqrt, log or division of zero in the backward pass, or a loss "
                                                 "scale that overflows)"}
