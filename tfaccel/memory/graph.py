"""Activation memory of one training step, read from the traced graph of the model's own ``train_step``.

The step is traced (not run) with a fixed per-replica batch, so every tensor has a static shape. The graph is then
played in creation order (forward, then backward in reverse, then the optimizer: a valid topological order, and
the order TF's executor mostly follows on one device): each op's outputs are allocated when it runs and freed after
their last reader has run; outputs of ops that only relabel a buffer (Identity, Reshape, ...) share it. Only tensors
that depend on the batch count (activations, their gradients, the weight gradients); variables, their reads and
constants are the parameter/optimizer part of the estimate. The peak of the live bytes is the step's activation
memory, including the temporaries of the backward pass and, with recomputation, the replay of one block.
"""

from typing import Any, Dict, Iterable, List, Set, Tuple

__all__ = ["ALIAS_OPS", "graph_activation_peak", "saved_activation_bytes"]

ALIAS_OPS = frozenset({"Identity", "IdentityN", "Reshape", "Squeeze", "ExpandDims", "StopGradient", "Snapshot",
                       "PreventGradient", "EnsureShape"})
_NO_DATA_OPS = frozenset({"VarHandleOp", "ReadVariableOp", "Const", "ResourceGather"})


def _tensor_bytes(tensor: Any) -> int:
    shape = tensor.shape
    if shape.rank is None:
        return 0
    size = 1
    for dim in shape.as_list():
        size *= int(dim) if dim is not None else 1
    try:
        return size * tensor.dtype.size
    except (AttributeError, TypeError):  # resource / variant handles carry no buffer of their own
        return 0


def _data_dependent(ops: List[Any], roots: Iterable[Any]) -> Set[str]:
    """Names of the tensors reachable from the placeholders (the batch), following data edges only."""
    reached: Set[str] = {t.name for t in roots}
    for op in ops:
        if op.type in _NO_DATA_OPS:
            continue
        if any(t.name in reached for t in op.inputs):
            reached.update(t.name for t in op.outputs)
    return reached


def _buffers(ops: List[Any], data: Set[str]) -> Tuple[Dict[str, str], Dict[str, int]]:
    """Maps each data-dependent tensor to the buffer it lives in, and each buffer to its size in bytes."""
    owner: Dict[str, str] = {}
    size: Dict[str, int] = {}
    for op in ops:
        for index, out in enumerate(op.outputs):
            if out.name not in data:
                continue
            source = op.inputs[index if op.type == "IdentityN" else 0] if op.type in ALIAS_OPS and op.inputs else None
            if source is not None and source.name in owner:
                owner[out.name] = owner[source.name]
            else:
                owner[out.name] = out.name
                size[out.name] = _tensor_bytes(out)
    return owner, size


def graph_activation_peak(graph: Any) -> Dict[str, int]:
    """Plays the graph and returns the peak bytes of live batch-dependent buffers.

    Args:
        graph: a ``tf.Graph`` / ``FuncGraph`` of one training step with static shapes.

    Returns:
        ``{"peak_bytes": ..., "saved_bytes": ...}``: the peak, and the bytes of forward buffers that the backward
        pass reads (what recomputation trades for compute).
    """
    ops = list(graph.get_operations())
    placeholders = [t for op in ops if op.type == "Placeholder" for t in op.outputs if t.dtype != "resource"]
    data = _data_dependent(ops, placeholders)
    owner, size = _buffers(ops, data)
    last_use: Dict[str, int] = {}
    for step, op in enumerate(ops):
        for t in op.inputs:
            if t.name in owner:
                last_use[owner[t.name]] = step
    grads = _weight_gradients(ops, size, last_use)
    live = peak = 0
    freed_at: Dict[int, List[str]] = {}
    for buffer, step in last_use.items():
        if buffer not in grads:
            freed_at.setdefault(step, []).append(buffer)
    for step, op in enumerate(ops):
        for out in op.outputs:
            if out.name in size and owner[out.name] == out.name and out.name in last_use and out.name not in grads:
                live += size[out.name]
        peak = max(peak, live)
        for buffer in freed_at.get(step, ()):
            live -= size[buffer]
    return {"peak_bytes": int(peak), "saved_bytes": int(saved_activation_bytes(ops, size, last_use))}


def _weight_gradients(ops: List[Any], size: Dict[str, int], last_use: Dict[str, int]) -> Set[str]:
    """Buffers made in the backward pass and still read after it ends: the gradients the optimizer applies
    (counted apart, as ``gradient_bytes``)."""
    backward = [i for i, op in enumerate(ops) if _is_backward(op) or op.type == "AddN"]
    if not backward:
        return set()
    made = {out.name for op in ops[backward[0]:backward[-1] + 1] for out in op.outputs}
    return {b for b, step in last_use.items() if b in made and step > backward[-1]}


def _is_backward(op: Any) -> bool:
    return op.name.startswith("gradient_tape/") or "/gradient_tape/" in op.name


def saved_activation_bytes(ops: List[Any], size: Dict[str, int], last_use: Dict[str, int]) -> int:
    """Bytes of the buffers made before the backward pass starts (the first ``gradient_tape/`` op) and read after."""
    start = next((i for i, op in enumerate(ops) if _is_backward(op)), len(ops))
    made_before = {out.name for op in ops[:start] for out in op.outputs}
    return sum(size[b] for b, step in last_use.items() if b in made_before and step >= start)
