"""The Keras 3 optimizer subclass behind ``tfaccel.train.zero``: optimizer-state sharding (ZeRO-1) under one host's
MirroredStrategy.

Keras 3.15's TF optimizer all-reduces every gradient, then every replica runs the whole update on its own full
copy of the slots (``TFOptimizer._backend_update_step``). The subclass made here instead, for each trainable
variable (seen on Keras 3.15.1 / TensorFlow 2.21.0):

* creates its slots (Adam's moments, SGD's momentum, ...) on one replica's device only, the variable's *owner*
  (a single-device variable made by the strategy's own creator, through ``colocate_with=SingleDevice``);
* reduces the variable's gradient to the owner alone (``strategy.extended.reduce_to``), clips the reduced
  gradients with the optimizer's own ``_clip_gradients`` (``global_clipnorm``: Keras' global norm over every reduced
  gradient, those of the variables left unsharded included);
* runs the optimizer's own ``update_step`` on the owner's copy of the variable, with the learning rate and
  iteration counter every replica computed;
* copies the updated value to every other replica's copy.

Under multi_worker (one device per worker) the gradients are reduce-scattered to their owners and the updated values
all-gathered instead, the bytes of one all-reduce (``tfaccel.compat.keras_zero_collective``).

Saving (``save_own_variables`` / ``load_own_variables``, what ``save_weights`` and ``model.save`` call): under one
host's MirroredStrategy every slot is readable in the process, so the optimizer saves as its base class does. Under
multi_worker a worker holds only its own slots (the others are empty stand-ins): ``model.save`` then gathers each
slot from its owner (a collective: every worker calls ``model.save``, TF's rule for multi_worker), so the file holds
the whole state under the user's optimizer class; loading assigns each held slot and leaves the stand-ins. Within
:func:`slots_apart` (tfaccel's backups, whose shard files carry the slots) every sharded slot is written as an empty
array and left alone on load.

It reads the private ``_distribution_strategy``, ``_var_key``, ``_clip_gradients`` and the collective strategy's
``_id_in_cluster`` (which replicas are this worker's), overrides ``_backend_update_step``,
``add_variable_from_reference`` (past Keras' ``TFOptimizer``'s), ``save_own_variables`` and ``load_own_variables``,
and uses TensorFlow's internal ``numpy_dataset.SingleDevice`` and ``maybe_merge_call``. tests/training/test_zero.py
fails when one of them moves.
"""

import contextlib
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import keras
import numpy as np
import tensorflow as tf
from keras.src.backend.tensorflow.optimizer import TFOptimizer
from tensorflow.python.distribute import numpy_dataset

from tfaccel.compat import keras_internals, keras_zero_collective
from tfaccel.compat.keras_optimizer import backing_variables
from tfaccel.compat.keras_zero_accumulate import ShardedAccumulation
from tfaccel.compat.keras_zero_ema import ShardedMovingAverage

__all__ = ["ShardOptimizerState", "sharded_class", "is_sharded", "sparse_gradient_variables", "leave_unsharded",
           "slot_bytes_per_device", "shard_layout", "held_slots", "load_held_slots", "slots_apart"]

_SHARDED: Dict[Tuple[type, type], type] = {}


def _num_bytes(variable: Any) -> int:
    return int(tf.TensorShape(variable.shape).num_elements() or 0) * tf.as_dtype(variable.dtype).size


