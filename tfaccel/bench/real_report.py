"""The real suite's report: its chart (``tfaccel bench --suite real --png``) and its "Real models" page
(``scripts/real_models_page.py`` renders ``docs/real_models.md`` from the bench JSON).

Both read only the JSON that :func:`tfaccel.bench.run_bench` wrote (key ``"real"``), so a page can be
rendered again from a committed JSON without running anything.
"""

import json
from typing import Any, Dict, List, Optional, Tuple

from tfaccel.bench.report import pyplot, save_figure
from tfaccel.train.xla_payback import Figures, steps_to_try

__all__ = ["auto_choice", "auto_choice_short", "merge_reports", "render_page", "render_readme_table", "plot_real"]

_PATH_TITLES = {"default": "default (one CPU device)", "mirrored": "mirrored (2 virtual CPUs)",
                "multi_worker": "multi_worker (2 processes)"}


def _range(fig: Dict[str, float], unit: str = "", digits: int = 2) -> str:
    return f"{fig['median']:.{digits}f}{unit} ({fig['min']:.{digits}f}–{fig['max']:.{digits}f})"


def _loop_choice(details: Dict[str, Any]) -> str:
    loop = str(details.get("loop") or "")
    if loop.startswith("compiled"):
        return "compiled whole-epoch loop"
    if loop.startswith("tfaccel's multi-step loop"):
        return f"multi-step loop, {loop.split(': ', 1)[1].split(' steps')[0]} steps per call"
    return loop or "?"


def _xla_reason(details: Dict[str, Any]) -> str:
    """``"XLA off: <the first clause of the plan's reason>"``."""
    xla = details.get("xla")
    why = f"XLA {'on' if details.get('jit_compile') else 'off'}"
    return why + (": " + str(xla).split("(", 1)[-1].removesuffix(")").split(";")[0] if xla else "")


def auto_choice(details: Dict[str, Any]) -> str:
    """What tfaccel's ``auto`` chose for a job and why, in a table cell, from the bench's ``details``."""
    return f"{_loop_choice(details)}; {_xla_reason(details)}{_xla_figures(details.get('xla_auto'))}".replace("|", "/")


def auto_choice_short(details: Dict[str, Any]) -> str:
    """:func:`auto_choice` in a few words (the README's table): the loop, XLA, and the one figure it turned on."""
    auto = details.get("xla_auto")
    payback = _payback(auto)
    if payback is not None:
        _, threshold, slower = payback
        assumed = " (convolutions: a slow-down assumed)" if slower is not None else ""
        xla = (f"XLA {'on' if details.get('jit_compile') else 'off'}: the job's {auto.get('expected_steps')} steps, "
               f"XLA tried only from ≥ {threshold:,}{assumed}")
        xla += "".join(f"; {event.split(' (')[0]}" for event in auto.get("events", []))
    else:
        xla = _xla_reason(details).split(' ("')[0]
    return f"{_loop_choice(details)}; {xla}".replace("|", "/")


def _payback(auto: Any) -> Optional[Tuple[Any, int, Optional[str]]]:
    """(the no-XLA ``Figures``, the remaining steps from which XLA is tried, the prior's source where it assumes a
    slow-down, else None) from a job's ``xla_auto`` details; None where nothing was measured without XLA."""
    if not isinstance(auto, dict) or not isinstance(auto.get("measured", {}).get("jit_off"), dict):
        return None

    measured = auto["measured"]["jit_off"]  # with its tracing and first-call seconds in newer reports
    off = Figures(overhead_s=measured["overhead_s"], step_s=measured["step_s"])
    threshold = auto["try_from_steps"] if "try_from_steps" in auto else steps_to_try(off)  # older reports lack it
    prior = auto.get("prior") or {}
    return off, threshold, (str(prior.get("source", "")) if prior.get("speedup", 2) <= 1 else None)


def _xla_figures(auto: Any) -> str:
    """The figures ``auto``'s XLA decision used: what it measured, and from how many steps it would try XLA."""
    payback = _payback(auto)
    if payback is None:
        return ""
    off, threshold, slower = payback
    text = (f"; measured without XLA: {off.overhead_s:.1f} s overhead + {off.step_s * 1e3:.2f} ms/step; XLA tried "
            f"only with ≥ {threshold:,} steps left{f' ({slower})' if slower else ''} (this job: "
            f"{auto.get('expected_steps')})")
    return text + "".join(f"; {event}" for event in auto.get("events", []))


def _rows(report: Dict[str, Any]) -> List[Tuple[str, str, Dict[str, Any], Dict[str, Any]]]:
    real = report["real"]
    return [(model, path, real["jobs"][model], row) for model, paths in real["rows"].items()
            for path, row in paths.items()]


