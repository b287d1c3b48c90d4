"""The inputs and labels of the step ``estimate_memory`` traces: one ``tf.TensorSpec`` per model input, in the
model's own input structure (one tensor, a list, a dict such as KerasHub's ``{"token_ids": ..., "padding_mask":
...}``, or nested), at the per-replica batch.

Every axis but the batch needs a size to trace with static shapes. An input's own shape gives it; where the model
leaves an axis open (KerasHub's backbones take sequences of any length), ``input_shape`` gives one example's shape
to every input of that rank whose known axes agree, and an axis still open is an error that says so.
"""

from typing import Any, List, Optional, Sequence, Tuple

import keras
import tensorflow as tf

from tfaccel.errors import ConfigError

__all__ = ["step_specs"]

Shape = Tuple[Optional[int], ...]


def _fits(shape: Shape, given: Tuple[int, ...]) -> bool:
    return len(shape) == len(given) and all(d is None or d == g for d, g in zip(shape, given))


def _describe(tensors: Sequence[Any]) -> str:
    return ", ".join(f"{t.name!r} {tuple(t.shape)}" for t in tensors)


def _example_shapes(model: Any, tensors: List[Any], input_shape: Optional[Sequence[int]]) -> List[Tuple[int, ...]]:
    """One example's shape of each input (flattened order), ``input_shape`` filling the axes the model leaves open."""
    shapes: List[Shape] = [tuple(t.shape[1:]) for t in tensors]
    if input_shape is not None:
        given = tuple(int(d) for d in input_shape)
        fitting = [i for i, shape in enumerate(shapes) if _fits(shape, given)]
        if not fitting:
            raise ConfigError(f"input_shape: {given} fits none of the inputs of model {model.name!r} "
                              f"({_describe(tensors)}; the first axis is the batch); pass one example's shape of an "
                              "input (the same rank, the same known sizes), or leave input_shape out")
        for i in fitting:
            shapes[i] = given
    for tensor, shape in zip(tensors, shapes):
        if None in shape:
            raise ConfigError(f"input_shape: input {tensor.name!r} of model {model.name!r} has shape "
                              f"{tuple(tensor.shape)}, open along an axis besides the batch, and the step is traced "
                              f"with static shapes; pass one example's shape, e.g. input_shape=(128,) for sequences "
                              f"of 128 tokens (its inputs: {_describe(tensors)})")
    return [tuple(int(d) for d in shape) for shape in shapes]


def _label_spec(model: Any, x: Any, batch: int) -> tf.TensorSpec:
    """Integer class ids for sparse categorical cross-entropy: the first output's shape without its class axis."""
    output = model.outputs[0]
    if None in tuple(output.shape[1:]):  # an open axis (a sequence's length): the output at the traced inputs
        symbolic = keras.tree.map_structure(lambda s: keras.KerasTensor(tuple(s.shape), dtype=s.dtype.name), x)
        output = keras.tree.flatten(model.compute_output_spec(symbolic))[0]
    return tf.TensorSpec((batch,) + tuple(int(d) for d in output.shape[1:-1]), "int32")


def step_specs(model: Any, batch: int, input_shape: Optional[Sequence[int]] = None) -> Tuple[Any, tf.TensorSpec]:
    """The ``(x, y)`` specs of one training step of ``model`` at ``batch`` examples.

    Args:
        model: a built functional or Sequential ``keras.Model``.
        batch: the per-replica batch.
        input_shape: one example's shape, for the inputs whose axes the model leaves open. Defaults to None.

    Returns:
        ``(x, y)``: ``x`` in the structure of ``model.input``, ``y`` the integer labels.

    Raises:
        ConfigError: ``input_shape`` fits no input, or an input stays open along an axis besides the batch.

    Example:
        >>> x, y = step_specs(keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)]), 8)
        >>> x.shape, y.shape
        (TensorShape([8, 4]), TensorShape([8]))
    """
    # A Sequential model has one input and no ``input`` until it is called; a functional one keeps its structure.
    structure = model.inputs[0] if isinstance(model, keras.Sequential) else model.input
    tensors = keras.tree.flatten(structure)
    shapes = _example_shapes(model, tensors, input_shape)
    specs = [tf.TensorSpec((batch,) + shape, t.dtype) for t, shape in zip(tensors, shapes)]
    x = keras.tree.pack_sequence_as(structure, specs)
    return x, _label_spec(model, x, batch)
