"""Optimizer-state sharding (ZeRO-1), ``tfaccel.fit(..., shard_optimizer_state=True)``.

Each replica of one host's MirroredStrategy (or of MultiWorkerMirroredStrategy, one device per worker) owns a
subset of the trainable variables (greedy balance by bytes, deterministic): their optimizer slots exist on the owner's device only, their gradients are reduced to the owner,
the owner runs the user's own optimizer update (same object, class, hyper-parameters, schedule and iteration
counter) and the new value is copied to every replica (across workers: the gradients are reduce-scattered to their
owners and the updated values all-gathered, the bytes of one all-reduce). The mechanism is in
``tfaccel.compat.keras_zero`` and ``tfaccel.compat.keras_zero_collective``.

Under the ``horovod`` backend the ranks are the replicas and the backend shards itself (its ``shard_optimizer``:
``tfaccel.strategies.horovod.zero``), after the checks here on the model.

What would not train exactly as ``model.fit`` is refused before training, with the reason: other strategies (one
device, multi_worker with several devices per worker, parameter_server, TPU), any dtype policy but float32,
mixed_bfloat16 and mixed_float16 (whose variables, gradients and slots are float32; under mixed_float16 the
``LossScaleOptimizer``'s inner optimizer is sharded), Keras' own ``gradient_accumulation_steps``, tfaccel's
accumulation with a ``LossScaleOptimizer``, with Keras' ``BackupAndRestore``, or with a ``backup_dir`` whose
backups would be due inside an update (an epoch or ``backup_freq`` not a multiple of the micro-batches), a model's own
``train_step``, an optimizer built unsharded. An optimizer's moving average of the weights (``use_ema``) is sharded
with its slots, and Keras' ``SwapEMAWeights`` callback swaps on the owners for the job
(``tfaccel.compat.keras_zero_ema``); tfaccel's gradient
accumulation sums each replica's micro-batches locally and runs the sharded update once per update
(``tfaccel.compat.keras_zero_accumulate``). Under
mirrored, multi_worker and Horovod the tables of Embedding layers (sparse ``IndexedSlices``
gradients) stay unsharded: their gradients averaged as ``model.fit`` averages them (the replicas' slices
concatenated) and applied on every replica, with replicated slots (exact by construction); the plan names them.
``global_clipnorm`` clips every gradient by the global norm over the sharded and unsharded ones. Variables are
owned whole; the plan says when that leaves one replica above ``UNEVEN`` times the mean share.

Backups (``backup_dir``) hold the whole sharded state: under multi_worker and Horovod each process writes its own
shard and a resumed job, on any number of processes, re-partitions it (``tfaccel.resilience.shard_backup``);
``model.save`` writes the whole state under the user's optimizer class (``tfaccel.compat.keras_zero``).

``"auto"`` shards when ``tfaccel memory``'s estimate of one replica (parameters, gradients, optimizer slots,
activations) exceeds the memory of its device (the smallest GPU's); it stays off where the devices report no size
(CPU replicas) and outside a mirrored or multi_worker strategy of several replicas.
"""

from typing import Any, Optional, Sequence, Tuple

import keras
import tensorflow as tf

from tfaccel.compat import keras_loss_scale
from tfaccel.compat.keras_zero import is_sharded, leave_unsharded, sharded_class, sparse_gradient_variables
from tfaccel.compat.keras_zero_ema import SWAP_CALLBACK
from tfaccel.compat.keras_zero_loss_scale import save_through_inner
from tfaccel.compat.keras_zero_ranks import over_ranks
from tfaccel.errors import ConfigError
from tfaccel.memory.estimate import estimate_memory
from tfaccel.memory.shards import largest_share, partition_by_bytes
from tfaccel.precision import unwrap_loss_scale

__all__ = ["shard_optimizer_state", "give_back_callbacks", "xla_fallback", "UNEVEN", "SHARDED_POLICIES"]

