"""What every training loop returns, so ``tfaccel.train.api.fit`` treats the loops alike."""

import dataclasses
from typing import Any, Dict, List


@dataclasses.dataclass
class LoopResult:
    """The outcome of one loop run.

    Attributes:
        history: Keras' history dict (``model.history.history`` under ``model.fit``): one value per epoch run.
        epoch_seconds: wall time of each epoch run, in order.
        steps: training steps (batches) actually run by this call, partial batches included.
        details: what the loop adds to ``FitResult.details`` (e.g. the coordinator's counters and backups).
    """

    history: Dict[str, List[float]]
    epoch_seconds: List[float]
    steps: int
    details: Dict[str, Any] = dataclasses.field(default_factory=dict)
