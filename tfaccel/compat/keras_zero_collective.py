"""ZeRO-1's exchange between workers: ``tfaccel.compat.keras_zero``'s sharded optimizer under
MultiWorkerMirroredStrategy with one device per worker (seen on TensorFlow 2.21.0 / Keras 3.15.1).

One optimizer step on every worker, for the trainable variables of each dtype (a *bucket*):

1. its gradients laid out flat, grouped by owner (the worker holding the variable's slots), each owner's group
   padded to the bucket's *chunk* (the largest owner's share): one row per worker;
2. row k sent to the worker of rank k, the rows meant for this worker received from every worker and summed
   (``CollectiveAllToAllV2`` + a local sum): a reduce-scatter, which leaves each owner its variables' summed gradients;
3. ``global_clipnorm``: the global norm from the owners' squared norms (one scalar ``CollectiveReduceV2``) and
   those of the variables left unsharded (Embedding tables, the same on every worker);
   ``clipnorm`` / ``clipvalue`` are the optimizer's own, per variable, on the owner;
4. the owner's variables updated by the user's optimizer (``update_step``);
5. the owners' updated chunks all-gathered (``CollectiveGatherV2``), the other workers' variables assigned from them.

Steps 2 and 5 move the bytes of one all-reduce of the gradients (a ring all-reduce is a reduce-scatter followed by
an all-gather); :func:`exchange_bytes` counts them from the tensors given to the collectives.

The variables left unsharded (Embedding tables: every worker keeps them whole, with their slots) need their summed
gradient on every worker. Where that is exact (:func:`foldable`: a dense gradient, or slices under
``global_clipnorm``, for a table no larger than the sharded variables), the sum rides in the same two collectives:
the table's dense gradient split evenly over the owners, each piece summed by its owner in step 2 and handed on
unchanged in step 5 (the two halves of an all-reduce again). Otherwise the strategy's own all-reduce gathers every
worker's slices (the lengths, then the indices, then the values: three rounds more in a step of two).

Why an all-to-all: TensorFlow 2.21 has no reduce-scatter on CPUs. Its collective registry holds RingReduce,
RingGather, AllToAll, HierarchicalTreeBroadcast and Permute for CPUs (NcclReduceScatter for GPUs only), and
``CollectiveReduceScatterV2`` on a CPU fails with "CollectiveRegistry::Lookup did not find collective implementation
undef", which aborts every collective of the process. An all-to-all followed by a local sum is a reduce-scatter with
its bytes (each worker sends (N-1)/N of its buffer and receives (N-1) chunks).

Keys: the collectives run on a ``CollectiveReplicaLauncher`` of their own (TensorFlow's class behind the strategy's
own collectives: instance keys fed when the function is called, one ordering token) in group ``GROUP_KEY``; the
strategy numbers its groups from 1 up, one per set of devices.

Ranks: TensorFlow ranks a group's members by the lexicographic order of their task names, not by the strategy's
replica ids (measured with 11 workers: task 10 has rank 2; ``EstablishGlobalRank`` in TensorFlow's
collective_param_resolver_local.cc). Rows are laid out in that order, and each row carries the replica id it is for,
which its receiver checks: a different order is an error before any update, never a wrong one.

It uses TensorFlow's ``cross_device_utils.CollectiveKeys`` and ``CollectiveReplicaLauncher`` (its private
``_next_instance_key`` and ``_get_ordering_token``), the collective strategy's ``_communication_options`` (its
timeout) and ``multi_worker_util.id_in_cluster``; tests/training/test_zero_workers.py fails when one of them moves.
"""

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import keras
import tensorflow as tf
from tensorflow.python.distribute import cross_device_utils, multi_worker_util

__all__ = ["GROUP_KEY", "Bucket", "plan_buckets", "rank_order", "WorkerCollectives", "collectives_for",
           "update_across_workers", "share_owned", "exchange_bytes", "check_rows", "squared_norm",
           "clip_by_global_norm", "foldable", "densify", "local_squares", "even_pieces"]

GROUP_KEY = 1 << 24  # far above the strategy's own group keys (1, 2, ...)


@dataclasses.dataclass(frozen=True)
class Bucket:
    """The step's trainable variables of one dtype: ``members[r]`` are the positions (in the step's variable list)
    of those replica ``r`` owns, in order; ``sizes`` the element count at each position of the whole list;
    ``chunk`` the elements of the largest owner's share (every row is padded to it)."""

    dtype: tf.DType
    members: Tuple[Tuple[int, ...], ...]
    sizes: Tuple[int, ...]
    chunk: int


