"""``Phases``: the wall seconds of each phase of one ``fit`` call, for ``FitResult.details["phases"]``.

A phase is timed by a ``with phases("name"):`` block; a phase entered twice adds up. What a loop measures inside
its own run (tracing, the first call, the epochs) is added with :meth:`Phases.add`.
"""

import contextlib
import time
from typing import Dict, Iterator

__all__ = ["Phases"]


class Phases:
    """Seconds per phase, in the order the phases first ran."""

    def __init__(self) -> None:
        self._seconds: Dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        """Times the block as phase ``name``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    def add(self, name: str, seconds: float) -> None:
        """Adds ``seconds`` to phase ``name``."""
        self._seconds[name] = self._seconds.get(name, 0.0) + seconds

    def as_dict(self) -> Dict[str, float]:
        """``{phase: seconds}``, rounded to the millisecond."""
        return {name: round(seconds, 3) for name, seconds in self._seconds.items()}
