"""Recomputation (gradient checkpointing) of whole blocks of a Keras 3 functional model on the TF backend.

:func:`enable_recompute` changes the user's model in place: its ``call`` runs the model's own graph as a chain of
sub-graphs (``keras.Model(block_input, block_output)`` over the *same* layers, so no variable is copied), and each
chosen block runs inside a ``tf.custom_gradient`` that keeps only the block's input for the backward pass and
recomputes the block's activations there. ``fit`` / ``train_step`` / ``tfaccel.fit`` then train it as usual.

Why not plain ``tf.recompute_grad`` (what ``keras.remat`` / ``keras.RematScope`` use on this backend, Keras 3.15.1 /
TF 2.21.0): its replay runs the block's stateful code a second time. BatchNormalization then applies its moving
average update twice per step, and Dropout draws a *new* mask from its ``SeedGenerator`` (whose state it advances
again), so the gradients belong to a different network than the forward pass. Here the replay runs inside a
``keras.StatelessScope`` that maps the block's non-trainable state (moving statistics, seed states) to the values
it had before the forward pass and discards the replay's assignments: the same masks, one update per step.
Like ``tf.recompute_grad``, the replay's input gets a data dependency on the incoming gradient so that neither
Grappler nor XLA can merge the replay with the forward pass (which would silently undo the recomputation).

Example:
    >>> import tfaccel.memory
    >>> model = build_resnet50()                          # doctest: +SKIP
    >>> tfaccel.memory.enable_recompute(model)[:2]        # doctest: +SKIP
    ['stage1_block1', 'stage1_block2']
"""

import os.path
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import keras
import numpy as np
import tensorflow as tf

from tfaccel.compat.tf_tape import stop_recording
from tfaccel.errors import ConfigError
from tfaccel.log import get_logger

__all__ = ["AUTO_CHOICES", "AUTO_SHARE", "BLOCK_PATTERN", "enable_recompute", "disable_recompute", "recompute_blocks",
           "find_blocks", "recompute_call"]

BLOCK_PATTERN = r"^([A-Za-z]+[0-9]+(?:_[A-Za-z]+[0-9]+)*)_"
"""``blocks="all"``/``"auto"`` group the layers by the longest prefix of ``<letters><digits>_`` parts of their
names: the residual blocks ``stage1_block1_...`` of models/resnet.py (and ``conv2_block1_...`` of
keras.applications), the ``encoder1_...`` blocks of models/transformer.py. Per residual block rather than per stage: on ResNet-50 (batch 8,
224x224) the traced peak fell 28% with stages and 42% with blocks, because the replay of a whole 56x56 stage is
itself a third of the activations."""

AUTO_CHOICES = ("auto", "all")
AUTO_SHARE = 2.0 / 3.0
"""``blocks="auto"`` recomputes the blocks with the largest activations first, until they hold this share of the
activations of all blocks; ``"all"`` recomputes every block. On ResNet-50 "auto" is the 7 blocks of stages 1-2:
the later blocks hold little activation memory for as much compute each, so recomputing them costs time and
saves little."""

_STATE_ATTR = "_tfaccel_recompute"  # set on the model: {"blocks": [...], "call": the original bound call}

BlocksArg = Union[str, Sequence[Any]]


def _ops_by_name(model: Any) -> Dict[str, Any]:
    return {op.name: op for op in model.operations}


def _auto_groups(model: Any) -> Dict[str, List[Any]]:
    groups: Dict[str, List[Any]] = {}
    for op in model.operations:
        match = re.match(BLOCK_PATTERN, op.name)
        if match:
            groups.setdefault(match.group(1), []).append(op)
    return groups


def _activation_size(ops: List[Any]) -> int:
    """Bytes per example of the outputs of the block's layers (shapes from the functional graph)."""
    total = 0
    for op in ops:
        for out in _flat(op.output):
            dims = [d for d in out.shape[1:] if d is not None]
            itemsize = np.dtype(str(out.dtype).replace("bfloat16", "float16")).itemsize
            total += int(np.prod(dims, dtype=np.int64)) * itemsize
    return total


