"""Where two recorded runs of the same training part, if they do, and within which tolerance."""

import collections
import dataclasses
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from tfaccel.divergence.record import Trace

__all__ = ["Tolerance", "Part", "Verdict", "compare", "tolerance_for", "EXAMPLES"]

EXAMPLES = "examples of the global batch"
"""The quantity of a step whose runs trained on other examples (``Part.difference``: how many differ)."""


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """``|a - b| <= atol + rtol * max(|a|, |b|)``, elementwise, and why these numbers."""

    rtol: float
    atol: float
    why: str

    def close(self, a: Any, b: Any) -> bool:
        """Whether two values (numbers or arrays) are equal to rounding; NaN equals NaN, Inf equals Inf."""
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        if a.shape != b.shape:
            return False
        same = (a == b) | (np.isnan(a) & np.isnan(b))
        with np.errstate(invalid="ignore"):
            near = np.abs(a - b) <= self.atol + self.rtol * np.maximum(np.abs(a), np.abs(b))
        return bool(np.all(same | near))


def tolerance_for(dtype: str, steps: int, rtol: Optional[float] = None) -> Tolerance:
    """The default tolerance for a model whose variables are ``dtype``, over ``steps`` steps.

    N replicas sum N partial gradients where one replica sums one: the same numbers added in another order,
    which changes the last bits (float32: ~6e-8 relative per operation) and grows with each step. 1e-5 per
    step leaves room for that over a few steps; every cause in the catalogue moves values by far more.
    """
    if rtol is not None:
        return Tolerance(rtol, rtol * 1e-2, f"rtol={rtol:g} as given")
    low = dtype in ("float16", "bfloat16")
    per_step = 1e-3 if low else 1e-5
    value = min(per_step * max(steps, 1), 5e-2 if low else 1e-3)
    return Tolerance(value, value * 1e-2, f"{dtype}: summing gradients over replicas reorders additions, "
                                          f"~{per_step:g} relative per step over {steps} steps")


@dataclasses.dataclass(frozen=True)
class Part:
    """One quantity that differs between the runs at one step."""

    step: int
    quantity: str
    single: Any
    replicas: Any
    difference: float


@dataclasses.dataclass
class Verdict:
    """The comparison: ``equal`` to rounding, or the first step where the runs part and what parts there."""

    equal: bool
    tolerance: Tolerance
    steps: int
    first: Optional[Part]
    parts: List[Part]
    rows: List[Dict[str, Any]]

    def to_json(self) -> Dict[str, Any]:
        """The verdict as plain data."""
        return {"equal": self.equal, "steps": self.steps, "tolerance": dataclasses.asdict(self.tolerance),
                "first": None if self.first is None else dataclasses.asdict(self.first),
                "parts": [dataclasses.asdict(p) for p in self.parts], "rows": self.rows}


def _difference(a: Any, b: Any) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return float("inf")
    with np.errstate(invalid="ignore"):
        gap = np.abs(a - b)
    return float(np.nanmax(gap)) if gap.size and not np.all(np.isnan(gap)) else 0.0


def _scalars(single: Trace, many: Trace, step: int) -> List[Tuple[str, Any, Any]]:
    a, b = single.steps[step], many.steps[step]
    found = [(f"log {k}", a.logs.get(k), b.logs.get(k)) for k in sorted(set(a.logs) | set(b.logs))]
    found += [("gradient norm", a.grad_norm, b.grad_norm), ("optimizer iterations", a.iterations, b.iterations),
              ("loss scale", a.loss_scale, b.loss_scale), ("non-finite gradients", a.nonfinite_grads,
                                                           b.nonfinite_grads)]
    return found


def _other_examples(a: List[str], b: List[str]) -> int:
    """How many examples of one batch are not matched in the other (as multisets of example digests)."""
    left, right = collections.Counter(a), collections.Counter(b)
    return max(sum((left - right).values()), sum((right - left).values()))


def _step_parts(single: Trace, many: Trace, step: int, tol: Tolerance) -> List[Part]:
    parts = []
    seen = (single.steps[step].examples, many.steps[step].examples)
    if all(seen) and sorted(seen[0]) != sorted(seen[1]):  # first: what a run trains on explains the rest
        parts.append(Part(step, EXAMPLES, len(seen[0]), len(seen[1]), float(_other_examples(*seen))))
    for name, a, b in _scalars(single, many, step):
        if (a is None) != (b is None) or (a is not None and not tol.close(a, b)):
            parts.append(Part(step, name, a, b, _difference(a, b) if a is not None and b is not None else 0.0))
    for name, a, b in zip(single.names, single.values[step], many.values[step]):
        if not tol.close(a, b):
            parts.append(Part(step, f"variable {name}", None, None, _difference(a, b)))
    if many.steps[step].replica_spread > 0:
        parts.append(Part(step, f"replicas disagree on {many.steps[step].spread_variable}", None, None,
                          many.steps[step].replica_spread))
    return parts


def _row(single: Trace, many: Trace, step: int) -> Dict[str, Any]:
    a, b = single.steps[step], many.steps[step]
    gaps = [_difference(x, y) for x, y in zip(single.values[step], many.values[step])]
    return {"step": step, "batch_size": a.batch_size, "loss": [a.logs.get("loss"), b.logs.get("loss")],
            "grad_norm": [a.grad_norm, b.grad_norm], "max_variable_difference": max(gaps, default=0.0),
            "digest": [single.digest(step), many.digest(step)], "loss_scale": [a.loss_scale, b.loss_scale],
            "nonfinite": [a.nonfinite_grads + a.nonfinite_values, b.nonfinite_grads + b.nonfinite_values],
            "replica_spread": b.replica_spread}


def compare(single: Trace, many: Trace, tolerance: Tolerance) -> Verdict:
    """Compares the runs step by step; the verdict keeps every part of the first step where they part.

    Raises:
        ValueError: the runs have other variables or other numbers of steps.
    """
    if len(single.names) != len(many.names) or len(single.steps) != len(many.steps):
        raise ValueError(f"doctor: the runs are not comparable: {len(single.names)} vs {len(many.names)} variables, "
                         f"{len(single.steps)} vs {len(many.steps)} steps")
    rows = [_row(single, many, s) for s in range(len(single.steps))]
    for step in range(len(single.steps)):
        parts = _step_parts(single, many, step, tolerance)
        if parts:
            return Verdict(False, tolerance, len(rows), parts[0], parts, rows)
    return Verdict(True, tolerance, len(rows), None, [], rows)
