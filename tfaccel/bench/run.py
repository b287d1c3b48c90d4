"""``run_bench``: every figure of ``tfaccel bench`` measured in one report (the package doc says what each is)."""

import dataclasses
import json
import os
import platform
import sys
import time
from typing import Any, Dict, Optional

import keras
import tensorflow as tf

from tfaccel._version import __version__
from tfaccel.bench.config import TARGET_MODELS, TARGETS, BenchConfig
from tfaccel.bench.precision import check_p5_mode, measure_precision, p5_skip_reason
from tfaccel.bench.real import measure_real
from tfaccel.bench.real_zero_run import measure_real_zero
from tfaccel.bench.report import format_report, plot
from tfaccel.bench.scaling import measure_scaling
from tfaccel.bench.speed import measure_speedups
from tfaccel.bench.stream import measure_stream
from tfaccel.bench.timing import Stopwatch
from tfaccel.resilience.atomic_io import atomic_write_text

__all__ = ["BenchConfig", "TARGETS", "TARGET_MODELS", "run_bench", "format_report", "plot"]

_FIGURE_KEYS = ("median", "min", "max")


def _loadavg() -> Optional[str]:
    try:
        with open("/proc/loadavg") as fh:
            return " ".join(fh.read().split()[:3])
    except OSError:
        return None


def _machine() -> Dict[str, Any]:
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "platform": platform.platform(),
            "cpus": os.cpu_count(), "python": sys.version.split()[0],
            "gpus": [d.name for d in tf.config.list_physical_devices("GPU")], "loadavg_before": _loadavg()}


def _measure(config: BenchConfig, stopwatch: Stopwatch) -> Dict[str, Any]:
    if config.suite == "real":
        if config.real_zero:
            return {"real_zero": measure_real_zero(config)}
        return {"real": measure_real(config, stopwatch)}

    check_p5_mode(config.p5)  # before the long parts, not after them
    report: Dict[str, Any] = {"per_model": measure_speedups(config, stopwatch)}
    report["time_to_train"] = {m: part["time_to_train"] for m, part in report["per_model"].items()}
    for name, enabled, measure, keys in (
            ("scaling", config.scaling, measure_scaling, ("p4_mwms", "p4_horovod", "p4_ceiling", "p4_mwms_of_ceiling")),
            ("stream", config.stream, measure_stream, ("p6_stream", "p6_naive_stream"))):
        if enabled:
            part = measure(config, stopwatch)
            report[name] = part
            report["time_to_train"][name] = part["time_to_train"]
            report.update({k: {f: part[k][f] for f in _FIGURE_KEYS} for k in keys if k in part})
    _measure_p5(config, stopwatch, report)
    # The summary's copies without the rounds' values; each part keeps its own (P3's time-to-train is per round).
    report["time_to_train"] = {group: {contender: {f: fig[f] for f in _FIGURE_KEYS} for contender, fig in part.items()}
                               for group, part in report["time_to_train"].items()}
    return report


def _measure_p5(config: BenchConfig, stopwatch: Stopwatch, report: Dict[str, Any]) -> None:
    """P5 into ``report``: ``precision`` and ``p5_precision_xla``, or ``p5_precision_xla: None`` and ``p5_skipped``."""
    skipped = p5_skip_reason(config.p5, [d.name for d in tf.config.list_physical_devices("GPU")])
    if skipped:
        report.update({"p5_precision_xla": None, "p5_skipped": skipped})
        return
    part = measure_precision(config, stopwatch)
    report["precision"] = part
    report["time_to_train"]["precision"] = part["time_to_train"]
    report["p5_precision_xla"] = {f: part["p5_precision_xla"][f] for f in _FIGURE_KEYS}
    if "p5_note" in part:
        report["p5_note"] = part["p5_note"]


def run_bench(config: BenchConfig, *, json_path: Optional[str] = None, png_path: Optional[str] = None
              ) -> Dict[str, Any]:
    """Runs the benchmark and returns (and optionally writes) the report.

    Args:
        config: what to measure.
        json_path: write the report here as JSON. Defaults to None.
        png_path: draw every figure against its target here. Defaults to None.

    Returns:
        The report: ``per_model`` (``p1``, ``p2``, ``p3``, examples/s, order, details per model), the top-level
        ``p4_*``, ``p5_precision_xla`` and ``p6_*`` figures, ``time_to_train`` (group -> contender -> figure),
        ``timing`` (the helper and every contender it timed), ``machine`` (with the load average before and
        after), ``versions``, ``config``, ``targets``, ``seconds``.
    """
    # Every contender builds fresh tf.functions on purpose (no contender reuses another's traces); TF's
    # "triggered tf.function retracing" warning about that is noise here.
    tf.get_logger().setLevel("ERROR")
    start = time.perf_counter()
    machine = _machine()
    stopwatch = Stopwatch()
    report: Dict[str, Any] = {
        "machine": machine, "config": dataclasses.asdict(config), "targets": TARGETS,
        "target_models": {k: list(v) for k, v in TARGET_MODELS.items()},
        "versions": {"tfaccel": __version__, "tensorflow": tf.__version__, "keras": keras.__version__},
        **_measure(config, stopwatch)}
    report["timing"] = {"helper": "tfaccel.bench.timing.Stopwatch.time",
                        "window": "epochs 2..N: end of epoch N - beginning of epoch 2; time_to_train: the whole call",
                        "timed": list(stopwatch.timed)}
    machine["loadavg_after"] = _loadavg()
    report["seconds"] = round(time.perf_counter() - start, 1)
    if json_path:
        os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
        atomic_write_text(json_path, json.dumps(report, indent=2, default=str))
    if png_path:
        plot(report, png_path)
    return report