_FIX = "train with shard_optimizer_state=False (the default)"
UNEVEN = 1.25  # the plan says how uneven the shards are above this largest share / mean share
# Dtype policies whose variables, gradients and slots are float32: the sharded update is the same as under float32
# (mixed_float16's loss scaling wraps it: the inner optimizer is sharded).
SHARDED_POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")


def _refuse(reason: str, fix: str = _FIX) -> ConfigError:
    return ConfigError(f"shard_optimizer_state=True: {reason}; {fix}")


def _check_strategy(strategy: Any) -> None:
    replicas = strategy.num_replicas_in_sync
    if not isinstance(strategy, (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy)):
        raise _refuse(f"tfaccel shards optimizer state under mirrored and multi_worker only for now; this job runs "
                      f"under {type(strategy).__name__} with {replicas} replica(s) in sync",
                      f"use strategy='mirrored' on a host with several devices, or {_FIX}")
    local = len(strategy.extended.worker_devices)
    if local > 1 and replicas > local:
        raise _refuse(f"multi_worker with {local} devices per worker is not sharded yet (one device per worker is)",
                      f"run one worker per device, or {_FIX}")
    if replicas < 2:
        raise _refuse("there is one replica, so nothing to shard",
                      f"use strategy='mirrored' over several devices, or {_FIX}")


def _check_loss_scaling(model: Any) -> None:
    """mixed_float16's ``LossScaleOptimizer`` is sharded (its inner optimizer) where tfaccel.compat.keras_loss_scale
    decides each step's finiteness over every replica before the exchange: over tf.distribute's replicas (mirrored,
    multi_worker) or Horovod's ranks. Keras alone asks each process's first replica, before the all-reduce, so
    processes could take different branches around the exchange's collectives: refused with that fix off."""
    if not isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer):
        return
    fix_off = keras_loss_scale.why_not_needed()
    if fix_off:
        raise _refuse(f"the optimizer is a LossScaleOptimizer (mixed_float16): its loss scaling is not sharded with "
                      f"tfaccel.compat.{keras_loss_scale.NAME} off ({fix_off}): each process would check its own "
                      "gradients for inf/NaN before the all-reduce, and processes could take different branches "
                      "around the exchange",
                      f"use precision='mixed_bfloat16' (no loss scaling) or 'float32', or {_FIX}")


def _check_accumulation_saves(accumulation_steps: int, backup_dir: Optional[str], callbacks: Sequence[Any], *,
                              steps_per_epoch: Optional[int], backup_freq: Optional[int]) -> None:
    """Sharded accumulation's sums of the micro-batches so far are not optimizer state (tfaccel.compat.
    keras_zero_accumulate): backups are written at the end of an update only, so every place one is due (each
    epoch's end, every ``backup_freq`` steps) must be one; Keras' ``BackupAndRestore`` saves where it likes."""
    if accumulation_steps <= 1:
        return
    restores = [type(c).__name__ for c in callbacks if isinstance(c, keras.callbacks.BackupAndRestore)]
    if restores:
        raise _refuse(f"callback {restores[0]} with gradient accumulation ({accumulation_steps} micro-batches): it "
                      "saves between two updates too, and the sums of the micro-batches before a save are not in it",
                      "drop it and pass backup_dir= to tfaccel.fit (its backups are written at the end of an "
                      f"update), or train with gradient_accumulation_steps=1, or {_FIX}")
    if not backup_dir:
        return
    due = []  # the places a backup is due that end inside an update
    if steps_per_epoch is None or steps_per_epoch % accumulation_steps:
        due.append(f"an epoch of {'an unknown number of' if steps_per_epoch is None else steps_per_epoch} steps")
    if backup_freq and backup_freq % accumulation_steps:
        due.append(f"backup_freq={backup_freq}")
    if due:
        raise _refuse(f"backup_dir={backup_dir!r} with gradient accumulation ({accumulation_steps} micro-batches): "
                      "a backup is written only at the end of an update (the sums of the micro-batches before it "
                      f"are not saved), and {' and '.join(due)} would end inside one",
                      f"choose a number of steps per epoch and a backup_freq that are multiples of "
                      f"{accumulation_steps}, or train without backup_dir, or {_FIX}")