def plan_buckets(shapes: Sequence[Sequence[int]], dtypes: Sequence[Any], owners: Sequence[int],
                 replicas: int) -> List[Bucket]:
    """One :class:`Bucket` per dtype (in order of first appearance) of the variables with these shapes, dtypes and
    owner replicas."""
    sizes = tuple(int(tf.TensorShape(s).num_elements() or 0) for s in shapes)
    buckets = []
    for dtype in dict.fromkeys(tf.as_dtype(d) for d in dtypes):
        members = tuple(tuple(i for i, (d, o) in enumerate(zip(dtypes, owners)) if tf.as_dtype(d) == dtype and o == r)
                        for r in range(replicas))
        chunk = max(sum(sizes[i] for i in group) for group in members)
        buckets.append(Bucket(dtype, members, sizes, chunk))
    return buckets


def rank_order(cluster: Dict[str, Sequence[str]]) -> List[int]:
    """The replica id of each collective rank in a cluster of one device per worker (``cluster``: job name ->
    addresses): TensorFlow ranks the tasks by their names' lexicographic order."""
    tasks = [(f"/job:{job}/replica:0/task:{index}", job, index)
             for job in ("chief", "worker") for index in range(len(cluster.get(job, ())))]
    return [multi_worker_util.id_in_cluster(dict(cluster), job, index) for _, job, index in sorted(tasks)]


class WorkerCollectives:
    """The collectives of one MultiWorkerMirroredStrategy (one device per worker) in group ``GROUP_KEY``.

    ``traced`` lists ``(op, bytes in, bytes out)`` of each collective in the last traced step, from the tensors given.
    """

    def __init__(self, strategy: Any) -> None:
        self.replicas = strategy.num_replicas_in_sync
        self.ranks = rank_order(strategy.cluster_resolver.cluster_spec().as_dict())
        self.device = strategy.extended.worker_devices[0]
        self.options = strategy.extended._communication_options
        keys = cross_device_utils.CollectiveKeys(group_key_start=GROUP_KEY)
        self._launcher = cross_device_utils.CollectiveReplicaLauncher(
            keys.get_group_key([self.device]), self.replicas, keys, self.device, self.options)
        self.traced: List[Tuple[str, int, int]] = []

    def _run(self, name: Optional[str], op: Callable[..., Any], value: Any) -> Any:
        """``op`` on ``value`` as the group's next collective; ``name``: its row in :func:`exchange_bytes` (None: a
        collective outside the training step, not counted)."""
        with tf.device(self.device):
            out = op(input=value, group_size=self.replicas, group_key=GROUP_KEY,
                     instance_key=self._launcher._next_instance_key(),
                     ordering_token=[self._launcher._get_ordering_token()],
                     communication_hint=self.options.implementation.value.lower(),
                     timeout_seconds=self.options.timeout_seconds or 0.0)
        if name is not None:
            self.traced.append((name, _nbytes(value), _nbytes(out)))
        return out

    def all_to_all(self, rows: Any) -> Any:
        """``rows[k]`` to rank k; row k of the result came from rank k."""
        return self._run("all_to_all", tf.raw_ops.CollectiveAllToAllV2, rows)

    def all_gather(self, chunk: Any, label: Optional[str] = "all_gather") -> Any:
        """Every rank's ``chunk``, concatenated in rank order (``label``: its row in :func:`exchange_bytes`)."""
        size = self.replicas * int(chunk.shape[0])  # the op's own output shape is unknown
        return self._run(label, lambda **kw: tf.ensure_shape(tf.raw_ops.CollectiveGatherV2(**kw), [size]), chunk)

    def all_reduce_sum(self, value: Any) -> Any:
        return self._run("all_reduce", lambda **kw: tf.raw_ops.CollectiveReduceV2(merge_op="Add", final_op="Id", **kw),
                         value)


def _nbytes(tensor: Any) -> int:
    return int(tensor.shape.num_elements()) * tensor.dtype.size


_COLLECTIVES: Dict[int, WorkerCollectives] = {}


def collectives_for(strategy: Any) -> WorkerCollectives:
    """The :class:`WorkerCollectives` of ``strategy`` (one per process: its instance keys count on across fits)."""
    if id(strategy) not in _COLLECTIVES:
        _COLLECTIVES.clear()  # one strategy per process at a time
        _COLLECTIVES[id(strategy)] = WorkerCollectives(strategy)
    return _COLLECTIVES[id(strategy)]