def _largest_share(groups: Dict[str, List[Any]], share: float) -> Dict[str, List[Any]]:
    sizes = {name: _activation_size(ops) for name, ops in groups.items()}
    chosen: Dict[str, List[Any]] = {}
    covered, total = 0, sum(sizes.values())
    for name in sorted(groups, key=lambda n: -sizes[n]):  # stable: equal sizes keep model order
        if covered >= share * total * (1 - 1e-9):  # 2 of 3 equal blocks is 2/3, whatever the rounding
            break
        chosen[name] = groups[name]
        covered += sizes[name]
    return chosen


def _flat(value: Any) -> List[Any]:
    return [t for t in keras.tree.flatten(value) if t is not None]


def _node_io(op: Any, model_name: str) -> Tuple[List[Any], List[Any]]:
    try:
        return _flat(op.input), _flat(op.output)
    except (AttributeError, ValueError) as exc:  # called more than once (shared layer), or never called
        raise ConfigError(f"recompute: layer {op.name!r} of model {model_name!r} is not called exactly once in the "
                          f"graph ({exc}); a block must contain layers called once. Pass other blocks= "
                          "(layer names or groups) or recompute=None") from exc


def _block_boundary(model: Any, name: str, ops: List[Any]) -> Tuple[Any, Any]:
    """Returns the one tensor that enters the block and the one that leaves it, or raises ConfigError."""
    inside = {id(op) for op in ops}
    produced: Dict[int, Any] = {}
    consumed: Dict[int, Any] = {}
    for op in ops:
        inputs, outputs = _node_io(op, model.name)
        consumed.update((id(t), t) for t in inputs)
        produced.update((id(t), t) for t in outputs)
    entering = [t for key, t in consumed.items() if key not in produced]
    used_outside = {id(t) for op in model.operations if id(op) not in inside for t in _node_io(op, model.name)[0]}
    used_outside.update(id(t) for t in _flat(model.outputs))
    leaving = [t for key, t in produced.items() if key in used_outside]
    if len(entering) != 1 or len(leaving) != 1:
        raise ConfigError(
            f"recompute: block {name!r} of model {model.name!r} has {len(entering)} input tensor(s) and "
            f"{len(leaving)} output tensor(s); a recomputed block must take one tensor and give one tensor "
            f"(layers: {', '.join(op.name for op in ops[:6])}{', ...' if len(ops) > 6 else ''}). "
            "Pass blocks= as lists of layer names that form such a part, or recompute=None")
    return entering[0], leaving[0]


def _group_name(names: List[str], index: int, taken: Dict[str, Any]) -> str:
    """A block's name: its one layer's name, else the layers' common name prefix, else ``block<index>``."""
    name = names[0] if len(names) == 1 else os.path.commonprefix(names).rstrip("_")
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", name) or f"block{index}"
    return name if name not in taken else f"{name}_{index}"


def _requested_groups(model: Any, blocks: BlocksArg) -> Dict[str, List[Any]]:
    if isinstance(blocks, str):
        if blocks not in AUTO_CHOICES:
            raise ConfigError(f"recompute blocks: unknown value {blocks!r}; valid values are: 'auto', 'all', a list "
                              "of layer names or layers, or a list of such lists (one per block)")
        groups = _auto_groups(model)
        if groups and blocks == "auto":
            groups = _largest_share(groups, AUTO_SHARE)
        if not groups:
            raise ConfigError(
                f"recompute blocks={blocks!r}: model {model.name!r} has no layers named like blocks "
                f"('<name><N>_...', e.g. stage1_block1_conv, encoder2_ff1; pattern {BLOCK_PATTERN}), so tfaccel cannot "
                "split it. Pass blocks= as a list of layer names (each a one-input, one-output part of the "
                "model), or recompute=None")
        return groups
    by_name = _ops_by_name(model)
    groups = {}
    for item in blocks:
        members = [item] if isinstance(item, str) or not isinstance(item, (list, tuple)) else list(item)
        ops = []
        for member in members:
            key = member if isinstance(member, str) else getattr(member, "name", None)
            if key not in by_name or (not isinstance(member, str) and by_name[key] is not member):
                raise ConfigError(f"recompute blocks: {member!r} is not a layer of model {model.name!r}; layers: "
                                  f"{', '.join(list(by_name)[:20])}{', ...' if len(by_name) > 20 else ''}")
            ops.append(by_name[key])
        groups[_group_name([op.name for op in ops], len(groups) + 1, groups)] = ops
    if not groups:
        raise ConfigError("recompute blocks: received an empty list; give 'auto' or at least one layer name")
    return groups