class ShardOptimizerState(ShardedMovingAverage, ShardedAccumulation):
    """Mixed in before the user's optimizer class (see the module doc; ``use_ema``'s averages:
    :mod:`tfaccel.compat.keras_zero_ema`; gradient accumulation: :mod:`tfaccel.compat.keras_zero_accumulate`).
    ``tfaccel_partition`` is set per class: ``(sizes in bytes, replicas) -> owner index of each``."""

    tfaccel_partition: Callable[[Sequence[int], int], List[int]]

    def _tfaccel_placement(self) -> Tuple[List[str], int, int]:
        """(this process's replicas' devices, replicas over all processes, index of this process's first replica)."""
        strategy = self._distribution_strategy
        devices = list(strategy.extended.worker_devices)  # this worker's replicas
        replicas = strategy.num_replicas_in_sync
        return devices, replicas, (strategy.extended._id_in_cluster * len(devices) if replicas > len(devices) else 0)

    def _tfaccel_slot_scope(self, device: str) -> Any:
        """The scope that creates a slot on ``device`` alone (past TFOptimizer's colocation with the mirrored
        variable, which puts it on every device)."""
        where = numpy_dataset.SingleDevice(device)

        def on_owner(next_creator: Any, **kwargs: Any) -> Any:
            kwargs["colocate_with"] = where  # MirroredStrategy creates a plain variable on that one device
            return next_creator(**kwargs)

        return tf.variable_creator_scope(on_owner)

    def _tfaccel_sum(self, value: np.ndarray) -> np.ndarray:
        """``value`` summed over the processes (every process calls it, in the same order)."""
        return _sum_over_workers(self._distribution_strategy, value)

    def build(self, variables: Any) -> None:
        devices, replicas, first = self._tfaccel_placement()  # first: the index of this process's replica 0
        plain = getattr(self, "_tfaccel_unsharded", set())
        variables = list(variables)
        sharded = [v for v in variables if self._var_key(v) not in plain]  # the others keep Keras' own update
        owners = type(self).tfaccel_partition([_num_bytes(v) for v in sharded], replicas)
        self._tfaccel_devices = devices
        self._tfaccel_workers = replicas // len(devices)
        self._tfaccel_layout = {"count": replicas, "processes": self._tfaccel_workers, "owners": list(owners),
                                "index": first // len(devices)}
        self._tfaccel_slots: Dict[int, Tuple[Tuple[int, ...], bool]] = {}  # id(slot) -> (its full shape, held here)
        self._tfaccel_apart = False
        # owner -> index among this worker's devices, or None where another worker owns the variable
        self._tfaccel_owner = {self._var_key(v): (o - first if first <= o < first + len(devices) else None)
                               for v, o in zip(sharded, owners)}
        super().build(variables)  # type: ignore[misc]
        self._tfaccel_build_accumulation(variables)  # after Keras' variables: their indices stay Keras'

    def _tfaccel_replicated(self, reference_variable: Any, name: str) -> Any:
        """A variable shaped like ``reference_variable`` on every replica (as Keras makes a slot), never sharded."""
        return super().add_variable_from_reference(reference_variable, name=name)  # type: ignore[misc]

    def add_variable_from_reference(self, reference_variable: Any, name: Any = None,
                                    initializer: Any = "zeros") -> Any:
        key = self._var_key(reference_variable)
        if key not in getattr(self, "_tfaccel_owner", {}):  # not a trainable variable's slot
            return super().add_variable_from_reference(reference_variable, name=name,  # type: ignore[misc]
                                                       initializer=initializer)
        owner = self._tfaccel_owner[key]
        with self._tfaccel_slot_scope(self._tfaccel_devices[0 if owner is None else owner]):
            if owner is None:  # another worker owns it: an empty stand-in, never read
                slot = self.add_variable((0,), initializer="zeros", dtype=reference_variable.dtype, name=name)
            else:
                slot = super(TFOptimizer, self).add_variable_from_reference(reference_variable, name=name,
                                                                            initializer=initializer)
        self._tfaccel_slots[id(slot)] = (tuple(int(d) for d in reference_variable.shape), owner is not None)
        return slot

    def _tfaccel_saved(self) -> List[Any]:
        """The variables a plain Keras optimizer of this class has, in its order (the accumulation's left out)."""
        unsaved = getattr(self, "_tfaccel_unsaved", set())
        return [v for v in self.variables if id(v) not in unsaved]

    def save_own_variables(self, store: Any) -> None:
        slots = getattr(self, "_tfaccel_slots", {})
        whole = not slots or not (self._tfaccel_apart or self._tfaccel_workers > 1)  # every slot readable here
        for i, variable in enumerate(self._tfaccel_saved()):
            info = None if whole else slots.get(id(variable))
            if info is None:  # the iteration counter, the rate...: the same on every replica
                store[str(i)] = variable.numpy()
            elif self._tfaccel_apart:
                store[str(i)] = np.zeros((0,), variable.dtype)
            else:  # the owner's value, summed with the other workers' zeros: every worker calls this
                value = variable.numpy() if info[1] else np.zeros(info[0], variable.dtype)
                store[str(i)] = self._tfaccel_sum(value)

    def load_own_variables(self, store: Any) -> None:
        slots, saved = getattr(self, "_tfaccel_slots", {}), self._tfaccel_saved()
        if len(store.keys()) != len(saved) or (len(saved) == len(self.variables) and not slots):
            super().load_own_variables(store)  # type: ignore[misc]  # Keras' own load, or its warning
            self._tfaccel_realign()
            return
        for i, variable in enumerate(saved):
            info = slots.get(id(variable))
            if info is not None and (self._tfaccel_apart or not info[1]):
                continue  # a stand-in here, or the shard files carry it
            value = store[str(i)]
            if info is not None and tuple(value.shape) != info[0]:
                raise ValueError(f"optimizer {self.name}: variable {i} ({variable.path}) is saved with shape "
                                 f"{tuple(value.shape)}, not {info[0]}: a file written with its slots apart (a tfaccel "
                                 "backup of sharded state) loads through tfaccel's backups")
            variable.assign(value)
        self._tfaccel_realign()  # the accumulation's counter, which is not saved

    def _clip_gradients(self, grads: Any) -> Any:
        return grads  # clipped once reduced (in _tfaccel_update), with the global norm

    def _backend_update_step(self, grads: Any, trainable_variables: Any, learning_rate: Any) -> None:
        tvars = backing_variables(trainable_variables)
        keras_internals.maybe_merge_call(self._tfaccel_update, self._distribution_strategy,
                                         list(grads), tvars, learning_rate)

    def _tfaccel_update(self, distribution: Any, grads: List[Any], tvars: List[Any], learning_rate: Any) -> None:
        plain = [i for i, v in enumerate(tvars) if self._var_key(v) not in self._tfaccel_owner]
        folded = self._tfaccel_folded(distribution, grads, tvars, plain)
        reduced = [i for i in plain if i not in folded]
        sums = []
        if reduced:  # variables left unsharded (sparse gradients): Keras' own all-reduce, every replica updates them
            sums = distribution.extended.batch_reduce_to(tf.distribute.ReduceOp.SUM,
                                                         [(grads[i], tvars[i]) for i in reduced])
        # global_clipnorm: the global norm includes the unsharded gradients (their sums are the same on every replica)
        unsharded_squared = (keras_zero_collective.squared_norm([distribution.experimental_local_results(s)[0]
                                                                 for s in sums])
                             if sums and self.global_clipnorm else None)
        rest = [i for i in range(len(tvars)) if i not in plain]
        plain_vars, folded_vars = [tvars[i] for i in reduced], [tvars[i] for i in folded]
        grads, tvars = [grads[i] for i in rest], [tvars[i] for i in rest]
        if self._tfaccel_workers > 1:
            scale, folded_sums = self._tfaccel_update_workers(distribution, grads, tvars, learning_rate,
                                                              unsharded_squared, folded)
        else:
            scale, folded_sums = self._tfaccel_update_replicas(distribution, grads, tvars, learning_rate,
                                                               unsharded_squared), []
        if sums:
            self._tfaccel_update_plain(distribution, sums, plain_vars, learning_rate, scale)
        if folded_sums:
            self._tfaccel_update_plain(distribution, folded_sums, folded_vars, learning_rate, scale)

    def _tfaccel_folded(self, distribution: Any, grads: List[Any], tvars: List[Any],
                        plain: List[int]) -> Dict[int, Any]:
        """Under multi_worker, the unsharded variables whose gradients the sharded exchange sums
        (``keras_zero_collective.foldable``): position -> (dense local gradient, its share of the global norm)."""
        if self._tfaccel_workers <= 1:
            return {}
        local = {i: distribution.experimental_local_results(grads[i])[0] for i in plain}
        exchanged = sum(int(tf.TensorShape(v.shape).num_elements() or 0) for i, v in enumerate(tvars) if i not in local)
        return {i: (keras_zero_collective.densify(g, tvars[i]), keras_zero_collective.local_squares(g))
                for i, g in local.items() if keras_zero_collective.foldable(
                    g, tvars[i], exchanged=exchanged, global_clipnorm=bool(self.global_clipnorm))}

    def _tfaccel_update_replicas(self, distribution: Any, grads: List[Any], tvars: List[Any], learning_rate: Any,
                                 unsharded_squared: Optional[Any]) -> Optional[Any]:
        """One process's replicas: each gradient reduced to its owner, clipped, applied there and the new value
        copied to the other replicas; returns ``global_clipnorm``'s scale (None without it)."""
        owners = [self._tfaccel_owner[self._var_key(v)] for v in tvars]
        reduced = [distribution.extended.reduce_to(tf.distribute.ReduceOp.SUM, g,
                                                   destinations=self._tfaccel_devices[o])
                   for g, o in zip(grads, owners)]
        scale = None
        if self.global_clipnorm:
            squared = keras_zero_collective.squared_norm(reduced)
            reduced, scale = keras_zero_collective.clip_by_global_norm(
                reduced, self.global_clipnorm, squared if unsharded_squared is None else squared + unsharded_squared)
        else:
            reduced = super()._clip_gradients(reduced)  # type: ignore[misc]
        rates = distribution.experimental_local_results(learning_rate)
        for grad, var, owner in zip(reduced, tvars, owners):
            with tf.device(self._tfaccel_devices[owner]):
                self.update_step(grad, distribution.experimental_local_results(var)[owner],
                                 rates[owner] if len(rates) > 1 else rates[0])
        self._tfaccel_share(distribution, tvars)
        return scale

    def _tfaccel_share(self, distribution: Any, tvars: Sequence[Any], label: Optional[str] = "all_gather") -> None:
        """Every replica's copy of each (sharded) variable of ``tvars`` given its owner's value: copied on one host,
        all-gathered between workers (``label``: the gather's name in ``keras_zero_collective.exchange_bytes``)."""
        if self._tfaccel_workers > 1:
            owner_of = dict(zip(self._tfaccel_owner, self._tfaccel_layout["owners"]))  # both in build's order
            keras_zero_collective.share_owned(
                keras_zero_collective.collectives_for(distribution),
                variables=[distribution.experimental_local_results(v)[0] for v in tvars],
                owners=[owner_of[self._var_key(v)] for v in tvars], me=self._tfaccel_layout["index"], label=label)
            return
        for var in tvars:
            owner, copies = self._tfaccel_owner[self._var_key(var)], distribution.experimental_local_results(var)
            with tf.device(self._tfaccel_devices[owner]):
                value = copies[owner].read_value()
            for index, copy in enumerate(copies):
                if index != owner:
                    with tf.device(self._tfaccel_devices[index]):
                        copy.assign(value)

    def _tfaccel_update_plain(self, distribution: Any, sums: List[Any], tvars: List[Any], learning_rate: Any,
                              scale: Optional[Any]) -> None:
        """Keras' own update of the variables left unsharded: ``sums`` (their gradients summed onto every replica,
        dense or ``IndexedSlices``) clipped, each replica's copy updated by the optimizer's ``update_step`` on its
        replicated slots. ``scale``: ``global_clipnorm``'s, from the global norm over every gradient; without it
        ``clipnorm`` / ``clipvalue`` clip each sum."""
        def apply(var: Any, grad: Any, rate: Any) -> Any:
            if scale is not None:
                grad = grad * scale  # as Keras' clip_by_global_norm scales it
            else:
                grad = super(ShardOptimizerState, self)._clip_gradients([grad])[0]
            return self.update_step(grad, var, rate)

        for grad, var in zip(sums, tvars):
            distribution.extended.update(var, apply, args=(grad, learning_rate), group=False)

    def _tfaccel_update_workers(self, distribution: Any, grads: List[Any], tvars: List[Any], learning_rate: Any,
                                unsharded_squared: Optional[Any], folded: Dict[int, Any]) -> Tuple[Any, List[Any]]:
        """Several workers, one replica each: reduce-scatter, update, all-gather (``keras_zero_collective``);
        returns ``global_clipnorm``'s scale (None without it) and the sums of the ``folded`` gradients."""
        one = distribution.experimental_local_results
        owner_of = dict(zip(self._tfaccel_owner, self._tfaccel_layout["owners"]))  # both in build's order
        return keras_zero_collective.update_across_workers(
            keras_zero_collective.collectives_for(distribution), grads=[one(g)[0] for g in grads],
            variables=[one(v)[0] for v in tvars], owners=[owner_of[self._var_key(v)] for v in tvars],
            me=self._tfaccel_layout["index"], rate=one(learning_rate)[0], update=self.update_step,
            clip=super()._clip_gradients, global_clipnorm=self.global_clipnorm,  # type: ignore[misc]
            unsharded_squared=unsharded_squared, summed=[f[0] for f in folded.values()],
            summed_squares=[f[1] for f in folded.values()])


_SUMS: Dict[int, Any] = {}


def _sum_over_workers(strategy: Any, value: np.ndarray) -> np.ndarray:
    """``value`` summed over every worker (a collective all-reduce; every worker calls it, in the same order)."""
    if id(strategy) not in _SUMS:
        @tf.function(reduce_retracing=True)
        def total(tensor: Any) -> Any:
            return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(tf.identity, args=(tensor,)), axis=None)

        _SUMS.clear()  # one strategy per process at a time
        _SUMS[id(strategy)] = total
    return _SUMS[id(strategy)](tf.constant(value)).numpy()