def exchange_bytes(strategy: Any) -> Dict[str, Dict[str, int]]:
    """``{op: {"calls", "bytes_in", "bytes_out"}}`` of the collectives of one sharded step (the last traced), counted
    from the tensors given to them; empty before any. ``all_gather_ema``: the gather of ``use_ema``'s overwrite,
    which runs on every ``ema_overwrite_frequency``-th step only."""
    totals: Dict[str, Dict[str, int]] = {}
    collectives = _COLLECTIVES.get(id(strategy))
    for name, given, got in collectives.traced if collectives else ():
        row = totals.setdefault(name, {"calls": 0, "bytes_in": 0, "bytes_out": 0})
        row["calls"] += 1
        row["bytes_in"] += given
        row["bytes_out"] += got
    return totals


def check_rows(tags: Any, me: int, ranks: Sequence[int]) -> Any:
    """An op that fails unless every received row was meant for replica ``me`` (``tags``: the ids they carry)."""
    return tf.debugging.assert_equal(
        tags, tf.fill(tf.shape(tags), tf.cast(me, tags.dtype)),
        message=f"tfaccel ZeRO-1: the worker of replica {me} received gradient rows meant for other replicas: "
                f"TensorFlow ranked the collective group in another order than tfaccel expects (replica id by rank: "
                f"{list(ranks)}); train with shard_optimizer_state=False, and report it with your TensorFlow version")


def _flat(tensors: Sequence[Any], sizes: Sequence[int], chunk: int, dtype: tf.DType) -> Any:
    """``tensors`` flattened (each of ``sizes`` elements: its variable's, whatever static shape a gradient has) and
    concatenated, padded to ``chunk``."""
    parts = [tf.ensure_shape(tf.reshape(t, [-1]), [n]) for t, n in zip(tensors, sizes)]
    flat = tf.concat(parts, 0) if parts else tf.zeros([0], dtype)
    return tf.pad(flat, [[0, chunk - sum(sizes)]])


def _reduce_scatter(col: WorkerCollectives, bucket: Bucket, grads: Sequence[Any], shapes: Sequence[Any],
                    me: int) -> Dict[int, Any]:
    """The summed gradients of the bucket's variables this replica owns, by position, each of its variable's shape
    (``shapes``: a gradient's own static shape may be partly unknown)."""
    rows = [tf.concat([_flat([grads[i] for i in bucket.members[r]], [bucket.sizes[i] for i in bucket.members[r]],
                             bucket.chunk, bucket.dtype),
                       tf.constant([r], bucket.dtype)], 0) for r in col.ranks]
    received = col.all_to_all(tf.stack(rows))
    with tf.control_dependencies([check_rows(received[:, -1], me, col.ranks)]):
        summed = tf.reduce_sum(received[:, :-1], axis=0)
    mine = bucket.members[me]
    parts = tf.split(summed, [bucket.sizes[i] for i in mine] + [bucket.chunk - sum(bucket.sizes[i] for i in mine)])
    return {i: tf.reshape(p, shapes[i]) for i, p in zip(mine, parts)}


def _gather(col: WorkerCollectives, bucket: Bucket, own: Sequence[Any], me: int,
            label: Optional[str]) -> Dict[int, Any]:
    """The values at the bucket's positions other replicas own, flat, from their owners (``own``: this replica's
    values at its positions, in order), by one all-gather."""
    mine = bucket.members[me]
    local = _flat(own, [bucket.sizes[i] for i in mine], bucket.chunk, bucket.dtype)
    rows = tf.reshape(col.all_gather(local, label), [col.replicas, bucket.chunk])
    values = {}
    for rank, replica in enumerate(col.ranks):
        offset = 0
        for i in bucket.members[replica]:
            if replica != me:
                values[i] = rows[rank, offset:offset + bucket.sizes[i]]
            offset += bucket.sizes[i]
    return values


def _gather_values(col: WorkerCollectives, bucket: Bucket, variables: Sequence[Any], me: int,
                   label: Optional[str]) -> None:
    """Assigns the other replicas' variables of the bucket from their owners' updated values."""
    own = [variables[i].read_value() for i in bucket.members[me]]
    for i, values in _gather(col, bucket, own, me, label).items():
        variables[i].assign(tf.reshape(values, variables[i].shape))