def _check_model(model: Any, optimizer: Any, accumulation_steps: int) -> None:
    if model.dtype_policy.name not in SHARDED_POLICIES:
        raise _refuse(f"the model trains under the {model.dtype_policy.name!r} dtype policy; sharding is tested for "
                      f"{', '.join(SHARDED_POLICIES)} only", f"use precision='float32', or {_FIX}")
    if optimizer.gradient_accumulation_steps:
        raise _refuse(f"optimizer {type(optimizer).__name__}(gradient_accumulation_steps="
                      f"{optimizer.gradient_accumulation_steps}): Keras' own accumulation is not sharded",
                      "compile the optimizer without it and pass gradient_accumulation_steps= to tfaccel.fit, which "
                      f"accumulates with sharded state, or {_FIX}")
    if accumulation_steps > 1 and isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer):
        raise _refuse(f"gradient accumulation ({accumulation_steps} micro-batches) with a LossScaleOptimizer "
                      "(mixed_float16) is not sharded", f"use precision='mixed_bfloat16' or 'float32', or {_FIX}")
    if type(model).train_step is not keras.Model.train_step:
        raise _refuse(f"{type(model).__name__} has its own train_step; tfaccel shards Keras' own train_step only")
    if optimizer.built and not is_sharded(optimizer):
        raise _refuse(f"optimizer {type(optimizer).__name__} is already built with a full copy of its slots on every "
                      "replica", "compile a fresh optimizer (tfaccel.fit builds it), or " + _FIX)


def _auto(model: Any, *, batch_size: Optional[int], device_memory_bytes: Optional[int],
          ranks: Optional[int] = None, input_shape: Optional[Sequence[int]] = None,
          accumulation_steps: int = 1) -> Tuple[bool, str]:
    """``"auto"``: on when ``tfaccel memory``'s estimate of one replica exceeds its device's memory. ``ranks``: the
    processes of a backend that shards itself (Horovod), each one replica holding what a multi_worker worker holds.
    ``input_shape``: one example's shape in the job's data (fills the model's open axes, e.g. a sequence length).
    ``accumulation_steps``: the job's gradient accumulation (its sums of the micro-batches counted)."""
    strategy = model.distribute_strategy
    replicas = ranks or strategy.num_replicas_in_sync
    multi_worker = bool(ranks) or isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
    if not (multi_worker or isinstance(strategy, tf.distribute.MirroredStrategy)) or replicas < 2:
        return False, (f"auto: off, sharding needs a mirrored or multi_worker strategy over several replicas (this "
                       f"job: {type(strategy).__name__}, {replicas} replica(s))")
    if device_memory_bytes is None:
        return False, "auto: off, the replicas' devices report no memory size (CPU replicas share the host's memory)"
    try:
        est = estimate_memory(model, batch_size=(batch_size or replicas), optimizer=model.optimizer,
                              strategy="multi_worker" if multi_worker else "mirrored",
                              recompute=False, replicas=replicas, input_shape=input_shape,
                              gradient_accumulation_steps=accumulation_steps)
    except ConfigError as error:  # e.g. an open axis the data did not fill: a prediction, not a reason to stop
        return False, (f"auto: off, tfaccel memory could not estimate one replica of this model ({error}); pass "
                       "shard_optimizer_state=True to shard it anyway")
    need, have = f"{est.total_bytes:,} bytes", f"{device_memory_bytes:,} bytes"
    if est.total_bytes <= device_memory_bytes:
        return False, f"auto: off, one replica needs {need} by tfaccel memory's estimate, within its device's {have}"
    return True, f"auto: on, one replica needs {need} by tfaccel memory's estimate, more than its device's {have}"