def _ordered_blocks(model: Any, groups: Dict[str, List[Any]]) -> List[Tuple[str, Any, Any]]:
    position = {id(op): i for i, op in enumerate(model.operations)}
    order = sorted(groups, key=lambda name: min(position[id(op)] for op in groups[name]))
    return [(name, *_block_boundary(model, name, groups[name])) for name in order]


def _sub_model(model: Any, inputs: Any, outputs: Any, what: str) -> Any:
    try:
        return keras.Model(inputs, outputs, name=f"{model.name}_{what}")
    except ValueError as exc:  # Keras: "Output ... is not connected to `inputs`"
        raise ConfigError(
            f"recompute: model {model.name!r} cannot be cut into a chain at {what} ({exc}); every tensor after a "
            "block's output must depend on the model's inputs only through that output (no skip connection "
            "across a block boundary). Choose other blocks= or recompute=None") from exc


def _chain(model: Any, blocks: List[Tuple[str, Any, Any]]) -> List[Tuple[Optional[str], Any]]:
    """Cuts the model into [(block name or None, sub-model)] that, run in order, compute the model."""
    chain: List[Tuple[Optional[str], Any]] = []
    current: Any = model.inputs
    outputs = model.outputs
    for name, entering, leaving in blocks:
        if not (len(_flat(current)) == 1 and _flat(current)[0] is entering):
            chain.append((None, _sub_model(model, current, entering, f"before_{name}")))
        chain.append((name, _sub_model(model, entering, leaving, name)))
        current = leaving
    if not (len(outputs) == 1 and outputs[0] is current):
        chain.append((None, _sub_model(model, current, outputs if len(outputs) > 1 else outputs[0], "head")))
    return chain


def _replay_dependency(x: Any, upstream: Any) -> Any:
    """x + 0 computed from the incoming gradient, so the replay cannot run before, or be merged with, the forward
    pass (the same trick as tf.recompute_grad; XLA ignores control dependencies)."""
    elem = tf.reduce_max(tf.reshape(upstream, [-1])[:1])
    elem_bool = tf.cast(elem, tf.bool)
    zero = tf.where(tf.equal(elem_bool, elem_bool), 0.0, float("nan"))
    return x + tf.cast(zero, x.dtype)


def recompute_call(block: Any, x: Any, training: Any) -> Any:
    """Runs ``block(x)`` keeping only ``x`` for the backward pass, where the block's activations are recomputed.

    Args:
        block: a Keras layer or functional sub-model with one tensor input and one tensor output.
        x: the input tensor.
        training: passed to the block.

    Returns:
        The block's output; its gradient recomputes the block under the forward pass's state (seeds, statistics).
    """
    state = list(block.non_trainable_variables)

    @tf.custom_gradient
    def forward(x_in: Any) -> Any:
        before = [tf.identity(tf.cast(v.value, v.dtype)) for v in state]  # read before the forward's updates
        with stop_recording():  # as tf.recompute_grad: an eager outer tape must not keep the block's tensors
            output = block(x_in, training=training)

        def backward(upstream: Any, variables: Optional[List[Any]] = None) -> Any:
            variables = list(variables or [])
            replay_in = x_in if tf.executing_eagerly() else _replay_dependency(x_in, upstream)
            with tf.GradientTape() as tape:
                tape.watch(replay_in)
                tape.watch(variables)
                with keras.StatelessScope(state_mapping=list(zip(state, before))):
                    replayed = block(replay_in, training=training)
            grads = tape.gradient(replayed, [replay_in] + variables, output_gradients=upstream)
            return grads[0], grads[1:]

        return output, backward

    return forward(x)


