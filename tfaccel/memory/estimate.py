"""``estimate_memory``: what one replica needs for a training step, before the job starts.

Two peaks are estimated, and they answer different questions:

* the **device (allocator) peak**, ``total_bytes``: parameters, gradients and optimizer slots counted from the real
  variables (the model is built, the optimizer built on its trainable variables), plus the activations from the
  traced graph of the model's own ``train_step`` at the per-replica batch (:mod:`tfaccel.memory.graph`), with and
  without recomputation. It is what a device allocator hands out (a GPU's ``get_memory_info`` peak, TensorFlow's
  CPU allocator peak). Nothing runs a step.
* the **process peak on the CPU**, ``process_peak_bytes`` (``process_peak=True``): what the whole process's
  resident memory reaches (VmHWM) when it trains the model on the CPU. Besides the tensors it holds the
  interpreter and the TensorFlow runtime (~650 MiB here), the model's Python objects, the traced and optimized
  graphs, the kernels and oneDNN's primitives and their JIT code, none of which an allocator sees. These do not
  depend on the batch, so they are *measured*: a fresh child process trains the same model, precision and
  optimizer with ONE example per step (``process_base_bytes``, its VmHWM). What grows with the batch is taken
  from the trace: ``process_peak_bytes = process_base_bytes + activation_bytes - activation_bytes_base``, where
  ``activation_bytes_base`` is the traced activation peak at batch 1. No constant is fitted to any measurement.
"""

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import keras
import tensorflow as tf

from tfaccel.compat.keras_copy import copy_model
from tfaccel.compat.keras_zero import sparse_gradient_variables
from tfaccel.errors import ConfigError
from tfaccel.memory.graph import graph_activation_peak
from tfaccel.memory.options import check_options
from tfaccel.memory.measure import measure_cpu_step
from tfaccel.memory.recompute import enable_recompute
from tfaccel.memory.shards import shard_loads
from tfaccel.memory.shapes import DEFAULT_SHAPES
from tfaccel.memory.specs import step_specs
from tfaccel.models import build_model

__all__ = ["MemoryEstimate", "estimate_memory", "REPLICATED_STRATEGIES", "DEFAULT_SHAPES", "PROCESS_STRATEGIES"]