def sharded_class(base: type, partition: Callable[[Sequence[int], int], List[int]],
                  mixin: Optional[type] = None) -> type:
    """A subclass of ``base`` whose slots are sharded over the replicas by ``partition`` (see the module doc);
    ``mixin`` (a subclass of :class:`ShardOptimizerState`, e.g. one process per replica over Horovod) instead of it.

    Same name and module as ``base``: a saved .keras file names the plain Keras optimizer.
    """
    mixin = mixin or ShardOptimizerState
    if (base, mixin) not in _SHARDED:
        _SHARDED[(base, mixin)] = type(base.__name__, (mixin, base),
                                       {"__module__": base.__module__, "__qualname__": base.__qualname__,
                                        "tfaccel_partition": staticmethod(partition)})
    return _SHARDED[(base, mixin)]


def sparse_gradient_variables(model: Any) -> Dict[str, str]:
    """``{variable path: its layer's name}`` of the trainable variables whose gradient may be sparse
    (``IndexedSlices``): those of ``keras.layers.Embedding`` layers and their subclasses (KerasHub's
    ``ReversibleEmbedding`` too)."""
    return {v.path: layer.name for layer in keras_internals.flatten_layers(model)
            if isinstance(layer, keras.layers.Embedding) for v in layer.trainable_weights}


