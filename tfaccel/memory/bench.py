"""The memory benchmark behind scripts/memory_bench.py: recomputation's saving and cost, and estimate vs measured.

Everything is measured on the CPU in child processes (:func:`tfaccel.memory.measure.measure_cpu_step`), one at a
time, the contenders (no recompute, ``"auto"``, ``"all"``) one after the other in the same run. The peak
activation memory of a configuration is taken *differentially*: the peak at the batch minus the peak at a small
batch, scaled to the whole batch (activations grow with the batch; variables, optimizer slots, TensorFlow's own
memory and the traced graphs do not), from TensorFlow's CPU allocator peak and from the process's peak RSS.
"""

import statistics
from typing import Any, Dict, List, Optional, Sequence, Tuple

from tfaccel.errors import ConfigError
from tfaccel.log import get_logger
from tfaccel.memory.estimate import estimate_memory
from tfaccel.memory.measure import measure_cpu_step, time_side_by_side

__all__ = ["MODES", "recompute_benchmark", "timing_benchmark", "estimate_benchmark", "format_bench"]

MODES = ("plain", "auto", "all")  # no recompute, recompute("auto"), recompute("all")
_PEAKS = ("allocator_peak", "process_peak")


def _require_allocator_peak(result: Dict[str, Any]) -> Dict[str, Any]:
    """The bench compares allocator peaks: a child that could not read them is an error that says why."""
    if result.get("allocator_peak") is None:
        raise ConfigError(f"memory bench: the measuring child read no CPU allocator peak: "
                          f"{result.get('allocator_peak_unavailable')}")
    return result


def _differential(big: Dict[str, Any], small: Dict[str, Any], key: str, batch: int, small_batch: int) -> float:
    return (big[key] - small[key]) * batch / float(batch - small_batch)


def recompute_benchmark(model: str, *, batch_size: int, small_batch: int = 2,
                        input_shape: Optional[Sequence[int]] = None, steps: int = 2) -> Dict[str, Any]:
    """Measures peak activation memory and step time without recompute and with ``"auto"`` and ``"all"``.

    Returns:
        ``{"activation_bytes": {peak kind: {mode: bytes}}, "activation_reduction": {peak kind: {mode: fraction}},
        "step_seconds": {mode: median}, "step_time_increase": {mode: fraction}, "runs": {...}, ...}``.
    """
    runs: Dict[Tuple[str, int], Dict[str, Any]] = {}
    for batch in (batch_size, small_batch):
        for mode in MODES:
            runs[(mode, batch)] = _require_allocator_peak(measure_cpu_step(
                model, batch_size=batch, input_shape=input_shape, steps=steps,
                recompute=None if mode == "plain" else mode))
            get_logger().info("memory bench: %s batch %d %s: %s", model, batch, mode, runs[(mode, batch)])
    act = {key: {m: _differential(runs[(m, batch_size)], runs[(m, small_batch)], key, batch_size, small_batch)
                 for m in MODES} for key in _PEAKS}
    step = {m: statistics.median(runs[(m, batch_size)]["step_seconds"]) for m in MODES}
    return {"model": model, "batch_size": batch_size, "small_batch": small_batch,
            "input_shape": list(input_shape or []), "activation_bytes": act, "step_seconds": step,
            "activation_reduction": {key: {m: 1.0 - act[key][m] / act[key]["plain"] for m in MODES[1:]}
                                     for key in _PEAKS},
            "step_time_increase": {m: step[m] / step["plain"] - 1.0 for m in MODES[1:]},
            "runs": {f"{m}@{b}": r for (m, b), r in runs.items()}}


def timing_benchmark(model: str, *, batch_size: int, input_shape: Optional[Sequence[int]] = None,
                     steps: int = 6) -> Dict[str, Any]:
    """Step time of every mode, measured side by side in one process (steps interleaved): the fair comparison on
    a loaded machine. Returns ``{"step_seconds": {mode: median}, "step_time_increase": {mode: fraction}}``."""
    times = time_side_by_side(model, batch_size=batch_size, input_shape=input_shape, steps=steps,
                              recompute=[None if m == "plain" else m for m in MODES])
    median = {m: statistics.median(times["None" if m == "plain" else m]) for m in MODES}
    get_logger().info("memory bench: side-by-side step times %s", times)
    return {"step_seconds": median, "step_time_increase": {m: median[m] / median["plain"] - 1.0 for m in MODES[1:]},
            "all_step_seconds": times, "steps": steps}