def shard_optimizer_state(model: Any, setting: Any, *, accumulation_steps: int, batch_size: Optional[int] = None,
                          device_memory_bytes: Optional[int] = None,
                          checkpoint_dir: Optional[str] = None, backend: Any = None,
                          input_shape: Optional[Sequence[int]] = None, callbacks: Sequence[Any] = (),
                          backup_dir: Optional[str] = None, backup_freq: Optional[int] = None,
                          steps_per_epoch: Optional[int] = None) -> Optional[str]:
    """Swaps the class of the model's optimizer for its sharded subclass (in place) when ``setting`` is True, or
    ``"auto"`` and the replica does not fit its device.

    The optimizer keeps that class after training: its slots live on their owners.

    Args:
        model: the compiled model.
        setting: ``shard_optimizer_state`` (False, True or ``"auto"``).
        accumulation_steps: tfaccel's gradient accumulation (micro-batches per update).
        batch_size: the global batch, for ``"auto"``'s memory estimate.
        device_memory_bytes: the memory of one replica's device (the smallest GPU's), None where unknown (CPU):
            ``"auto"`` then stays off.
        checkpoint_dir: the job's ``checkpoint_dir`` (refused under multi_worker: its ``tf.train.Checkpoint`` files
            would hold only the slots the writing worker owns).
        backend: the job's backend; one with its own ``shard_optimizer`` (Horovod) shards the optimizer itself.
        input_shape: one example's shape in the job's data, for ``"auto"``'s memory estimate (it fills the model's
            open axes, e.g. a KerasHub model's sequence length); None where unknown.
        callbacks: the job's callbacks (Keras' ``SwapEMAWeights`` swaps on the owners until
            :func:`give_back_callbacks`; ``BackupAndRestore`` is refused with accumulation).
        backup_dir, backup_freq, steps_per_epoch: the job's backups and epoch (with accumulation, refused where a
            backup would be due inside an update).

    Returns:
        What was decided and why (for the plan), or None for ``setting=False``.

    Raises:
        ConfigError: a job that sharding cannot train exactly (the reason and the fix).
    """
    if setting is False:
        return None
    why = "asked for (shard_optimizer_state=True)"
    own = getattr(backend, "shard_optimizer", None)  # Horovod: the backend shards over its ranks itself
    if setting == "auto":
        on, why = _auto(model, batch_size=batch_size, device_memory_bytes=device_memory_bytes,
                        ranks=backend.num_replicas_in_sync if own else None, input_shape=input_shape,
                        accumulation_steps=accumulation_steps)
        if not on:
            return f"optimizer state not sharded: {why}"
    strategy, optimizer = model.distribute_strategy, unwrap_loss_scale(getattr(model, "optimizer", None))
    _check_job(model, optimizer, own is not None, accumulation_steps, callbacks)
    _check_accumulation_saves(accumulation_steps, backup_dir, callbacks, steps_per_epoch=steps_per_epoch,
                              backup_freq=backup_freq)
    # mixed_float16: the LossScaleOptimizer saves its inner part as sharded; swapped first, so that the classes the
    # backend and adapt_optimizer swap on for the fit (and give back after it) sit on top of it
    save_through_inner(model.optimizer)
    if own is not None:
        done = own(model, checkpoint_dir=checkpoint_dir)
    else:
        done = _shard_over_replicas(strategy, optimizer, checkpoint_dir)
    sparse = sparse_gradient_variables(model)
    leave_unsharded(optimizer, [v for v in model.trainable_variables if v.path in sparse])
    optimizer.tfaccel_accumulation_steps = int(accumulation_steps)
    replicas = backend.num_replicas_in_sync if own is not None else strategy.num_replicas_in_sync
    return f"{done}{_details(model, sparse, accumulation_steps, replicas)}{_swap_callbacks(callbacks)}; {why}"


def _swap_callbacks(callbacks: Sequence[Any]) -> str:
    """Keras' ``SwapEMAWeights`` callbacks made to swap on the owners for the job (given back by
    :func:`give_back_callbacks`); the plan's words ("" without one)."""
    swaps = [c for c in callbacks if isinstance(c, keras.callbacks.SwapEMAWeights)]
    for callback in swaps:
        SWAP_CALLBACK.apply(callback)
    return ("; Keras' SwapEMAWeights swaps the weights with their moving averages on the variables' owners, who "
            "share the result" if swaps else "")


