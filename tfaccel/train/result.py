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
        examples_per_sec: training throughput, leaving out the first epoch when there are several
            (``details["examples_per_sec_over"]`` says over which epochs).
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
        """One short line a person reads: steps and seconds, the throughput with the epochs it is measured over,
        the last epoch's metrics, and the plan in brief (``plan.summary()`` and ``details`` say why).

        Example: ``trained 115 steps in 4.4s; 11,734 examples/s over epochs 2-5, the first left out (it traces and
        compiles); loss=0.2198, val_accuracy=0.9554; multi_worker x2 replicas, float32, XLA off, multi_step loop``.
        """
        last = {k: v[-1] for k, v in self.history.items() if v}
        metrics = ", ".join(f"{k}={v:.4g}" for k, v in last.items())
        over = self.details.get("examples_per_sec_over")
        brief = (f"{self.plan.strategy} x{self.plan.num_replicas} replica{'s' if self.plan.num_replicas != 1 else ''}, "
                 f"{self.plan.precision}, XLA {'on' if self.plan.jit_compile else 'off'}")
        if self.details.get("loop_name"):
            brief += f", {self.details['loop_name']} loop"
        rate = str(self.details.get("learning_rate", ""))
        if rate and not rate.startswith("learning rate as compiled"):
            brief += f", learning rate {rate}"
        return (f"trained {self.steps} steps in {self.seconds:.1f}s; {self.examples_per_sec:,.0f} examples/s"
                f"{f' over {over}' if over else ''}; {metrics}; {brief}")