def estimate_benchmark(cases: Sequence[Tuple[str, Optional[Sequence[int]], int]],
                       measured: Optional[Dict[Tuple[str, int], Dict[str, Any]]] = None) -> List[Dict[str, Any]]:
    """For each (model, input_shape, batch): both estimated peaks vs the measured peaks of a fresh child process.

    The device (allocator) estimate is held against TensorFlow's CPU allocator peak; the process estimate against
    the child's VmHWM over its whole life (glibc's default malloc settings, as in a user's process). ``measured``
    maps (model, batch) to a :func:`measure_cpu_step` result to reuse instead of measuring.
    """
    rows = []
    for model, shape, batch in cases:
        meas = _require_allocator_peak((measured or {}).get((model, batch)) or measure_cpu_step(
            model, batch_size=batch, input_shape=shape, mmap_threshold=None))
        est = estimate_memory(model, batch_size=batch, input_shape=shape, recompute=False, process_peak=True)
        rows.append({"model": model, "input_shape": list(shape or []), "batch_size": batch,
                     "estimate_bytes": est.total_bytes, "activation_bytes": est.activation_bytes,
                     "activation_bytes_base": est.activation_bytes_base, "process_base_bytes": est.process_base_bytes,
                     "process_estimate_bytes": est.process_peak_bytes,
                     "allocator_peak_bytes": meas["allocator_peak"], "process_peak_bytes": meas["process_hwm"],
                     "runtime_bytes": meas["baseline"],
                     "error_allocator": est.total_bytes / meas["allocator_peak"] - 1.0,
                     "error_process": est.process_peak_bytes / meas["process_hwm"] - 1.0})
        get_logger().info("memory bench: estimate %s", rows[-1])
    return rows


def _recompute_lines(r: Dict[str, Any]) -> List[str]:
    mib = 2.0 ** 20
    act, red = r["activation_bytes"], r["activation_reduction"]
    lines = [f"{r['model']} {tuple(r['input_shape'])} batch {r['batch_size']} | no recompute | recompute auto | "
             "recompute all |", "|---|---|---|---|"]
    for key, label in (("allocator_peak", "activations, TF allocator (MiB)"),
                       ("process_peak", "activations, process RSS (MiB)")):
        lines.append(f"| {label} | {act[key]['plain'] / mib:.0f} | "
                     + " | ".join(f"{act[key][m] / mib:.0f} ({-100 * red[key][m]:+.0f}%)" for m in MODES[1:]) + " |")
    lines.append(f"| step time (s) | {r['step_seconds']['plain']:.2f} | "
                 + " | ".join(f"{r['step_seconds'][m]:.2f} ({100 * r['step_time_increase'][m]:+.0f}%)"
                              for m in MODES[1:]) + " |")
    return lines + [""]


def format_bench(recompute: Optional[Dict[str, Any]], rows: Sequence[Dict[str, Any]],
                 timing: Optional[Dict[str, Any]] = None) -> str:
    """Markdown tables of both parts (what the README shows); ``timing`` replaces the step-time row."""
    mib = 2.0 ** 20
    if recompute and timing:
        recompute = dict(recompute, step_seconds=timing["step_seconds"],
                         step_time_increase=timing["step_time_increase"])
    lines = _recompute_lines(recompute) if recompute else []
    if timing and not recompute:
        lines += [f"side-by-side step time (s, median of {timing['steps']}): "
                  + ", ".join(f"{m} {timing['step_seconds'][m]:.2f}" for m in MODES)
                  + "; " + ", ".join(f"{m} {100 * timing['step_time_increase'][m]:+.0f}%" for m in MODES[1:]), ""]
    if rows:
        lines += ["| model | input | batch | device estimate (MiB) | TF allocator peak (MiB) | error | measured at "
                  "batch 1 (MiB) | process estimate (MiB) | process peak, VmHWM (MiB) | error |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {row['model']} | {tuple(row['input_shape'])} | {row['batch_size']} | "
                  f"{row['estimate_bytes'] / mib:.0f} | {row['allocator_peak_bytes'] / mib:.0f} | "
                  f"{100 * row['error_allocator']:+.0f}% | {row['process_base_bytes'] / mib:.0f} | "
                  f"{row['process_estimate_bytes'] / mib:.0f} | {row['process_peak_bytes'] / mib:.0f} | "
                  f"{100 * row['error_process']:+.0f}% |" for row in rows]
    return "\n".join(lines)
