"""``FitContext``: one ``fit`` call being prepared and run, as the loops read it.

It lives apart from ``tfaccel.train.context`` (which prepares it and chooses the loop) so that the loops and the
chooser both import it without importing each other.
"""

import dataclasses
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from tfaccel.train.callback_hooks import batch_hook_reasons
from tfaccel.train.data import FitData, batches_per_epoch
from tfaccel.train.phases import Phases
from tfaccel.train.request import FitRequest

if TYPE_CHECKING:
    from tfaccel.plan import Plan
    from tfaccel.strategies.base import Backend

__all__ = ["FitContext"]


@dataclasses.dataclass
class FitContext:
    """One ``fit`` call being prepared and run: what the loops read.

    Attributes:
        model: the user's compiled model. request: the checked arguments.
        plan, backend: what the model was built under. requested_jit: ``scope()``'s ``jit_compile``.
        data: the prepared data (its seed agreed by every process once the loop orders the examples).
        verbose: Keras' verbosity on this process. start_epoch, start_step: where training starts (a resume).
        resumed: whether it resumes from a backup. user_callbacks: the user's callbacks (as tfaccel runs them).
        callbacks: every callback, in Keras' order.
        named: tfaccel's own callbacks by role (``timer``, ``backup``, ``checkpoint``, ``preemption``).
        details: what goes into ``FitResult.details``.
        preemption: what stops the job at an agreed step on SIGTERM (``tfaccel.resilience.preemption``).
        xla_auto: ``jit_compile="auto"``'s per-job XLA decision on one CPU device (``tfaccel.train.xla_payback``),
            where the loop makes it; None elsewhere.
        phases: the seconds of each phase of the call (``FitResult.details["phases"]``).
    """

    model: Any
    request: FitRequest
    plan: "Plan"
    backend: "Backend"
    requested_jit: Any
    data: FitData
    verbose: int = 0
    start_epoch: int = 0
    start_step: int = 0
    resumed: bool = False
    user_callbacks: List[Any] = dataclasses.field(default_factory=list)
    callbacks: List[Any] = dataclasses.field(default_factory=list)
    named: Dict[str, Any] = dataclasses.field(default_factory=dict)
    details: Dict[str, Any] = dataclasses.field(default_factory=dict)
    preemption: Any = None
    xla_auto: Any = None
    phases: Phases = dataclasses.field(default_factory=Phases)

    @property
    def per_batch(self) -> bool:
        """Whether a user callback acts per batch (Keras calls batch hooks once per execution, not per step)."""
        return any(batch_hook_reasons(cb) for cb in self.user_callbacks)

    @property
    def batches_per_epoch(self) -> Optional[int]:
        """The batches of one epoch where known before training (``tfaccel.train.data.batches_per_epoch``)."""
        return batches_per_epoch(self.data)

    def loop_callbacks(self) -> List[Any]:
        """The callbacks for a loop that times its epochs itself (all but tfaccel's ``Throughput``)."""
        return [cb for cb in self.callbacks if cb is not self.named["timer"]]
