"""P4: weak scaling of 2 workers x 1 thread against 1 worker x 1 thread on loopback, on a compute-bound CNN.

Each worker keeps the same per-worker batch. Every contender is a job of real processes running
``tfaccel.compile_and_fit`` with tfaccel's defaults for its strategy (loop and ``steps_per_execution`` "auto", so a
multi-step loop under ``multi_worker`` is measured as soon as tfaccel uses it); inside the job the chief times
the call with :class:`tfaccel.bench.timing.Stopwatch`, as every other contender is timed. Contenders, in a random
order each round: ``one_worker``; ``two_independent`` (two single-worker processes at once that never
communicate: what the machine itself allows); ``mwms_two_workers``; ``horovod_two_ranks`` (when Horovod is built).

``p4_mwms = mwms / (2 x one)``, ``p4_horovod`` likewise, ``p4_ceiling = two_independent / (2 x one)``, and
``p4_mwms_of_ceiling = p4_mwms / p4_ceiling``, each per round.
"""

import os
import subprocess
import sys
import tempfile
from typing import Any, Callable, Dict, List, Optional

from tfaccel._lazy import optional_module
from tfaccel.bench.config import BenchConfig, contender_rows, last_json, round_order, summary
from tfaccel.bench.timing import Stopwatch
from tfaccel.launch import run_local
from tfaccel.launch.horovod import run_horovod
from tfaccel.log import get_logger

__all__ = ["SCALING_CONTENDERS", "measure_scaling"]

SCALING_CONTENDERS = ("one_worker", "two_independent", "mwms_two_workers", "horovod_two_ranks")
_EPOCHS = 3

_SCALING_WORKER = r"""
import json, sys
import numpy as np
import tfaccel
from tfaccel.bench.timing import Stopwatch

name, n, batch, epochs, strategy = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
rng = np.random.default_rng(0)
x = rng.random((n, 32, 32, 3), dtype=np.float32)
y = rng.integers(0, 10, n).astype(np.int32)

def build():
    # Compute-bound on purpose (weak scaling measures the all-reduce's cost against the step): two 3x3
    # convolutions on 32x32x3 inputs and global pooling, ~20k parameters to all-reduce per step.
    import keras
    return keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Conv2D(32, 3, activation="relu"),
                             keras.layers.Conv2D(64, 3, activation="relu"), keras.layers.GlobalAveragePooling2D(),
                             keras.layers.Dense(10, activation="softmax")])

def train(timer):
    result = tfaccel.compile_and_fit(build, (x, y), epochs=epochs, per_replica_batch_size=batch, strategy=strategy,
        loss="sparse_categorical_crossentropy", scale_learning_rate="none", verbose=0, seed=0, callbacks=[timer])
    return {"loop": result.details.get("loop"), "steps_per_execution": result.details.get("steps_per_execution"),
            "strategy": result.plan.strategy, "replicas": result.plan.num_replicas}

stopwatch = Stopwatch()
t = stopwatch.time(name, train, examples_per_epoch=n, epochs=epochs)
print(json.dumps({"examples_per_sec": t.examples_per_sec, "time_to_train": t.time_to_train,
                  "epoch_seconds": t.epoch_seconds, "details": t.details, "timed": stopwatch.timed}))
"""


def _env() -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update({"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "2", "OMP_NUM_THREADS": "1",
                "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"})
    return env


def _argv(script: str, name: str, n: int, config: BenchConfig, strategy: str) -> List[str]:
    return [sys.executable, script, name, str(n), str(config.scaling_batch), str(_EPOCHS), strategy]


def _one_worker(script: str, config: BenchConfig) -> Dict[str, Any]:
    proc = subprocess.run(_argv(script, "one_worker", config.scaling_examples, config, "default"),
                          capture_output=True, text=True, timeout=config.scaling_timeout, env=_env())
    if proc.returncode != 0:
        raise RuntimeError(f"single-worker run failed:\n{proc.stderr[-1500:]}")
    return last_json(proc.stdout)


def _two_independent(script: str, config: BenchConfig) -> Dict[str, Any]:
    """Two unconnected single-worker processes at once: what this machine allows with no communication at all."""
    argv = _argv(script, "two_independent", config.scaling_examples, config, "default")
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
             for _ in range(2)]
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=config.scaling_timeout)
            if proc.returncode != 0:
                raise RuntimeError(f"independent run failed:\n{err[-1500:]}")
            results.append(last_json(out))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return {"examples_per_sec": sum(r["examples_per_sec"] for r in results),
            "time_to_train": max(r["time_to_train"] for r in results), "details": results[0]["details"],
            "timed": results[0]["timed"] + results[1]["timed"]}