def leave_unsharded(optimizer: Any, variables: Sequence[Any]) -> None:
    """Before the sharded optimizer is built: ``variables`` keep Keras' own replicated slots and update."""
    optimizer._tfaccel_unsharded = {optimizer._var_key(v) for v in variables}


def is_sharded(optimizer: Any) -> bool:
    """Whether ``optimizer``'s class is one ``sharded_class`` made."""
    return isinstance(optimizer, ShardOptimizerState)


def slot_bytes_per_device(optimizer: Any, strategy: Any) -> Dict[str, int]:
    """Bytes of the optimizer's variables held on each device (every copy of a mirrored one counted)."""
    held: Dict[str, int] = {}
    for variable in optimizer.variables:
        value = getattr(variable, "value", variable)
        for copy in strategy.experimental_local_results(value):
            device = tf.DeviceSpec.from_string(copy.device).to_string()
            held[device] = held.get(device, 0) + _num_bytes(copy)
    return held


def shard_layout(optimizer: Any) -> Optional[Dict[str, Any]]:
    """How a built sharded optimizer splits its slots: ``count`` (replicas), ``processes`` (workers, each holding
    its replicas' slots), ``owners`` (the owner replica of each trainable variable, in build order) and ``index``
    (this process's first replica); None for an optimizer not sharded or not built."""
    if not is_sharded(optimizer) or not getattr(optimizer, "_tfaccel_slots", None):
        return None
    return dict(optimizer._tfaccel_layout)


