"""The memory benchmark behind scripts/memory_bench.py: recomputation's saving and cost, and estimate vs measured.

Everything is measured on the CPU in child processes (:func:`tfaccel.memory.measure.measure_cpu_step`). The peak
activation memory of a configuration is taken *differentially*: the process peak at the batch minus the process
peak at a small batch, scaled to the whole batch (activations grow with the batch; TensorFlow's own memory, the
traced graphs and the variables do not), so the framework's fixed overhead does not dilute the comparison.
"""

import statistics
from typing import Any, Dict, List, Optional, Sequence, Tuple

from tfaccel.log import get_logger
from tfaccel.memory.estimate import estimate_memory
from tfaccel.memory.measure import measure_cpu_step

__all__ = ["recompute_benchmark", "estimate_benchmark", "format_bench"]


def _activation_bytes(big: Dict[str, Any], small: Dict[str, Any], batch: int, small_batch: int) -> float:
    return (big["process_peak"] - small["process_peak"]) * batch / float(batch - small_batch)


def recompute_benchmark(model: str, *, batch_size: int, small_batch: int = 2,
                        input_shape: Optional[Sequence[int]] = None, steps: int = 2) -> Dict[str, Any]:
    """Measures peak activation memory and step time with and without recompute("auto"), runs interleaved."""
    runs: Dict[Tuple[str, int], Dict[str, Any]] = {}
    for batch in (batch_size, small_batch):
        for mode in ("plain", "recompute"):
            runs[(mode, batch)] = measure_cpu_step(model, batch_size=batch, input_shape=input_shape, steps=steps,
                                                   recompute="auto" if mode == "recompute" else None)
            get_logger().info("memory bench: %s batch %d %s: %s", model, batch, mode, runs[(mode, batch)])
    act = {mode: _activation_bytes(runs[(mode, batch_size)], runs[(mode, small_batch)], batch_size, small_batch)
           for mode in ("plain", "recompute")}
    step = {mode: statistics.median(runs[(mode, batch_size)]["step_seconds"]) for mode in ("plain", "recompute")}
    return {"model": model, "batch_size": batch_size, "input_shape": list(input_shape or []),
            "activation_bytes": act, "step_seconds": step,
            "activation_reduction": 1.0 - act["recompute"] / act["plain"],
            "step_time_increase": step["recompute"] / step["plain"] - 1.0,
            "process_peak": {m: runs[(m, batch_size)]["process_peak"] for m in ("plain", "recompute")},
            "runs": {f"{m}@{b}": r for (m, b), r in runs.items()}}


def estimate_benchmark(cases: Sequence[Tuple[str, Optional[Sequence[int]], int]],
                       measured: Optional[Dict[Tuple[str, int], Dict[str, Any]]] = None) -> List[Dict[str, Any]]:
    """For each (model, input_shape, batch): the estimate's total vs the measured process peak of one step."""
    rows = []
    for model, shape, batch in cases:
        est = estimate_memory(model, batch_size=batch, input_shape=shape, recompute=False)
        meas = (measured or {}).get((model, batch)) or measure_cpu_step(model, batch_size=batch, input_shape=shape)
        rows.append({"model": model, "input_shape": list(shape or []), "batch_size": batch,
                     "estimate_bytes": est.total_bytes, "activation_bytes": est.activation_bytes,
                     "measured_peak_bytes": meas["process_peak"],
                     "error": est.total_bytes / meas["process_peak"] - 1.0})
        get_logger().info("memory bench: estimate %s", rows[-1])
    return rows


def format_bench(recompute: Optional[Dict[str, Any]], rows: Sequence[Dict[str, Any]]) -> str:
    """Markdown tables of both parts (what the README shows)."""
    mib = 2.0 ** 20
    lines = []
    if recompute:
        r = recompute
        lines += [f"{r['model']} {r['input_shape']} batch {r['batch_size']}: | without | with recompute | change",
                  "|---|---|---|---|",
                  f"| peak activation memory (MiB) | {r['activation_bytes']['plain'] / mib:.0f} | "
                  f"{r['activation_bytes']['recompute'] / mib:.0f} | {-100 * r['activation_reduction']:+.0f}% |",
                  f"| process peak (MiB) | {r['process_peak']['plain'] / mib:.0f} | "
                  f"{r['process_peak']['recompute'] / mib:.0f} | |",
                  f"| step time (s) | {r['step_seconds']['plain']:.2f} | {r['step_seconds']['recompute']:.2f} | "
                  f"{100 * r['step_time_increase']:+.0f}% |", ""]
    if rows:
        lines += ["| model | input | batch | estimate (MiB) | measured peak (MiB) | error |", "|---|---|---|---|---|---|"]
        lines += [f"| {row['model']} | {tuple(row['input_shape'])} | {row['batch_size']} | "
                  f"{row['estimate_bytes'] / mib:.0f} | {row['measured_peak_bytes'] / mib:.0f} | "
                  f"{100 * row['error']:+.0f}% |" for row in rows]
    return "\n".join(lines)
