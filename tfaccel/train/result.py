"""``FitResult``: what ``tfaccel.fit`` (and the side-car evaluator's ``fit``) hands back."""

import dataclasses
from typing import Any, Dict, List, Optional

__all__ = ["FitResult"]


@dataclasses.dataclass(frozen=True)
class FitResult:
    """What ``fit`` did.

    Attributes:
        model: the trained Keras model (the user's own object).
        history: Keras' history dict (``{"loss": [...], "val_loss": [...], ...}``), as ``model.fit`` returns it.
        plan: the ``Plan`` (strategy, precision, XLA and why).
        examples_per_sec: training throughput, leaving out the first epoch when there are several.
        seconds: wall time of the training loop.
        global_batch_size: examples per step over all replicas (None for datasets, which carry their batches).
        steps_per_epoch: steps per epoch.
        steps: training steps run by this call (after a resume or an early stop, only those that ran).
        resumed_from: ``(epoch, step)`` of the backup this run resumed from, or None.
        details: the loop and why, the data, the optimizer changes, checkpoints, backups.
    """

    model: Any
    history: Dict[str, List[float]]
    plan: Any
    examples_per_sec: float
    seconds: float
    global_batch_size: Optional[int]
    steps_per_epoch: Optional[int]
    steps: int
    resumed_from: Optional[tuple] = None
    details: Dict[str, Any] = dataclasses.field(default_factory=dict)

    def summary(self) -> str:
        """One line: steps, seconds, examples/s, the last epoch's metrics, the loop that ran and the plan."""
        last = {k: v[-1] for k, v in self.history.items() if v}
        metrics = ", ".join(f"{k}={v:.4g}" for k, v in last.items())
        return (f"trained {self.steps} steps in {self.seconds:.1f}s, {self.examples_per_sec:,.0f} examples/s; "
                f"{metrics}; loop: {self.details.get('loop', '?')}; plan: {self.plan.summary()}")
