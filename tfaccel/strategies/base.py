"""The Backend: what compile_and_fit needs to know about how a job is spread.

A registry entry (see ``tfaccel.strategies.registry``) turns a name plus options into a ``Backend``.
``get_strategy(name)`` returns ``backend.strategy`` (a ``tf.distribute.Strategy``) for users who only
want that; ``compile_and_fit`` uses the whole ``Backend``.
"""

import contextlib
import dataclasses
import functools
from typing import Any, Callable, ContextManager, Dict, List, Optional, Tuple

import tensorflow as tf

from tfaccel.xla import HOROVOD_NOTE, MULTI_WORKER_CPU_NOTE, MULTI_WORKER_GPU_NOTE, TPU_NOTE

__all__ = ["Backend", "Traits"]


@dataclasses.dataclass(frozen=True)
class Traits:
    """What differs per built-in strategy, read by the training loops, the plan and the XLA decision (a strategy
    registered by a user has the defaults: none of these).

    Attributes:
        multi_step: tfaccel's multi-step loop runs under it (replicas gather their part of in-memory arrays).
        single_device: one replica in one process when it has one replica (the compiled loop can run it).
        keras_multi_step_issue: why Keras' own multi-step train function cannot run under it ("": it can).
        every_worker_saves: every worker writes checkpoints (MultiWorkerMirroredStrategy's rule); the chief's
            copy is the one kept.
        shards_by_rank: data is sharded by hand, one pipeline per rank (no tf.distribute input pipeline).
        compiled_by_xla: why Keras' ``jit_compile`` does not apply: everything is compiled by XLA already.
        xla_auto_off: ``"auto"`` keeps XLA off: (why on CPUs, why on GPUs).
        xla_one_replica: with one replica, the one-device XLA rule applies.
        xla_several_replicas: why ``"auto"`` keeps XLA off with several replicas ("": not measured).
        plan_note: a line the plan states about it.
        keras_fit_fix: tfaccel.compat.keras_mwms's Keras fit fix is for it (the plan says when it is applied).
    """

    multi_step: bool = False
    single_device: bool = False
    keras_multi_step_issue: str = ""
    every_worker_saves: bool = False
    shards_by_rank: bool = False
    compiled_by_xla: str = ""
    xla_auto_off: Tuple[str, str] = ("", "")
    xla_one_replica: bool = False
    xla_several_replicas: str = ""
    plan_note: str = ""
    keras_fit_fix: bool = False


@functools.lru_cache(maxsize=None)
def _builtin_traits() -> Dict[str, Traits]:
    return {
        "default": Traits(single_device=True, xla_one_replica=True),
        "one_device": Traits(single_device=True, xla_one_replica=True),
        "mirrored": Traits(multi_step=True, xla_one_replica=True,
                           xla_several_replicas="MirroredStrategy over several devices"),
        # Keras 3.15's multi-step loop fails under MultiWorkerMirroredStrategy: "You must feed a value for
        # placeholder tensor .../while/cond/Placeholder" from the distributed iterator (Keras 3.15.1, TF 2.21.0).
        "multi_worker": Traits(multi_step=True, every_worker_saves=True, keras_fit_fix=True,
                               keras_multi_step_issue="Keras 3.15's multi-step loop fails under "
                                                      "MultiWorkerMirroredStrategy",
                               xla_auto_off=(MULTI_WORKER_CPU_NOTE, MULTI_WORKER_GPU_NOTE)),
        "parameter_server": Traits(plan_note="trained by tfaccel's ClusterCoordinator loop (Keras 3 fit does not "
                                             "run ParameterServerStrategy)"),
        "tpu": Traits(compiled_by_xla=TPU_NOTE, plan_note="TPU: batches use drop_remainder=True (static shapes)"),
        "horovod": Traits(shards_by_rank=True, xla_auto_off=(HOROVOD_NOTE, HOROVOD_NOTE)),
    }