# Strategies that keep a full copy of the variables and optimizer slots on every replica.
REPLICATED_STRATEGIES = ("auto", "default", "one_device", "mirrored", "multi_worker", "tpu", "horovod")
# Strategies whose processes hold one replica each on a CPU host: the process peak is estimated for these.
PROCESS_STRATEGIES = ("auto", "default", "one_device", "multi_worker", "horovod")


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one replica needs for one training step (and each parameter server shard, under parameter_server).

    ``activation_bytes`` is the traced peak of live batch-dependent buffers (activations, their gradients and the
    backward pass's temporaries); ``*_recompute`` are the same with the blocks in ``recompute_blocks`` recomputed.
    ``total_bytes`` = parameters + gradients + optimizer slots + activations, on one replica: the device
    (allocator) peak. ``process_peak_bytes`` = ``process_base_bytes`` (the measured peak of a fresh process that
    trains the model with one example per step) + ``activation_bytes`` - ``activation_bytes_base`` (the traced
    activation peak at that batch of 1): the process peak on the CPU, None unless asked for. ``accumulator_bytes``:
    tfaccel's gradient accumulation (``tfaccel.fit(gradient_accumulation_steps=N)``, N > 1): one sum per trainable
    variable and the micro-batch counter, on every replica, sharded state or not (counted in the totals).
    """

    model: str
    batch_size: int
    per_replica_batch: int
    replicas: int
    precision: str
    strategy: str
    optimizer: str
    parameters: int
    parameter_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    saved_activation_bytes: int
    recompute_blocks: Tuple[str, ...] = ()
    activation_bytes_recompute: Optional[int] = None
    ps_shard_bytes: Tuple[int, ...] = ()
    optimizer_shard_bytes: Tuple[int, ...] = ()
    accumulator_bytes: int = 0
    process_base_bytes: Optional[int] = None
    activation_bytes_base: Optional[int] = None
    measured: Optional[Dict[str, Any]] = None

    @property
    def total_bytes(self) -> int:
        return self.state_bytes + self.activation_bytes

    @property
    def process_peak_bytes(self) -> Optional[int]:
        """The CPU process's peak: its measured peak at batch 1 plus what the trace says the batch adds."""
        if self.process_base_bytes is None or self.activation_bytes_base is None:
            return None
        return self.process_base_bytes + self.activation_bytes - self.activation_bytes_base

    @property
    def total_bytes_recompute(self) -> Optional[int]:
        if self.activation_bytes_recompute is None:
            return None
        return self.state_bytes + self.activation_bytes_recompute

    @property
    def state_bytes(self) -> int:
        """Parameters + gradients + optimizer slots on one replica (a PS worker holds no slots, only a read copy;
        with the state sharded, the largest replica's share)."""
        slots = 0 if self.strategy == "parameter_server" else self.optimizer_bytes
        if self.optimizer_shard_bytes:
            slots = max(self.optimizer_shard_bytes)
        return self.parameter_bytes + self.gradient_bytes + slots + self.accumulator_bytes

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-ready dict: every field plus the totals."""
        out = dataclasses.asdict(self)
        out["recompute_blocks"] = list(self.recompute_blocks)
        out["ps_shard_bytes"] = list(self.ps_shard_bytes)
        out["optimizer_shard_bytes"] = list(self.optimizer_shard_bytes)
        out["total_bytes"] = self.total_bytes
        out["total_bytes_recompute"] = self.total_bytes_recompute
        out["device_peak_bytes"] = self.total_bytes
        out["process_peak_bytes"] = self.process_peak_bytes
        return out


def _nbytes(variables: Sequence[Any]) -> int:
    total = 0
    for v in variables:
        size = 1
        for dim in v.shape:
            size *= int(dim)
        total += size * _dtype_size(v.dtype)
    return total


def _dtype_size(dtype: Any) -> int:
    return tf.as_dtype(str(dtype)).size


def _slot_ratio(model: Any, optimizer: Any) -> Tuple[List[Any], float]:
    """(the optimizer's scalar variables, its slot bytes per byte of trainable weights)."""
    scalars = [v for v in optimizer.variables if len(v.shape) == 0]
    trainable = _nbytes(model.trainable_variables)
    return scalars, (_nbytes(optimizer.variables) - _nbytes(scalars)) / trainable if trainable else 0.0


def _ps_shards(model: Any, optimizer: Any, num_ps: int) -> Tuple[int, ...]:
    """TF's default placement: variables round-robin over the ps tasks, each slot beside its variable."""
    scalars, slot_ratio = _slot_ratio(model, optimizer)
    shards = [0] * num_ps
    for index, var in enumerate(model.variables):
        size = _nbytes([var])
        shards[index % num_ps] += size + (int(round(size * slot_ratio)) if var.trainable else 0)
    shards[0] += _nbytes(scalars)
    return tuple(shards)


def _optimizer_shards(model: Any, optimizer: Any, replicas: int) -> Tuple[int, ...]:
    """Optimizer-state sharding: each replica's slots (each variable's on its owner, as ``tfaccel.train.zero``
    places them) plus what stays on every replica: the scalars (iteration counter, rate) and the slots of the
    Embedding tables left unsharded."""
    scalars, slot_ratio = _slot_ratio(model, optimizer)
    sparse = sparse_gradient_variables(model)
    sizes = {v.path: int(round(_nbytes([v]) * slot_ratio)) for v in model.trainable_variables}
    everywhere = _nbytes(scalars) + sum(size for path, size in sizes.items() if path in sparse)
    loads = shard_loads([size for path, size in sizes.items() if path not in sparse], replicas)
    return tuple(load + everywhere for load in loads)


def _build(model_or_name: Any, precision: Optional[str], input_shape: Optional[Sequence[int]],
           num_classes: Optional[int]) -> Tuple[Any, str, str]:
    """Returns (a model tfaccel may change, its name, its precision)."""
    if isinstance(model_or_name, keras.Model):
        policy = model_or_name.dtype_policy.name
        if precision is not None and precision != policy:
            raise ConfigError(f"precision: the model was built with the {policy!r} policy; received "
                              f"precision={precision!r}. A built model's precision is fixed: pass the model's name "
                              "or builder function to estimate it in another precision")
        try:
            clone = copy_model(model_or_name)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"model: cannot copy model {model_or_name.name!r} to trace it ({exc}); pass its "
                              "builder function instead") from exc
        return clone, model_or_name.name, policy

    name = model_or_name if isinstance(model_or_name, str) else getattr(model_or_name, "__name__", "model")
    shape, classes = DEFAULT_SHAPES.get(name, (None, 10))
    shape = tuple(input_shape) if input_shape is not None else shape
    if shape is None:
        raise ConfigError(f"input_shape: model {name!r} has no default input shape; pass input_shape=(...) "
                          f"(built-in models with defaults: {', '.join(DEFAULT_SHAPES)})")
    previous = keras.config.dtype_policy().name
    keras.config.set_dtype_policy(precision or "float32")
    try:
        model = build_model(model_or_name, input_shape=shape, num_classes=num_classes or classes)
    except ConfigError:
        raise
    except (ValueError, TypeError) as exc:  # the user's builder refused these arguments
        raise ConfigError(f"model: building {name!r} with input_shape={shape}, num_classes={num_classes or classes} "
                          f"failed: {type(exc).__name__}: {exc}; pass the input_shape and num_classes it takes "
                          "(tfaccel memory: --input-shape, --num-classes)") from exc
    finally:
        keras.config.set_dtype_policy(previous)
    return model, name, precision or "float32"


def _trace_step(model: Any, optimizer: Union[str, Any], batch: int,
                input_shape: Optional[Sequence[int]]) -> Tuple[Dict[str, int], Any]:
    """Compiles ``model`` (sparse categorical cross-entropy), builds the optimizer and traces one train_step."""
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    model.optimizer.build(model.trainable_variables)
    return _trace_peaks(model, batch, input_shape), model.optimizer


def _trace_peaks(model: Any, batch: int, input_shape: Optional[Sequence[int]]) -> Dict[str, int]:
    """Traces the compiled model's train_step at ``batch`` (inputs in the model's own structure: one tensor, a
    list, a dict, nested) and plays the graph (nothing runs)."""
    x_spec, y_spec = step_specs(model, batch, input_shape)
    return graph_activation_peak(tf.function(model.train_step).get_concrete_function((x_spec, y_spec)).graph)


def _process_base(model_or_name: Any, model: Any, *, strategy: str, replicas: int, precision: str, optimizer: str,
                  input_shape: Optional[Sequence[int]], num_classes: Optional[int]) -> Tuple[int, int]:
    """(the measured VmHWM of a fresh process training the model at batch 1, the traced activations at batch 1)."""
    if not isinstance(model_or_name, str):
        raise ConfigError(f"process_peak: the process peak is measured in a fresh process, which must build the "
                          f"model itself; received a {type(model_or_name).__name__}. Pass a built-in name or "
                          "'path/to/file.py:build_model' (or process_peak=False)")
    if strategy not in PROCESS_STRATEGIES or (replicas > 1 and strategy not in ("multi_worker", "horovod")):
        raise ConfigError(f"process_peak: estimated for one replica per process ({', '.join(PROCESS_STRATEGIES)}; "
                          f"replicas > 1 only under multi_worker or horovod); received strategy={strategy!r}, "
                          f"replicas={replicas}. Pass process_peak=False")
    shape, classes = DEFAULT_SHAPES.get(model_or_name, (None, 10))
    measured = measure_cpu_step(model_or_name, batch_size=1, precision=precision, optimizer=optimizer, steps=1,
                                mmap_threshold=None,
                                input_shape=tuple(input_shape or shape or ()) or None,
                                num_classes=num_classes or classes)
    return int(measured["process_hwm"]), _trace_peaks(model, 1, input_shape)["peak_bytes"]


def _recompute_peak(model_or_name: Any, recompute: Any, *, precision: Optional[str], input_shape: Any,
                    num_classes: Optional[int], optimizer: Any, batch: int) -> Tuple[Tuple[str, ...], Optional[int]]:
    if recompute is False:
        return (), None
    model, _, _ = _build(model_or_name, precision, input_shape, num_classes)
    try:
        blocks = enable_recompute(model, "auto" if recompute in (None, True) else recompute)
    except ConfigError:
        if recompute is None:  # only asked for "if it can": this model cannot be split automatically
            return (), None
        raise
    return tuple(blocks), _trace_step(model, _fresh_optimizer(optimizer), batch, input_shape)[0]["peak_bytes"]


def _fresh_optimizer(optimizer: Union[str, Any]) -> Union[str, Any]:
    return optimizer if isinstance(optimizer, str) else type(optimizer).from_config(optimizer.get_config())


def estimate_memory(model_or_name: Union[str, Callable[..., Any], Any], *, batch_size: int,
                    precision: Optional[str] = None, strategy: str = "default", optimizer: Union[str, Any] = "adam",
                    recompute: Union[None, bool, str, Sequence[Any]] = None, replicas: int = 1, num_ps: int = 1,
                    input_shape: Optional[Sequence[int]] = None, num_classes: Optional[int] = None,
                    process_peak: bool = False, shard_optimizer_state: bool = False,
                    gradient_accumulation_steps: int = 1) -> MemoryEstimate:
    """Estimates the memory one replica needs to train a model, by tracing one training step.

    Args:
        model_or_name: a built-in model name (``tfaccel.MODEL_NAMES``), a builder ``f(input_shape=, num_classes=)``
            or ``"path/to/file.py:build_model"``, or a built functional ``keras.Model`` (copied, never changed).
        batch_size: the global batch; each replica traces ``batch_size // replicas``.
        precision: ``"float32"``, ``"mixed_float16"`` or ``"mixed_bfloat16"``. Defaults to None: float32 for a
            name or builder, the model's own policy for a model.
        strategy: a strategy name (``tfaccel.strategies.STRATEGY_NAMES``). Under ``"parameter_server"`` a replica
            is a worker (no slots) and ``ps_shard_bytes`` gives each ps task's share. Defaults to ``"default"``.
        optimizer: an optimizer name or a Keras optimizer (its config is reused). Defaults to ``"adam"``.
        recompute: ``"auto"``, ``"all"`` or blocks as for :func:`tfaccel.memory.enable_recompute` to also estimate with
            recomputation (an error if the model cannot be split), False for no such estimate. Defaults to None:
            ``"auto"`` when the model can be split, else nothing.
        replicas: replicas in sync (workers under parameter_server). Defaults to 1.
        num_ps: parameter server tasks (parameter_server only). Defaults to 1.
        input_shape: one example's shape (a builder's, and any axis a model leaves open); defaults to DEFAULT_SHAPES.
        num_classes: number of classes; defaults to the built-in model's usual head.
        process_peak: also estimate the CPU process's peak (``process_peak_bytes``): runs the model for one step
            at batch 1 in a fresh child process (seconds to a minute) and adds what the trace says the batch
            adds. Needs a name or a file spec and one replica per process. Defaults to False.
        shard_optimizer_state: the optimizer state sharded as by ``tfaccel.fit`` (``optimizer_shard_bytes``: each
            replica's share; the totals count the largest). Defaults to False.
        gradient_accumulation_steps: ``tfaccel.fit``'s; above 1 its sums count (``accumulator_bytes``). Defaults to 1.

    The step traced is the model's own ``train_step`` (inputs in the model's structure, dicts too) with sparse
    categorical cross-entropy on integer labels (another loss changes the activations by a few output-sized tensors).

    Returns:
        A :class:`MemoryEstimate`.

    Raises:
        ConfigError: an option is not valid (the message names it and lists the valid values), or the model
            cannot be built, copied or split as asked.

    Example:
        >>> est = estimate_memory("resnet50", batch_size=64, precision="mixed_float16")  # doctest: +SKIP
        >>> est.total_bytes / 2**30                                                       # doctest: +SKIP
    """
    check_options(strategy, batch_size, replicas, num_ps, precision, optimizer, shard_optimizer_state,
                  gradient_accumulation_steps)
    batch = batch_size // replicas
    model, name, policy = _build(model_or_name, precision, input_shape, num_classes)
    peaks, opt = _trace_step(model, _fresh_optimizer(optimizer), batch, input_shape)
    opt_name = optimizer if isinstance(optimizer, str) else type(optimizer).__name__.lower()
    extra = _other_peaks(model_or_name, model, process_peak=process_peak, recompute=recompute, batch=batch,
                         strategy=strategy, replicas=replicas, policy=policy, precision=precision, optimizer=optimizer,
                         opt_name=opt_name, input_shape=input_shape, num_classes=num_classes)
    return MemoryEstimate(
        model=name, batch_size=batch_size, per_replica_batch=batch, replicas=replicas, precision=policy,
        strategy=strategy, optimizer=opt_name, activation_bytes=peaks["peak_bytes"],
        saved_activation_bytes=peaks["saved_bytes"], **extra,
        **_state_bytes(model, opt, strategy, num_ps, replicas=replicas, shard=shard_optimizer_state,
                       accumulation=gradient_accumulation_steps))


def _other_peaks(model_or_name: Any, model: Any, *, process_peak: bool, recompute: Any, batch: int, strategy: str,
                 replicas: int, policy: str, precision: Optional[str], optimizer: Union[str, Any], opt_name: str,
                 input_shape: Optional[Sequence[int]], num_classes: Optional[int]) -> Dict[str, Any]:
    """The MemoryEstimate fields of the process peak (measured at batch 1, when asked for) and of recomputation."""
    base = _process_base(model_or_name, model, strategy=strategy, replicas=replicas, precision=policy,
                         optimizer=opt_name, input_shape=input_shape, num_classes=num_classes) if process_peak else None
    blocks, recompute_peak = _recompute_peak(model_or_name, recompute, precision=precision, input_shape=input_shape,
                                             num_classes=num_classes, optimizer=optimizer, batch=batch)
    return {"process_base_bytes": base[0] if base else None, "activation_bytes_base": base[1] if base else None,
            "recompute_blocks": blocks, "activation_bytes_recompute": recompute_peak}


def _state_bytes(model: Any, optimizer: Any, strategy: str, num_ps: int, *, replicas: int, shard: bool,
                 accumulation: int) -> Dict[str, Any]:
    """The MemoryEstimate fields counted from the built variables: parameters, gradients, slots, ps shares, each
    replica's share of sharded slots, and tfaccel's gradient accumulation on one replica (a sum shaped and typed like
    each trainable variable and the int64 micro-batch counter: tfaccel.compat.keras_optimizer,
    tfaccel.compat.keras_zero_accumulate; 0 without accumulation)."""
    return {
        "parameters": int(sum(int(v.numpy().size) for v in model.variables)),
        "parameter_bytes": _nbytes(model.variables), "gradient_bytes": _nbytes(model.trainable_variables),
        "optimizer_bytes": _nbytes(optimizer.variables),
        "ps_shard_bytes": _ps_shards(model, optimizer, num_ps) if strategy == "parameter_server" else (),
        "optimizer_shard_bytes": _optimizer_shards(model, optimizer, replicas) if shard else (),
        "accumulator_bytes": _nbytes(model.trainable_variables) + 8 if accumulation > 1 else 0,
    }