def held_slots(optimizer: Any) -> Dict[str, np.ndarray]:
    """``{index in optimizer.variables: value}`` of the sharded slots this process holds (its shard)."""
    slots = optimizer._tfaccel_slots
    return {str(i): v.numpy() for i, v in enumerate(optimizer.variables) if slots.get(id(v), ((), False))[1]}


def load_held_slots(optimizer: Any, lookup: Callable[[str], Optional[np.ndarray]]) -> List[str]:
    """Assigns every slot this process holds from ``lookup(index)`` (its value in the shards, written by any number
    of processes, or None); what could not be assigned (missing, or another shape), one line each."""
    problems, slots = [], optimizer._tfaccel_slots
    for i, variable in enumerate(optimizer.variables):
        shape, held = slots.get(id(variable), ((), False))
        if not held:
            continue
        value = lookup(str(i))
        if value is None or tuple(value.shape) != shape:
            problems.append(f"{variable.path}: " + ("in no shard" if value is None else
                                                    f"shape {tuple(value.shape)} in its shard, {shape} here"))
            continue
        variable.assign(value)
    return problems


@contextlib.contextmanager
def slots_apart(optimizer: Any) -> Iterator[None]:
    """Within: a sharded optimizer saves each sharded slot as an empty array and leaves them alone on load (the
    backup's shard files carry them); no collective runs. A no-op for any other optimizer."""
    if not is_sharded(optimizer):
        yield
        return
    optimizer._tfaccel_apart = True
    try:
        yield
    finally:
        optimizer._tfaccel_apart = False
