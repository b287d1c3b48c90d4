"""What every training loop returns, so ``tfaccel.train.api.fit`` treats the loops alike."""

import dataclasses
from typing import Dict, List


@dataclasses.dataclass
class LoopResult:
    """The outcome of one loop run.

    Attributes:
        history: Keras' history dict (``model.history.history`` under ``model.fit``): one value per epoch run.
        epoch_seconds: wall time of each epoch run, in order.
        steps: training steps (batches) actually run by this call, partial batches included.
    """

    history: Dict[str, List[float]]
    epoch_seconds: List[float]
    steps: int