def merge_reports(reports: List[Dict[str, Any]]) -> Dict[str, Any]:
    """One report from several runs of ``tfaccel bench --suite real`` (e.g. one per model), their models in order
    (a later run's (model, path) row replaces an earlier one's): the earliest to the latest date, the first run's
    load before, the last run's load after, and every run's load in ``machine["loadavg_per_run"]`` (a merged
    report's own runs are kept as they were)."""
    merged = json.loads(json.dumps(reports[0]))
    for report in reports[1:]:
        merged["real"]["jobs"].update(report["real"]["jobs"])
        for model, paths in report["real"]["rows"].items():
            merged["real"]["rows"].setdefault(model, {}).update(paths)
        merged["seconds"] = merged.get("seconds", 0) + report.get("seconds", 0)
    if len(reports) > 1:
        machine = merged["machine"]
        machine["loadavg_after"] = reports[-1]["machine"].get("loadavg_after")
        dates = sorted(d for r in reports for d in str(r["machine"].get("date", "?")).split(" to "))
        machine["date"] = dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"
        machine["loadavg_per_run"] = {name: loads for r in reports for name, loads in _run_loads(r).items()}
    return merged


def _run_loads(report: Dict[str, Any]) -> Dict[str, Any]:
    """What each run of a report measured, with its load average before / after."""
    machine = report["machine"]
    if machine.get("loadavg_per_run"):
        return dict(machine["loadavg_per_run"])
    return {_run_name(report): [machine.get("loadavg_before"), machine.get("loadavg_after")]}


def _run_name(report: Dict[str, Any]) -> str:
    """``"bert_classifier, gpt2_causal_lm (default, mirrored) on 2026-11-26 18:00 UTC"``: what one run measured."""
    rows = report["real"]["rows"]
    paths = ", ".join(dict.fromkeys(p for model_rows in rows.values() for p in model_rows))
    return f"{', '.join(rows)} ({paths}) on {report['machine'].get('date', '?')}"


def render_page(report: Dict[str, Any], *, command: str) -> str:
    """The "Real models" page (Markdown) for a bench report with a ``"real"`` key.

    Args:
        report: the bench JSON, loaded.
        command: the command that produced it (shown on the page).

    Returns:
        The page's text.
    """
    machine, versions = report["machine"], report["versions"]
    lines = ["# Real models: plain `model.fit` against `tfaccel.fit`", "",
             "<!-- generated by scripts/real_models_page.py from the bench JSON; do not edit by hand -->", "",
             f"Measured {machine.get('date', report.get('date', '?'))} on {machine.get('cpus', '?')} CPUs "
             f"({machine.get('platform', machine.get('cpu', ''))}), TensorFlow {versions['tensorflow']}, Keras "
             f"{versions['keras']}, tfaccel {versions['tfaccel']}; load average before / after: "
             f"{machine.get('loadavg_before')} / {machine.get('loadavg_after')}.", "",
             *(["Load average before / after each run: " + "; ".join(
                 f"{models}: {loads[0]} / {loads[1]}" for models, loads in machine["loadavg_per_run"].items()) + ".",
                 ""] if machine.get("loadavg_per_run") else []),
             *([] if machine.get("gpus") else [
                 "No GPU took part: every figure here is a CPU figure (why no GPU run was possible yet: "
                 "[Benchmarking](guides/benchmarking.md)).", ""]),
             f"Command: `{command}`", "",
             f"Each contender trains the job in a fresh process, {report['config']['repeats']} rounds in a seeded "
             "random order; figures are medians (min–max). **time_to_train** is the whole `fit` call (tracing and "
             "compilation included); its ratio is plain / tfaccel (above 1: tfaccel is faster). **steady** is "
             "examples/s over epochs 2..N, tfaccel / plain. tfaccel runs with every option at `auto`.", "",
             *(_LIMIT_NOTE if _has_limit(report) else []),
             "| model (job) | path | time_to_train plain | time_to_train tfaccel | ratio plain / tfaccel | steady "
             f"ratio | {'limit | tfaccel / limit | ' if _has_limit(report) else ''}what `auto` chose and why |",
             "|---|---|---|---|---|---|" + ("---|---|" if _has_limit(report) else "") + "---|"]
    for model, path, job, row in _rows(report):
        name = f"{model} ({job['examples']} ex., batch {job['batch_size']}, {job['epochs']} epochs)"
        tf_time = _range(row["time_to_train"]["tfaccel"], " s", 1)
        choice = auto_choice(row.get("details", {}).get("tfaccel", {}))
        limit = ""
        if _has_limit(report):
            limit = (f"{_range(row['limit'], ' s', 1)} | {_range(row['limit_ratio'])} | " if "limit" in row else
                     "— | — | ")
        if "keras" in row:
            lines.append(f"| {name} | {_PATH_TITLES.get(path, path)} | {row['keras']} | {tf_time} | — | — "
                         f"| {limit}{choice} |")
            continue
        lines.append(f"| {name} | {_PATH_TITLES.get(path, path)} | {_range(row['time_to_train']['keras'], ' s', 1)} "
                     f"| {tf_time} | {_range(row['time_to_train_ratio'])} | {_range(row['steady_ratio'])} "
                     f"| {limit}{choice} |")
    return "\n".join(lines) + "\n"