def _mwms_two_workers(script: str, config: BenchConfig) -> Dict[str, Any]:
    cmd = _argv(script, "mwms_two_workers", 2 * config.scaling_examples, config, "multi_worker")
    result = run_local(cmd, workers=2, timeout=config.scaling_timeout, env=_env(), echo=False)
    if result.returncode != 0:
        raise RuntimeError(f"2-worker run failed (exit {result.returncode})")
    return last_json(result.tasks[0].stdout)


def _horovod_two_ranks(script: str, config: BenchConfig) -> Optional[Dict[str, Any]]:
    try:
        optional_module("horovod.tensorflow")
    except Exception:  # noqa: BLE001 - Horovod not built here: the figure is reported as not measured
        return None
    cmd = _argv(script, "horovod_two_ranks", 2 * config.scaling_examples, config, "horovod")
    outcome = run_horovod(2, cmd, timeout=config.scaling_timeout, env=_env(), echo=False)
    text = "".join(t.stdout for t in outcome.tasks)
    if outcome.returncode != 0:
        raise RuntimeError(f"2-rank Horovod run failed (exit {outcome.returncode}):\n{text[-1500:]}")
    rank0 = [line for line in text.splitlines() if line.startswith("[0]")] or text.splitlines()
    return last_json("\n".join(rank0))


_RUNNERS: Dict[str, Callable[[str, BenchConfig], Optional[Dict[str, Any]]]] = {
    "one_worker": _one_worker, "two_independent": _two_independent, "mwms_two_workers": _mwms_two_workers,
    "horovod_two_ranks": _horovod_two_ranks}


def _figures(rounds: List[Dict[str, Any]]) -> Dict[str, Any]:
    eps = [{c: t["examples_per_sec"] for c, t in r["timings"].items()} for r in rounds]
    out = {"p4_mwms": summary([e["mwms_two_workers"] / (2 * e["one_worker"]) for e in eps]),
           "p4_ceiling": summary([e["two_independent"] / (2 * e["one_worker"]) for e in eps]),
           # mwms / ceiling: the part of what the machine allows that MultiWorkerMirrored keeps
           "p4_mwms_of_ceiling": summary([e["mwms_two_workers"] / e["two_independent"] for e in eps])}
    if all("horovod_two_ranks" in e for e in eps):
        out["p4_horovod"] = summary([e["horovod_two_ranks"] / (2 * e["one_worker"]) for e in eps])
    else:
        out["p4_horovod_note"] = "not measured: Horovod is not built here (scripts/install_horovod.sh)"
    return out


def measure_scaling(config: BenchConfig, stopwatch: Stopwatch) -> Dict[str, Any]:
    """P4 over ``config.repeats`` rounds, every contender in every round, ratios per round.

    The jobs' chiefs time themselves with their own :class:`Stopwatch`; the names they timed are added to
    ``stopwatch.timed``.
    """
    rounds: List[Dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tfaccel-bench-") as tmp:
        script = os.path.join(tmp, "scaling_worker.py")
        with open(script, "w") as fh:
            fh.write(_SCALING_WORKER)
        for r in range(config.repeats):
            order = round_order(list(SCALING_CONTENDERS), seed=config.seed, group="scaling", round_index=r)
            timings = {}
            for name in order:
                outcome = _RUNNERS[name](script, config)
                if outcome is not None:
                    stopwatch.timed.extend(outcome["timed"])
                    timings[name] = {k: outcome[k] for k in ("examples_per_sec", "time_to_train", "details")}
            rounds.append({"order": [c for c in order if c in timings], "timings": timings})
            get_logger().info("bench scaling round %d: %s", r + 1,
                              ", ".join(f"{c} {t['examples_per_sec']:,.0f} ex/s" for c, t in timings.items()))
    return {**_figures(rounds), "examples_per_sec": contender_rows(rounds, "examples_per_sec"),
            "time_to_train": contender_rows(rounds, "time_to_train"), "order": [r["order"] for r in rounds],
            "per_worker_batch": config.scaling_batch,
            "details": {c: t["details"] for c, t in rounds[-1]["timings"].items()}}