def _make_call(chain: List[Tuple[Optional[str], Any]]) -> Any:
    def call(inputs: Any, training: Any = None, mask: Any = None, **kwargs: Any) -> Any:
        del mask, kwargs  # Functional.call's extras; the reference models take neither
        x = inputs
        for name, part in chain:
            x = part(x, training=training) if name is None else recompute_call(part, x, training)
        return x

    return call


def _is_functional(model: Any) -> bool:
    try:
        return bool(model.inputs) and bool(model.outputs) and bool(model.operations)
    except (AttributeError, ValueError):  # subclassed models have no symbolic inputs
        return False


def enable_recompute(model: Any, blocks: BlocksArg = "auto") -> List[str]:
    """Makes ``model`` recompute the activations of ``blocks`` in the backward pass, in place.

    The model stays the user's object: its layers and variables are unchanged, ``model.fit`` and tfaccel's loops
    train it through its own ``train_step``, and saving writes the same model (recomputation is not saved; call
    this again after loading). Memory falls when the step runs as a graph (``fit``'s default); with
    ``run_eagerly=True`` the result is the same but the saving is smaller.

    Args:
        model: a built Keras 3 functional model (``keras.Model(inputs, outputs)``).
        blocks: ``"all"`` (layers grouped by their ``<name><N>_`` prefix, see :data:`BLOCK_PATTERN`: the residual
            blocks of models/resnet.py, the encoder blocks of models/transformer.py), ``"auto"`` (of those, the
            ones with the largest activations, see :data:`AUTO_SHARE`), or a list whose items are a layer
            name, a layer, or a list of them (one block each). Each block must take one tensor and give one,
            and the model must be a chain of them. Defaults to ``"auto"``.

    Returns:
        The names of the recomputed blocks, in the order the model runs them.

    Raises:
        ConfigError: the model is not functional, ``blocks`` names no layer of it, or the model cannot be cut there
            (the message says why and what to pass instead).

    Example:
        >>> enable_recompute(model, blocks=[["b1_dense", "b1_bn"], "b2"])  # doctest: +SKIP
        ['b1', 'b2']
    """
    if not _is_functional(model):
        raise ConfigError(f"recompute: model {getattr(model, 'name', model)!r} is a {type(model).__name__}, not a "
                          "functional keras.Model(inputs, outputs); tfaccel can only cut a functional graph. "
                          "Build the model with the functional API or pass recompute=None")
    if getattr(model, _STATE_ATTR, None):
        disable_recompute(model)
    chain = _chain(model, _ordered_blocks(model, _requested_groups(model, blocks)))
    names = [name for name, _ in chain if name is not None]
    original = model.__dict__.get("call")
    # object.__setattr__: Keras' attribute tracking must not adopt the sub-models (they would appear as layers)
    object.__setattr__(model, "call", _make_call(chain))
    object.__setattr__(model, _STATE_ATTR, {"blocks": tuple(names), "call": original})
    get_logger().info("recompute: model %s recomputes %d block(s) in the backward pass: %s", model.name, len(names),
                      ", ".join(names))
    return names


def recompute_blocks(model: Any) -> Tuple[str, ...]:
    """Returns the blocks ``model`` recomputes (empty when :func:`enable_recompute` was not called)."""
    return tuple((getattr(model, _STATE_ATTR, None) or {}).get("blocks", ()))


def disable_recompute(model: Any) -> None:
    """Undoes :func:`enable_recompute` on ``model`` (no-op when it is not enabled)."""
    state = getattr(model, _STATE_ATTR, None)
    if not state:
        return
    if state["call"] is None:
        object.__delattr__(model, "call")
    else:
        object.__setattr__(model, "call", state["call"])
    object.__setattr__(model, _STATE_ATTR, None)


def find_blocks(model: Any, blocks: BlocksArg = "auto") -> List[str]:
    """Returns the block names :func:`enable_recompute` would use, without changing the model.

    Raises:
        ConfigError: as :func:`enable_recompute`.
    """
    chain = _chain(model, _ordered_blocks(model, _requested_groups(model, blocks)))
    return [name for name, _ in chain if name is not None]