_LIMIT_NOTE = ["**limit** is the faster of two hand-written loops (each epoch's whole batches in one `tf.while_loop` "
               "calling the model's own `train_step`, XLA on / off), time_to_train; **tfaccel / limit** is the limit's "
               "time over tfaccel's (1: tfaccel is as fast as the hand-written loop).", ""]


def _has_limit(report: Dict[str, Any]) -> bool:
    """Whether any row of the report has the limit contender (reports before it have none)."""
    return any("limit" in row for _, _, _, row in _rows(report))


def render_readme_table(report: Dict[str, Any], *, command: str, page: str = "docs/real_models.md") -> str:
    """The README's "Real models" table (Markdown, without its markers): every row of the page in a few words,
    with the date, machine and command, and a link to the page (``page``) for the whole of it."""
    machine, versions = report["machine"], report["versions"]
    gpu = f"GPUs: {', '.join(machine['gpus'])}" if machine.get("gpus") else "no GPU"
    lines = [f"Measured {machine.get('date', '?')} on {machine.get('cpus', '?')} CPUs "
             f"({machine.get('platform', machine.get('cpu', ''))}, {gpu}), TensorFlow {versions['tensorflow']}, "
             f"Keras {versions['keras']}: `{command}`. Median of {report['config']['repeats']} rounds side by side; "
             f"ratios above 1: tfaccel is faster; min–max, each run's load and the whole of `auto`'s reasons: "
             f"[Real models]({page}).", "",
             "| model (job) | path | time_to_train plain → tfaccel | ratio | steady ratio "
             "| what `auto` chose and why |",
             "|---|---|---|---|---|---|"]
    for model, path, job, row in _rows(report):
        name = f"{model} ({job['examples']} ex. x {job['epochs']} epochs, batch {job['batch_size']})"
        tf_time = f"{row['time_to_train']['tfaccel']['median']:.1f} s"
        choice = auto_choice_short(row.get("details", {}).get("tfaccel", {}))
        if "keras" in row:
            lines.append(f"| {name} | {path} | plain Keras cannot run it → {tf_time} | — | — | {choice} |")
            continue
        lines.append(f"| {name} | {path} | {row['time_to_train']['keras']['median']:.1f} s → {tf_time} "
                     f"| {row['time_to_train_ratio']['median']:.2f} | {row['steady_ratio']['median']:.2f} "
                     f"| {choice} |")
    return "\n".join(lines) + "\n"


def plot_real(report: Dict[str, Any], path: str) -> None:
    """Bars of the time_to_train and steady ratios per model and path (median, min–max), the 1.0 line dashed."""
    rows = [r for r in _rows(report) if "keras" not in r[3]]
    labels = [f"{model}\n{path}" for model, path, _, _ in rows]
    fig, axes = pyplot().subplots(1, 2, figsize=(max(8, 1.1 * len(rows) + 4), 5))
    for ax, key, title in ((axes[0], "time_to_train_ratio", "time_to_train, plain / tfaccel"),
                           (axes[1], "steady_ratio", "steady examples/s, tfaccel / plain")):
        figs = [row[key] for _, _, _, row in rows]
        medians = [f["median"] for f in figs]
        err = [[f["median"] - f["min"] for f in figs], [f["max"] - f["median"] for f in figs]]
        ax.bar(range(len(rows)), medians, yerr=err, capsize=4,
               color=["tab:green" if m >= 1.0 else "tab:orange" for m in medians])
        ax.axhline(1.0, color="red", linestyle="--", linewidth=1)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels(labels, fontsize=7, rotation=30, ha="right")
        ax.set_title(title, fontsize=9)
    machine = report["machine"]
    fig.suptitle(f"tfaccel bench --suite real ({report['real']['size']} jobs, {report['config']['repeats']} rounds) "
                 f"on {machine.get('cpus')} CPUs, load {machine.get('loadavg_before')}", fontsize=10)
    save_figure(fig, path)
