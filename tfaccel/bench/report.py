"""The lines ``tfaccel bench`` prints and the PNG it draws: every figure against its target."""

import os
from typing import Any, Dict, List, Optional, Tuple

from tfaccel._lazy import optional_module
from tfaccel.bench.config import TARGET_MODELS, TARGETS

__all__ = ["FIGURE_NAMES", "format_report", "plot", "pyplot", "save_figure", "target_for"]

FIGURE_NAMES: Dict[str, str] = {
    "p1": "P1 compile_and_fit / naive fit",
    "p2": "P2 compile_and_fit / best hand-tuned fit",
    "p3": "P3 compile_and_fit / hand-written whole-epoch loop (faster of XLA on/off), steady examples/s",
    "p3_time_to_train": "P3 time-to-train, the faster hand-written loop's whole call / compile_and_fit's",
    "p4_mwms": "P4 weak scaling, MultiWorkerMirrored",
    "p4_horovod": "P4 weak scaling, Horovod",
    "p4_ceiling": "P4 ceiling of this machine (2 processes that never communicate)",
    "p4_mwms_of_ceiling": "P4 MultiWorkerMirrored / ceiling",
    "p6_stream": "P6 TFRecord stream / in memory (same Keras fit loop)",
    "p6_naive_stream": "P6 naive TFRecord stream / in memory",
    "p5_precision_xla": "P5 precision+XLA auto / float32 no XLA (GPU only)",
}


def target_for(key: str, model: Optional[str] = None) -> Optional[float]:
    """The target of a figure (for a per-model figure, of that model), or None where it has none."""
    if key not in TARGETS or (model is not None and key in TARGET_MODELS and model not in TARGET_MODELS[key]):
        return None
    return TARGETS[key]


def _line(label: str, fig: Dict[str, float], target: Optional[float]) -> str:
    text = f"{label}: {fig['median']:.2f} (min {fig['min']:.2f}, max {fig['max']:.2f})"
    if target is None:
        return text
    return f"{text}; target >= {target} -> {'meets' if fig['median'] >= target else 'BELOW'}"


def format_report(report: Dict[str, Any]) -> str:
    """The lines ``tfaccel bench`` prints: every figure with its spread and target, then throughput and times."""
    lines = []
    for model, m in report.get("per_model", {}).items():
        for key in ("p1", "p2", "p3", "p3_time_to_train"):
            lines.append(_line(f"{FIGURE_NAMES[key]} [{model}]", m[key], target_for(key, model)))
    for key in ("p4_mwms", "p4_horovod", "p4_ceiling", "p4_mwms_of_ceiling", "p6_stream", "p6_naive_stream"):
        if key in report:
            lines.append(_line(FIGURE_NAMES[key], report[key], target_for(key)))
    lines += _p5_lines(report)
    if "p4_horovod_note" in report.get("scaling", {}):
        lines.append(f"P4 Horovod: {report['scaling']['p4_horovod_note']}")
    for group, part in _groups(report):
        eps = ", ".join(f"{k} {v['median']:,.0f}" for k, v in part["examples_per_sec"].items())
        ttt = ", ".join(f"{k} {v['median']:.1f}s" for k, v in part["time_to_train"].items())
        lines.append(f"  {group}: examples/s {eps}")
        lines.append(f"  {group}: time_to_train {ttt}")
        if "cpu_per_wall" in part:
            cpu = ", ".join(f"{k} {v['median']:.2f}" for k, v in part["cpu_per_wall"].items())
            lines.append(f"  {group}: CPU s per wall s (epochs 2..N) {cpu}")
    if "input_alone" in report.get("stream", {}):
        alone = ", ".join(f"{k} {v['wall_ms']:.0f} ms ({v['cpu_ms']:.0f} ms CPU)"
                          for k, v in report["stream"]["input_alone"].items())
        lines.append(f"  stream: one epoch of the input alone, no training: {alone}")
    lines.append(f"  took {report['seconds']}s; load average before/after: {report['machine'].get('loadavg_before')}"
                 f" / {report['machine'].get('loadavg_after')}")
    return "\n".join(lines)