@dataclasses.dataclass
class Backend:
    """How a job is spread.

    Attributes:
        name: the registry name (``"mirrored"``, ``"horovod"``, ...).
        strategy: the ``tf.distribute.Strategy`` whose scope builds the model (the default strategy for
            Horovod, which spreads work without one).
        num_replicas_in_sync: replicas that contribute to one optimizer step, over all processes. The global
            batch is ``per_replica_batch * num_replicas_in_sync``.
        num_workers: processes that hold replicas (MWMS workers, Horovod ranks; 1 otherwise).
        worker_index: this process's index among them.
        is_chief: this process writes checkpoints, TensorBoard logs and the summary.
        uses_keras_fit: False for parameter_server, which runs tfaccel's ClusterCoordinator loop.
        coordinator: the ``ClusterCoordinator`` for parameter_server, else None.
        reason: why this backend was chosen (filled by "auto" resolution).
        supports_jit: whether XLA jit compilation can work under this backend (with the reason in
            ``jit_note`` when it cannot).
        notes: things the plan should state about this backend (e.g. the peer timeouts of multi_worker).
    """

    name: str
    strategy: Any
    num_replicas_in_sync: int = 1
    num_workers: int = 1
    worker_index: int = 0
    is_chief: bool = True
    uses_keras_fit: bool = True
    coordinator: Any = None
    reason: str = ""
    supports_jit: bool = True
    jit_note: str = ""
    notes: Tuple[str, ...] = ()  # lines the plan states (e.g. multi_worker's peer timeouts, issue 9)
    # Hooks for backends that spread work outside tf.distribute (Horovod); identity / empty by default.
    wrap_optimizer: Callable[[Any], Any] = lambda optimizer: optimizer
    extra_callbacks: Callable[[], List[Any]] = lambda: []
    # Callbacks that must run after the user's per-batch callbacks (Horovod: every rank stops at the same step).
    batch_sync_callbacks: Callable[[], List[Any]] = lambda: []
    # Processes that agree without tf.distribute (Horovod): rank 0's value for every rank.
    broadcast: Optional[Callable[[Any, str], Any]] = None
    # (the backup this process read, a function that reads it again) -> the backup every process resumes from (the
    # chief's / rank 0's: multi_worker, Horovod); identity for one process.
    agree_on_backup: Callable[[Any, Callable[[], Any]], Any] = lambda state, reread: state
    # value -> its sum over the processes, each counted once (one all-reduce: Horovod's; multi_worker's,
    # tfaccel.strategies.process_sum). None: one built here from the strategy where one is needed.
    sum_over_processes: Optional[Callable[[Any], Any]] = None
    # The backend's own optimizer-state sharding (Horovod): (model, backup_dir=, checkpoint_dir=) -> the plan's line,
    # swapping the optimizer's class in place. None: tf.distribute's (tfaccel.train.zero).
    shard_optimizer: Optional[Callable[..., str]] = None
    # (details key, line) for what wrap_optimizer and extra_callbacks change on the user's model.
    optimizer_change: Tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.supports_jit and not self.jit_note:
            self.jit_note = f"strategy {self.name!r} does not support XLA"

    @property
    def traits(self) -> Traits:
        """What differs under this strategy (:class:`Traits`; the defaults for a strategy a user registered)."""
        return _builtin_traits().get(self.name, Traits())

    def describe(self, *, quoted: bool = False, prefix: str = "strategy ") -> str:
        """``strategy mirrored`` (``strategy 'mirrored'`` quoted; ``mirrored`` with no prefix), for messages."""
        return prefix + (repr(self.name) if quoted else self.name)

    def keras_multi_step_fallback(self) -> Optional[Tuple[str, str]]:
        """(why Keras' own train function runs one step per call here, the warning when more were asked for);
        None where Keras' multi-step train function works."""
        issue = self.traits.keras_multi_step_issue
        if not issue:
            return None
        return f"{self.name}: {issue}", f"cannot work under {self.name} ({issue}); using 1"

    def plan_fields(self) -> Dict[str, Any]:
        """What the plan records of this backend: ``strategy`` (the registry name), its reason, the layout."""
        return dict(strategy=self.name, strategy_reason=self.reason, num_replicas=int(self.num_replicas_in_sync),
                    num_workers=int(self.num_workers), worker_index=int(self.worker_index),
                    is_chief=bool(self.is_chief))

    def scope(self) -> ContextManager:
        """The context in which the model and optimizer must be built: the strategy's scope, or none for TensorFlow's
        default strategy (entering its scope changes nothing for the model but makes TensorFlow refuse a strategy of
        the user's own entered inside it, "Mixing different tf.distribute.Strategy objects", which plain Keras
        allows)."""
        if not tf.distribute.has_strategy() and self.strategy is tf.distribute.get_strategy():
            return contextlib.nullcontext()
        return self.strategy.scope()

    @property
    def input_shard(self) -> Tuple[int, int]:
        """(number of input pipelines, this pipeline's id) for sharding data by hand (Horovod ranks)."""
        return self.num_workers, self.worker_index
