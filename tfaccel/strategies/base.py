"""The Backend: what compile_and_fit needs to know about how a job is spread.

A registry entry (see ``tfaccel.strategies.registry``) turns a name plus options into a ``Backend``.
``get_strategy(name)`` returns ``backend.strategy`` (a ``tf.distribute.Strategy``) for users who only
want that; ``compile_and_fit`` uses the whole ``Backend``.
"""

import dataclasses
from typing import Any, Callable, ContextManager, List, Tuple


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

    def scope(self) -> ContextManager:
        """The context in which the model and optimizer must be built."""
        return self.strategy.scope()

    @property
    def input_shard(self) -> Tuple[int, int]:
        """(number of input pipelines, this pipeline's id) for sharding data by hand (Horovod ranks)."""
        return self.num_workers, self.worker_index