def _p5_lines(report: Dict[str, Any]) -> List[str]:
    """P5's line: its figure and target, or why it was not measured; with the devices and what each got."""
    name, target = FIGURE_NAMES["p5_precision_xla"], target_for("p5_precision_xla")
    if "p5_precision_xla" not in report:
        return []
    if report["p5_precision_xla"] is None:
        return [f"{name}: not measured ({report.get('p5_skipped')}); target >= {target} (GPU only)"]
    lines = [_line(name, report["p5_precision_xla"], target)]
    part = report.get("precision", {})
    got = "; ".join(f"{c}: {d.get('dtype_policy')}, jit_compile {d.get('jit_compile')}"
                    for c, d in part.get("details", {}).items())
    gpus = ", ".join(g["name"] for g in part.get("devices", {}).get("gpus", [])) or "no GPU (CPU)"
    lines.append(f"  P5 {part.get('model')} {tuple(part.get('input_shape', ()))} batch {part.get('global_batch_size')}"
                 f" on {gpus}: {got}")
    if report.get("p5_note"):
        lines.append(f"  P5: {report['p5_note']}")
    return lines


def _groups(report: Dict[str, Any]) -> List[Tuple[str, Dict[str, Any]]]:
    groups = list(report.get("per_model", {}).items())
    groups += [(name, report[name]) for name in ("scaling", "stream", "precision") if name in report]
    return groups


def _bars(ax: Any, labels: List[str], figs: List[Dict[str, float]], targets: List[Optional[float]],
          title: str) -> None:
    medians = [f["median"] for f in figs]
    err = [[f["median"] - f["min"] for f in figs], [f["max"] - f["median"] for f in figs]]
    colors = ["tab:gray" if t is None else ("tab:green" if m >= t else "tab:orange") for m, t in zip(medians, targets)]
    ax.bar(range(len(labels)), medians, yerr=err, color=colors, capsize=5)
    for i, t in enumerate(targets):
        if t is not None:
            ax.hlines(t, i - 0.4, i + 0.4, colors="red", linestyles="--")
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylim(0, max([1.1] + [f["max"] * 1.15 for f in figs] + [t * 1.15 for t in targets if t is not None]))
    ax.set_title(title, fontsize=9)


def plot(report: Dict[str, Any], path: str) -> None:
    """Draws every figure's median with its min-max range against its target (red dashes), and time_to_train."""
    fig, axes = pyplot().subplots(2, 3, figsize=(14, 8))
    models = list(report.get("per_model", {}))
    titles = {"p1": "P1 compile_and_fit / naive fit", "p2": "P2 compile_and_fit / best hand-tuned fit",
              "p3": "P3 compile_and_fit / hand-written loop"}
    for ax, key in zip(axes[0], ("p1", "p2", "p3")):
        _bars(ax, models, [report["per_model"][m][key] for m in models], [target_for(key, m) for m in models],
              titles[key])
    p4 = [k for k in ("p4_mwms", "p4_horovod", "p4_ceiling", "p4_mwms_of_ceiling") if k in report]
    _bars(axes[1][0], p4, [report[k] for k in p4], [target_for(k) for k in p4], "P4 weak scaling (2 workers)")
    p6 = [k for k in ("p6_stream", "p6_naive_stream", "p5_precision_xla") if report.get(k) is not None]
    _bars(axes[1][1], p6, [report[k] for k in p6], [target_for(k) for k in p6],
          "P6 streaming input / in memory; P5 precision+XLA auto / float32 (GPU only)")
    if "p5_precision_xla" in report and report["p5_precision_xla"] is None:
        axes[1][1].text(0.02, 0.95, f"p5_precision_xla: not measured (target {target_for('p5_precision_xla')}, "
                        "GPU only)", transform=axes[1][1].transAxes, fontsize=7, va="top")
    names = [f"{g}:{c}" for g, part in report.get("time_to_train", {}).items() for c in part]
    values = [v["median"] for part in report.get("time_to_train", {}).values() for v in part.values()]
    axes[1][2].barh(range(len(names)), values, color="tab:blue")
    axes[1][2].set_yticks(range(len(names)))
    axes[1][2].set_yticklabels(names, fontsize=6)
    axes[1][2].invert_yaxis()
    axes[1][2].set_title("time_to_train, seconds (median; whole call)", fontsize=9)
    load = report["machine"].get("loadavg_before")
    fig.suptitle(f"tfaccel bench on {report['machine']['cpus']} CPUs, TF {report['versions']['tensorflow']} "
                 f"(green: meets target, orange: below, red dashes: target; load {load})", fontsize=10)
    save_figure(fig, path)


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (matplotlib is the optional ``bench`` extra)."""
    optional_module("matplotlib").use("Agg")
    return optional_module("matplotlib.pyplot")


def save_figure(fig: Any, path: str) -> None:
    """Lays out and writes a bench figure (PNG at 100 dpi, the folder made), then closes it."""
    plt = pyplot()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
