"""``tfaccel bench --suite real``: plain ``model.fit`` against ``tfaccel.fit`` on the real models, per path.

For every model of :mod:`tfaccel.real_suite` (at ``config.real_size``) and every path (``default``; ``mirrored``
over 2 virtual CPUs; ``multi_worker`` with 2 worker processes on loopback), each contender trains the model's job
in a fresh process (:mod:`tfaccel.bench.real_worker`, timed there by the one Stopwatch), in a seeded random order
per round. Per row: ``time_to_train`` and steady ``examples_per_sec`` (epochs 2..N) of each contender as
``{"median", "min", "max"}``, and the ratios ``time_to_train_ratio`` (plain / tfaccel: above 1, tfaccel is faster)
and ``steady_ratio`` (tfaccel / plain). Plain Keras cannot run multi_worker at all (keras-team/keras#20585): that
row has tfaccel's figures and ``keras`` says so instead of a ratio. On the ``default`` path the limit contenders
(``limit_xla`` / ``limit_noxla``: a hand-written whole-epoch ``tf.while_loop`` calling the model's own
``train_step``, :mod:`tfaccel.bench.real_worker`) run too: ``limit`` is the faster one's ``time_to_train`` each round
and ``limit_ratio`` = limit / tfaccel (1: tfaccel trains as fast as the hand-written loop).
"""

import os
import subprocess
import sys
from typing import Any, Dict, List

from tfaccel.bench.config import BenchConfig, contender_rows, last_json, round_order, summary
from tfaccel.bench.real_zero_run import ZERO_PATHS
from tfaccel.bench.timing import Stopwatch
from tfaccel.errors import invalid_choice
from tfaccel.launch import run_local
from tfaccel.log import get_logger
from tfaccel.real_suite import REAL_MODEL_NAMES, SIZES, get_real_model

__all__ = ["REAL_PATHS", "REAL_LIMITS", "KERAS_MULTI_WORKER", "check_real_config", "measure_real", "format_real"]

REAL_PATHS = ("default", "mirrored", "multi_worker")
REAL_LIMITS = ("xla", "noxla")  # the limit contenders: limit_xla, limit_noxla
KERAS_MULTI_WORKER = ("cannot run: Keras 3 model.fit under MultiWorkerMirroredStrategy fails upstream "
                      "(keras-team/keras#20585)")


def check_real_config(config: BenchConfig) -> None:
    """Rejects unknown models, paths or sizes before anything runs.

    Raises:
        ConfigError: the first unknown value, with the valid ones.
    """
    for what, values, valid in (("--real-models", config.real_models, REAL_MODEL_NAMES),
                                ("--real-paths", config.real_paths, ZERO_PATHS if config.real_zero else REAL_PATHS),
                                ("--real-size", [config.real_size], SIZES),
                                ("--real-limits", config.real_limits, REAL_LIMITS)):
        for value in values:
            if value not in valid:
                raise invalid_choice(what, value, valid)


def _env() -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update({"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"})
    return env


def _contender(model: str, config: BenchConfig, path: str, contender: str) -> Dict[str, Any]:
    """Runs one contender's job in its own process(es); returns the chief's timing."""
    cmd = [sys.executable, "-m", "tfaccel.bench.real_worker", model, config.real_size, path, contender]
    if path == "multi_worker":
        result = run_local(cmd, workers=2, timeout=config.real_timeout, env=_env(), echo=False)
        if result.returncode != 0:
            raise RuntimeError(f"bench real {model} {path} {contender}: exit {result.returncode}")
        return last_json(result.tasks[0].stdout)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=config.real_timeout, env=_env())
    if proc.returncode != 0:
        raise RuntimeError(f"bench real {model} {path} {contender} failed:\n{proc.stderr[-1500:]}")
    return last_json(proc.stdout)