def give_back_callbacks(callbacks: Sequence[Any]) -> None:
    """The job's callbacks given their own classes back after training (see :func:`shard_optimizer_state`)."""
    for callback in callbacks:
        SWAP_CALLBACK.remove(callback)


def _check_job(model: Any, optimizer: Any, own_sharding: bool, accumulation_steps: int,
               callbacks: Sequence[Any]) -> None:
    """The refusals before sharding but the backups' (``own_sharding``: the backend shards over its processes
    itself)."""
    if not own_sharding:
        _check_strategy(model.distribute_strategy)
    _check_loss_scaling(model)
    _check_model(model, optimizer, accumulation_steps)


def _details(model: Any, sparse: Any, accumulation_steps: int, replicas: int) -> str:
    """The plan's words after what was sharded: the tables left unsharded, the accumulation, an uneven share."""
    unsharded = (f"; left unsharded (Embedding tables, whose gradients are sparse: averaged as model.fit averages "
                 f"them and applied on every replica, replicated slots): {', '.join(sorted(sparse))}" if sparse else "")
    accumulated = (f"; gradients accumulated over {accumulation_steps} micro-batches on each replica and exchanged "
                   "once per update" if accumulation_steps > 1 else "")
    return f"{unsharded}{accumulated}{_uneven(model, sparse, replicas)}"


def _uneven(model: Any, sparse: Any, replicas: int) -> str:
    """The plan's words when the whole-variable partition leaves one replica well above the mean share ("" if not)."""
    sized = [(v.path, int(tf.TensorShape(v.shape).num_elements() or 0) * tf.as_dtype(v.dtype).size)
             for v in model.trainable_variables if v.path not in sparse]
    total = sum(n for _, n in sized)
    share = largest_share([n for _, n in sized], replicas)
    if share <= UNEVEN:
        return ""
    path, largest = max(sized, key=lambda item: item[1])
    return (f"; uneven: one replica holds {share:.2f}x the mean share of the sharded state (whole variables are "
            f"partitioned, and {path} alone is {largest / total:.0%} of it)")


def _shard_over_replicas(strategy: Any, optimizer: Any, checkpoint_dir: Optional[str]) -> str:
    """Swaps the optimizer's class for its subclass sharded over the strategy's replicas; what was done."""
    if checkpoint_dir and isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        raise _refuse(f"checkpoint_dir={checkpoint_dir!r}: under multi_worker each worker holds only its shard of the "
                      "optimizer state, and a checkpoint_dir file would hold only the writing worker's",
                      "keep backup_dir (its backups save every worker's shard) or a ModelCheckpoint / model.save "
                      f"(.keras, called on every worker), or {_FIX}")
    if not is_sharded(optimizer):
        optimizer.__class__ = sharded_class(type(optimizer), partition_by_bytes)
    return (f"optimizer {type(optimizer).__name__}: state sharded over {strategy.num_replicas_in_sync} replicas "
            "(ZeRO-1: each variable's slots on one owner, gradients reduced to it, its update copied to every replica)")


def xla_fallback(model: Any, jit: bool) -> Optional[str]:
    """Why XLA cannot compile this job's step with its optimizer state sharded across processes (None where it
    can, or where XLA is off): the exchange between workers uses collectives XLA has no kernels for.

    Under multi_worker the gradients travel through ``CollectiveAllToAllV2`` and ``CollectiveGatherV2`` (measured on
    TensorFlow 2.21: "No registered 'CollectiveAllToAllV2' OpKernel for XLA_CPU_JIT devices"); under Horovod
    through Horovod's own ops, which XLA compiles only in a Horovod built with HOROVOD_ENABLE_XLA_OPS.
    """
    if not jit or not is_sharded(unwrap_loss_scale(getattr(model, "optimizer", None))):
        return None
    strategy = model.distribute_strategy
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return ("the sharded optimizer state's exchange between workers (all-to-all, all-gather) has no XLA kernels "
                "in TensorFlow 2.21")
    if over_ranks(unwrap_loss_scale(model.optimizer)):
        return "the sharded optimizer state's exchange between Horovod ranks runs Horovod ops, which XLA cannot compile"
    return None