def foldable(grad: Any, variable: Any, *, exchanged: int, global_clipnorm: bool) -> bool:
    """Whether the gradient of a variable left unsharded (an Embedding table's) is summed inside the sharded step's
    two exchanges (:func:`update_across_workers`'s ``summed``) instead of by the strategy's own all-reduce: where
    that gives the optimizer exactly what Keras gives it.

    A dense gradient always is (the same sum, without a round of its own). An ``IndexedSlices`` one only where the
    optimizer clips by ``global_clipnorm``: Keras 3.15.1's ``clip_by_global_norm`` turns the gathered slices into
    their dense sum before the update (whose global norm, the slices', :func:`local_squares` keeps); and only where
    the table has no more elements than the sharded variables together (``exchanged``), so that it at most doubles
    what the exchange moves: a huge table whose batches touch few rows moves fewer bytes as slices. That bound comes
    from the variables alone, the same on every worker (the slices' own size can differ between workers, on a
    partial last batch, and the workers must choose alike). Elsewhere Keras' update reads the slices themselves, and
    for a row two lookups touched Adam's second moment is ``g1**2 + g2**2``, not ``(g1 + g2)**2`` (measured: 7e-4
    apart after two Adam steps): those stay with the strategy's all-reduce."""
    if not isinstance(grad, tf.IndexedSlices):
        return True
    return global_clipnorm and int(tf.TensorShape(variable.shape).num_elements() or 0) <= exchanged


def densify(grad: Any, variable: Any) -> Any:
    """The gradient as a dense tensor of the variable's shape (an ``IndexedSlices`` one's rows summed per index)."""
    if isinstance(grad, tf.IndexedSlices):
        rows = int(variable.shape[0])
        return tf.math.unsorted_segment_sum(grad.values, grad.indices, rows)
    return grad


def local_squares(grad: Any) -> Optional[Any]:
    """This worker's share of a folded gradient's square in Keras' global norm: an ``IndexedSlices`` gradient's own
    slices (Keras' norm of the gathered slices is the sum of every worker's), None for a dense one (the square of its
    sum counts, which the owners of its pieces add)."""
    return squared_norm([grad]) if isinstance(grad, tf.IndexedSlices) else None