def _row(model: str, path: str, config: BenchConfig, stopwatch: Stopwatch) -> Dict[str, Any]:
    limits = [f"limit_{name}" for name in config.real_limits] if path == "default" else []
    contenders = (["tfaccel"] if path == "multi_worker" else ["keras", "tfaccel"]) + limits
    rounds: List[Dict[str, Any]] = []
    for r in range(config.repeats):
        order = round_order(contenders, seed=config.seed, group=f"real:{model}:{path}", round_index=r)
        timings = {}
        for name in order:
            outcome = _contender(model, config, path, name)
            stopwatch.timed.extend(f"{model}:{path}:{t}" for t in outcome["timed"])
            timings[name] = {k: outcome[k] for k in ("examples_per_sec", "time_to_train", "epoch_seconds", "details")}
        rounds.append({"order": order, "timings": timings})
        get_logger().info("bench real %s %s round %d: %s", model, path, r + 1, ", ".join(
            f"{c} {t['time_to_train']:.1f}s, {t['examples_per_sec']:,.0f} ex/s" for c, t in timings.items()))
    row = {"time_to_train": contender_rows(rounds, "time_to_train"),
           "examples_per_sec": contender_rows(rounds, "examples_per_sec"), "order": [r["order"] for r in rounds],
           "details": {c: t["details"] for c, t in rounds[-1]["timings"].items()}}
    if "keras" in contenders:
        t = [r["timings"] for r in rounds]
        row["time_to_train_ratio"] = summary([x["keras"]["time_to_train"] / x["tfaccel"]["time_to_train"] for x in t])
        row["steady_ratio"] = summary([x["tfaccel"]["examples_per_sec"] / x["keras"]["examples_per_sec"] for x in t])
    else:
        row["keras"] = KERAS_MULTI_WORKER
    if limits:
        t = [r["timings"] for r in rounds]
        best = [min(x[c]["time_to_train"] for c in limits) for x in t]
        row["limit"] = summary(best)
        row["limit_ratio"] = summary([b / x["tfaccel"]["time_to_train"] for b, x in zip(best, t)])
    return row


def measure_real(config: BenchConfig, stopwatch: Stopwatch) -> Dict[str, Any]:
    """Every model of ``config.real_models`` on every path of ``config.real_paths``, ``config.repeats`` rounds.

    Returns:
        ``{"size": ..., "jobs": {model: {examples, batch_size, epochs}}, "rows": {model: {path: row}}}``.
    """
    check_real_config(config)
    jobs = {m: get_real_model(m).job(config.real_size) for m in config.real_models}
    return {"size": config.real_size,
            "jobs": {m: {"examples": j.examples, "batch_size": j.batch_size, "epochs": j.epochs}
                     for m, j in jobs.items()},
            "rows": {m: {p: _row(m, p, config, stopwatch) for p in config.real_paths} for m in config.real_models}}


def format_real(report: Dict[str, Any]) -> str:
    """One line per model and path: time_to_train plain / tfaccel and the steady ratio (medians, min-max)."""
    real = report["real"]
    lines = [f"tfaccel bench --suite real ({real['size']} jobs; median [min-max] of {report['config']['repeats']} "
             "rounds; time_to_train ratio = plain / tfaccel, steady = tfaccel / plain examples/s; limit = the faster "
             "hand-written whole-epoch loop, XLA on or off, its time_to_train / tfaccel's)"]
    for model, paths in real["rows"].items():
        job = real["jobs"][model]
        for path, row in paths.items():
            tf_time = row["time_to_train"]["tfaccel"]
            head = f"  {model} ({job['examples']} ex., batch {job['batch_size']}, {job['epochs']} epochs) {path}:"
            if "keras" in row:
                lines.append(f"{head} tfaccel {tf_time['median']:.1f}s; plain Keras {row['keras']}")
                continue
            ratio, steady = row["time_to_train_ratio"], row["steady_ratio"]
            line = (f"{head} plain {row['time_to_train']['keras']['median']:.1f}s / tfaccel "
                    f"{tf_time['median']:.1f}s = {ratio['median']:.2f} [{ratio['min']:.2f}-{ratio['max']:.2f}], "
                    f"steady {steady['median']:.2f} [{steady['min']:.2f}-{steady['max']:.2f}]")
            if "limit" in row:
                share = row["limit_ratio"]
                line += (f"; limit {row['limit']['median']:.1f}s, tfaccel at {share['median']:.2f} "
                         f"[{share['min']:.2f}-{share['max']:.2f}] of it")
            lines.append(line)
    lines.append(f"  took {report['seconds']}s; load average before/after: {report['machine'].get('loadavg_before')}"
                 f" / {report['machine'].get('loadavg_after')}")
    return "\n".join(lines)
