"""The callback every Keras-fit job trains with: each epoch's seconds and the steps it ran."""

import time
from typing import Dict, List, Optional

import keras

__all__ = ["Throughput"]


class Throughput(keras.callbacks.Callback):
    """The callback that times epochs; the first epoch (tracing, XLA compilation) is reported apart."""

    def __init__(self, *, examples_per_step: int) -> None:
        super().__init__()
        self.examples_per_step = examples_per_step
        self.epoch_seconds: List[float] = []
        self.epoch_steps: List[int] = []
        self._t0 = 0.0
        # this epoch's steps as Keras numbers them, its last batch number, and the one before it (-1: none)
        self._steps, self._last_batch, self._batch_before = 0, -1, -1
        self._iterations: Optional[int] = None  # the optimizer's step counter when the epoch began

    def on_epoch_begin(self, epoch: int, logs: Optional[Dict] = None) -> None:
        self._t0 = time.perf_counter()
        self._steps, self._last_batch, self._batch_before = 0, -1, -1
        self._iterations = self._optimizer_iterations()

    def on_train_batch_end(self, batch: int, logs: Optional[Dict] = None) -> None:
        # Keras numbers a call of several steps by its last step, also where the epoch ends inside it
        self._steps = min(batch + 1, self.params.get("steps") or batch + 1)
        self._batch_before, self._last_batch = self._last_batch, batch

    def on_epoch_end(self, epoch: int, logs: Optional[Dict] = None) -> None:
        self.epoch_seconds.append(time.perf_counter() - self._t0)
        self.epoch_steps.append(self._steps_run())

    def _optimizer_iterations(self) -> Optional[int]:
        optimizer = getattr(self.model, "optimizer", None)
        iterations = getattr(optimizer, "iterations", None)
        return None if iterations is None else int(iterations.numpy())

    def _steps_run(self) -> int:
        """The epoch's steps. Keras' batch numbers alone cannot say how many steps its last call of several ran: a
        call ends early where the data ends (batch numbers run ahead), and past ``steps_per_epoch`` where the data
        goes on (a compiled ``steps_per_execution`` of 3 with ``steps_per_epoch=2`` runs 3). The optimizer's step
        counter says which, where it moved by one per step: at least one step past the call before the last, at
        most the last batch number + 1."""
        before, after = self._iterations, self._optimizer_iterations()
        ran = None if before is None or after is None else after - before
        fewest = min(self._steps, self._batch_before + 2)
        return ran if ran is not None and fewest <= ran <= self._last_batch + 1 else self._steps

    def examples_per_sec(self) -> float:
        """Examples per second over the epochs after the first (all of them when only one ran)."""
        secs, steps = self.epoch_seconds, self.epoch_steps
        if len(secs) > 1:  # leave out the first epoch: it pays for tracing and compilation
            secs, steps = secs[1:], steps[1:]
        total = sum(secs)
        return float(sum(steps) * self.examples_per_step / total) if total > 0 else 0.0
