"""The one timing helper every contender of ``tfaccel bench`` goes through.

A contender is a function ``train(timer) -> details`` that builds its model, trains it for ``epochs`` epochs in
ONE call and lets ``timer`` see every epoch: Keras' ``fit`` (and so ``tfaccel.fit`` / ``compile_and_fit``, whose
compiled loop calls epoch-level callbacks too) takes it as a callback; a hand-written loop calls its
``on_epoch_begin`` / ``on_epoch_end`` itself. :meth:`Stopwatch.time` runs the contender and reads two figures:

* ``examples_per_sec``: examples of epochs 2..N over the wall time from the beginning of epoch 2 to the end of
  epoch N (the first epoch pays for tracing and XLA compilation);
* ``time_to_train``: the wall time of the whole call, model building, tracing and compilation included.

``on_epoch_end`` reads the epoch's logs back as Python floats, so an epoch's time is its work's time whatever
the loop (Keras may hand over tensors that are still being computed).
"""

import dataclasses
import time
from typing import Any, Callable, Dict, List, Optional

import keras

from tfaccel.bench.config import round_order
from tfaccel.errors import ConfigError
from tfaccel.log import get_logger

__all__ = ["EpochTimer", "Timing", "Stopwatch", "run_rounds"]


class EpochTimer(keras.callbacks.Callback):
    """Records the wall-clock begin and end of every epoch; epoch-level hooks only, so it never keeps tfaccel from
    choosing its compiled loop."""

    def __init__(self) -> None:
        super().__init__()
        self.begins: List[float] = []
        self.ends: List[float] = []
        self.cpu: List[float] = []  # this process's CPU seconds at each epoch begin and end

    def on_epoch_begin(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self.cpu.append(time.process_time())
        self.begins.append(time.perf_counter())

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        for value in (logs or {}).values():
            float(value)  # waits for the device: the epoch's work is done when it ends
        self.ends.append(time.perf_counter())
        self.cpu.append(time.process_time())


@dataclasses.dataclass(frozen=True)
class Timing:
    """One contender's run, as :meth:`Stopwatch.time` measured it.

    Attributes:
        name: the contender's name.
        examples_per_sec: examples of epochs 2..N / (end of epoch N - beginning of epoch 2).
        time_to_train: seconds of the whole call (build, tracing, compilation, every epoch).
        cpu_per_wall: CPU seconds of this process over wall seconds in the window (epochs 2..N): 2.0 means two
            cores busy the whole time; well below the cores there are means waiting (input, other processes).
        epoch_seconds: each epoch's own seconds, the first one included.
        details: what the contender returned (e.g. the loop tfaccel chose).
    """

    name: str
    examples_per_sec: float
    time_to_train: float
    cpu_per_wall: float
    epoch_seconds: List[float]
    details: Dict[str, Any]


class Stopwatch:
    """Times contenders one way, and remembers which it timed (``timed``: names in the order they ran)."""

    def __init__(self) -> None:
        self.timed: List[str] = []

    def time(self, name: str, train: Callable[[Any], Optional[Dict[str, Any]]], *, examples_per_epoch: int,
             epochs: int) -> Timing:
        """Runs ``train(timer)`` once and measures it.

        Args:
            name: the contender's name (recorded in ``timed``).
            train: trains ``epochs`` epochs in one call, ``timer`` seeing every epoch; returns details or None.
            examples_per_epoch: examples one epoch trains on.
            epochs: epochs ``train`` runs; at least 2 (epoch 1 is left out of the throughput).

        Returns:
            The :class:`Timing`.

        Raises:
            ConfigError: ``epochs`` < 2, or ``train`` did not report ``epochs`` epochs to the timer.
        """
        if epochs < 2:
            raise ConfigError(f"bench: a contender needs epochs >= 2 (epoch 1 pays for tracing and is left out); "
                              f"received epochs={epochs}")
        timer = EpochTimer()
        start = time.perf_counter()
        details = train(timer) or {}
        total = time.perf_counter() - start
        if len(timer.begins) != epochs or len(timer.ends) != epochs:
            raise ConfigError(f"bench: contender {name!r} reported {len(timer.begins)} epoch begins and "
                              f"{len(timer.ends)} ends to the timer, not {epochs}; pass the timer as a callback "
                              "(or call its on_epoch_begin/on_epoch_end around every epoch)")
        window = timer.ends[-1] - timer.begins[1]
        self.timed.append(name)
        cpu = timer.cpu[-1] - timer.cpu[2]  # [begin 1, end 1, begin 2, ...]: from the beginning of epoch 2
        return Timing(name=name, examples_per_sec=(epochs - 1) * examples_per_epoch / window, time_to_train=total,
                      cpu_per_wall=cpu / window,
                      epoch_seconds=[e - b for b, e in zip(timer.begins, timer.ends)], details=dict(details))


def run_rounds(contenders: Dict[str, Callable[[Any], Dict[str, Any]]], *, stopwatch: "Stopwatch", config: Any,
               group: str, examples_per_epoch: int) -> List[Dict[str, Any]]:
    """Every contender once per round (``config.repeats`` rounds, ``config.epochs`` epochs each), in each round's
    seeded random order, all timed by ``stopwatch``.

    Args:
        contenders: ``{name: train(timer) -> details}``.
        stopwatch: the bench's one :class:`Stopwatch`.
        config: the ``BenchConfig`` (repeats, epochs, seed).
        group: what the rounds measure (a model name, ``"stream"``, ``"precision"``): part of the order's seed.
        examples_per_epoch: examples one epoch of every contender trains.

    Returns:
        One ``{"order": [...], "timings": {name: Timing fields}}`` per round.
    """
    rounds: List[Dict[str, Any]] = []
    for r in range(config.repeats):
        order = round_order(list(contenders), seed=config.seed, group=group, round_index=r)
        timings = {c: stopwatch.time(c, contenders[c], examples_per_epoch=examples_per_epoch, epochs=config.epochs)
                   for c in order}
        rounds.append({"order": order, "timings": {c: vars(t) for c, t in timings.items()}})
        get_logger().info("bench %s round %d: %s", group, r + 1,
                          ", ".join(f"{c} {timings[c].examples_per_sec:,.0f} ex/s" for c in order))
    return rounds
