"""The training loops ``tfaccel.fit`` chooses from, in order: the first whose ``blockers`` are empty runs the job.

Each loop is a :class:`tfaccel.train.loops.base.Loop` in a module of its own: ``blockers(ctx)`` says why it
cannot train this job exactly like Keras ``fit``, ``steps_per_execution(ctx)`` where that applies,
``describe(ctx, rejected)`` the plan's line, ``run(ctx)`` trains. The chosen loop's line is
``FitResult.details["loop"]``; every loop tried before it, with its reasons, is in ``details["loops_rejected"]``.

Adding a loop is one new module and one entry in ``LOOPS``::

    # tfaccel/train/loops/my_loop.py
    class MyLoop(Loop):
        name, own = "my_loop", True
        def blockers(self, ctx): return [] if ctx.data.kind == "arrays" else ["data is not arrays"]
        def describe(self, ctx, rejected): return "my loop"
        def run(self, ctx): ...

    LOOPS = (CoordinatorLoop(), MyLoop(), MultiStepLoop(), CompiledLoop(), KerasFitLoop())
"""

from typing import Dict, List, Tuple

from tfaccel.train.fit_context import FitContext
from tfaccel.train.loops.base import Loop
from tfaccel.train.loops.compiled import CompiledLoop
from tfaccel.train.loops.coordinator import CoordinatorLoop
from tfaccel.train.loops.keras_fit import KerasFitLoop
from tfaccel.train.loops.multi_step import MultiStepLoop


__all__ = ["LOOPS", "Loop", "choose"]

LOOPS: Tuple[Loop, ...] = (CoordinatorLoop(), MultiStepLoop(), CompiledLoop(), KerasFitLoop())


def choose(ctx: "FitContext") -> Tuple[Loop, str, Dict[str, List[str]]]:
    """The first loop in ``LOOPS`` that can train this job exactly like Keras ``fit``.

    ``loop="keras"`` rules out tfaccel's own loops; ``loop="compiled"`` makes an own loop that serves the backend
    but cannot be exact raise instead of handing the job on.

    Returns:
        (the loop, its line for the plan, ``{loop name: reasons}`` of every loop tried before it).

    Raises:
        ConfigError: the request asks for a loop that cannot run this job (the loop's own message).
    """
    rejected: List[Tuple[Loop, List[str]]] = []
    for loop in LOOPS:
        if ctx.request.loop.loop == "keras" and loop.own:
            reasons = ["loop='keras' asks for Keras fit"]
        else:
            reasons = loop.blockers(ctx)
        if not reasons:
            return loop, loop.describe(ctx, rejected), {tried.name: why for tried, why in rejected}
        rejected.append((loop, reasons))
    raise AssertionError(f"no loop can run this job: {rejected}")  # Keras fit serves every backend but the PS one