def even_pieces(size: int, replicas: int) -> List[int]:
    """``size`` elements in ``replicas`` contiguous pieces, the first ``size % replicas`` one element longer."""
    return [size // replicas + (r < size % replicas) for r in range(replicas)]


def squared_norm(grads: Sequence[Any]) -> Any:
    """The square of Keras' ``global_norm`` (keras/src/optimizers/base_optimizer.py): each gradient's sum of
    squares (of an ``IndexedSlices`` one, its slices' values, as Keras' ops square them), summed; 0 for none."""
    if not grads:
        return tf.constant(0.0)
    return keras.ops.sum(keras.ops.stack([keras.ops.sum(keras.ops.square(g)) for g in grads]))


def clip_by_global_norm(grads: Sequence[Any], clip_norm: float, squared: Any) -> Tuple[List[Any], Any]:
    """Keras' ``clip_by_global_norm`` for the global norm whose square is ``squared``: the gradients scaled as Keras
    scales them, and the scale (for gradients clipped elsewhere by the same norm)."""
    norm = tf.sqrt(squared)
    scale = clip_norm * tf.minimum(1.0 / norm, 1.0 / clip_norm) + (norm - norm)
    return [g * scale for g in grads], scale


def _clip_over_workers(col: WorkerCollectives, grads: List[Any], clip_norm: float,
                       unsharded_squared: Optional[Any], extra: Sequence[Any] = ()) -> Tuple[List[Any], Any]:
    """``global_clipnorm`` over every owner's gradients: the squared norm of this owner's and ``extra`` (this
    worker's shares of the folded gradients'), summed over the workers, plus ``unsharded_squared`` (the unsharded
    variables' gradients, the same on every worker)."""
    local = squared_norm(grads)
    for share in extra:
        local = local + share
    total = col.all_reduce_sum(tf.reshape(tf.cast(local, tf.float32), [1]))[0]
    return clip_by_global_norm(grads, clip_norm, total if unsharded_squared is None else total + unsharded_squared)


@dataclasses.dataclass
class _Items:
    """What one step exchanges: the sharded variables' gradients, then the pieces of the ``summed`` gradients
    (position ``len(variables)`` on), each with its shape, dtype and owner."""

    grads: List[Any]
    shapes: List[Any]
    dtypes: List[Any]
    owners: List[int]
    pieces: List[List[int]]  # per summed gradient: the positions of its pieces, in order

    @classmethod
    def of(cls, grads: Sequence[Any], variables: Sequence[Any], owners: Sequence[int], summed: Sequence[Any],
           replicas: int) -> "_Items":
        items = cls(list(grads), [v.shape for v in variables], [v.dtype for v in variables], list(owners), [])
        for grad in summed:
            flat = tf.reshape(grad, [-1])
            positions = []
            for owner, piece in enumerate(tf.split(flat, even_pieces(int(flat.shape[0]), replicas))):
                positions.append(len(items.grads))
                items.grads.append(piece)
                items.shapes.append(piece.shape)
                items.dtypes.append(grad.dtype)
                items.owners.append(owner)
            items.pieces.append(positions)
        return items


def update_across_workers(col: WorkerCollectives, *, grads: Sequence[Any], variables: Sequence[Any],
                          owners: Sequence[int], me: int, rate: Any, update: Callable[[Any, Any, Any], Any],
                          clip: Callable[[List[Any]], List[Any]], global_clipnorm: Optional[float],
                          unsharded_squared: Optional[Any] = None, summed: Sequence[Any] = (),
                          summed_squares: Sequence[Optional[Any]] = ()) -> Tuple[Optional[Any], List[Any]]:
    """One sharded optimizer step (the module doc's 1-5).

    Args:
        col: the strategy's collectives.
        grads: this worker's gradients (its local values), one per variable.
        variables: this worker's copies of the trainable variables.
        owners: the owner replica of each variable.
        me: this worker's replica id.
        rate: the learning rate of this step.
        update: the optimizer's ``update_step(gradient, variable, rate)``.
        clip: the optimizer's own per-variable clipping (``clipnorm`` / ``clipvalue``), used without
            ``global_clipnorm``.
        global_clipnorm: the optimizer's ``global_clipnorm`` (None or 0: off).
        unsharded_squared: the squared norm of the gradients of the variables left unsharded (summed over the
            workers already), which the global norm includes; None where there are none.
        summed: dense local gradients of variables left unsharded whose sums every worker needs (:func:`foldable`):
            each split evenly over the owners and carried by the same two exchanges, the owner of a piece
            receiving its sum in the all-to-all and handing it on in the all-gather (no round of their own).
        summed_squares: per gradient of ``summed``, :func:`local_squares`.

    Returns:
        (``global_clipnorm``'s scale or None, the sums of ``summed`` in order, each of its gradient's shape).
    """
    col.traced = []
    items = _Items.of(grads, variables, owners, summed, col.replicas)
    buckets = plan_buckets(items.shapes, items.dtypes, items.owners, col.replicas)
    reduced: Dict[int, Any] = {}
    for bucket in buckets:
        reduced.update(_reduce_scatter(col, bucket, items.grads, items.shapes, me))
    mine = sorted(i for i in reduced if i < len(variables))
    owned = [reduced[i] for i in mine]
    scale = None
    if global_clipnorm:
        extra = [s for s in summed_squares if s is not None] + [
            squared_norm([reduced[p] for p in positions if p in reduced])
            for positions, given in zip(items.pieces, summed_squares) if given is None]
        owned, scale = _clip_over_workers(col, owned, global_clipnorm, unsharded_squared, extra)
    else:
        owned = clip(owned)
    for i, grad in zip(mine, owned):
        update(grad, variables[i], rate)
    gathered: Dict[int, Any] = {}
    for bucket in buckets:
        own = [variables[i].read_value() if i < len(variables) else reduced[i] for i in bucket.members[me]]
        gathered.update(_gather(col, bucket, own, me, "all_gather"))
    for i, values in gathered.items():
        if i < len(variables):
            variables[i].assign(tf.reshape(values, variables[i].shape))
    sums = [tf.reshape(tf.concat([reduced[p] if p in reduced else gathered[p] for p in positions], 0), grad.shape)
            for positions, grad in zip(items.pieces, summed)]
    return scale, sums


def share_owned(col: WorkerCollectives, *, variables: Sequence[Any], owners: Sequence[int], me: int,
                label: Optional[str] = "all_gather") -> None:
    """The module doc's step 5: the owners' values of ``variables`` (this worker's copies; ``owners``: the owner
    replica of each) all-gathered, one buffer per dtype, and every other worker's copy assigned from them.
    ``label``: the gathers' row in :func:`exchange_bytes` (None: not counted, outside a training step)."""
    for bucket in plan_buckets([v.shape for v in variables], [v.dtype for v in variables], owners, col.replicas):
        _gather_values(col, bucket, variables, me, label)
