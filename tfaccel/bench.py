"""``tfaccel bench``: how much faster compile_and_fit is, measured side by side in one run.

Figures (each a ratio, the median of ``repeats`` rounds with min and max; in every round all contenders
run one after another on the same data, so machine noise hits them alike):

* P1 compile_and_fit with its defaults / a naive ``model.fit(x, y)`` with Keras defaults (target >= 6.0)
* P2 compile_and_fit / the best hand-tuned Keras fit with the same batch: cached tf.data, prefetch,
  ``steps_per_execution=64``, the faster of ``jit_compile=True`` and ``False`` (target >= 0.97)
* P3 compile_and_fit / a hand-written XLA loop running a whole epoch in one ``tf.while_loop`` without
  Keras' fit: the limit for that model on this machine (target >= 0.85)
* P4 weak-scaling efficiency of 2 workers x 1 thread vs 1 worker x 1 thread on loopback, each worker with
  the same per-worker batch, on a compute-bound CNN: ``throughput(2 workers) / (2 x throughput(1 worker))``
  for MultiWorkerMirrored (``p4_mwms``) and Horovod (``p4_horovod``, when Horovod is built) (target >= 0.90).
  Beside it, ``scaling.p4_ceiling``: the same ratio for two processes that do not communicate at all, which
  is what the machine itself allows (shared memory bandwidth and caches).

Throughput leaves out the first epoch (tracing and XLA compilation) in every contender.
"""

import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from tfaccel.log import get_logger

__all__ = ["BenchConfig", "run_bench", "TARGETS"]

TARGETS = {"p1": 6.0, "p2": 0.97, "p3": 0.85, "p4_mwms": 0.90, "p4_horovod": 0.90}


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """What to measure. ``quick`` fits in a few minutes on 2 cores."""

    quick: bool = True
    repeats: int = 3
    examples: int = 6144
    epochs: int = 5               # timed epochs = epochs - 1 (fast models finish an epoch in ~30 ms)
    models: Sequence[str] = ("mlp", "mnist_cnn")
    scaling: bool = True
    scaling_examples: int = 1024
    scaling_batch: int = 64
    scaling_timeout: float = 240.0

    @staticmethod
    def make(quick: bool) -> "BenchConfig":
        if quick:
            return BenchConfig()
        return BenchConfig(quick=False, repeats=5, examples=32768, epochs=4, scaling_examples=8192)


def _summary(values: Sequence[float]) -> Dict[str, float]:
    return {"median": float(statistics.median(values)), "min": float(min(values)), "max": float(max(values)),
            "values": [float(v) for v in values]}


def _data(model_name: str, n: int) -> tuple:
    rng = np.random.default_rng(0)
    x = rng.random((n, 28, 28, 1), dtype=np.float32)
    w = rng.standard_normal((28 * 28, 10)).astype(np.float32)
    y = np.argmax(x.reshape(n, -1) @ w, axis=1).astype(np.int32)  # learnable labels
    return x, y


def _builder(model_name: str) -> Callable[[], Any]:
    from tfaccel.models import get_model_builder

    builder = get_model_builder(model_name)
    return lambda: builder(input_shape=(28, 28, 1), num_classes=10)


def _timed_fit(model: Any, data: Any, epochs: int, n: int, **fit_kwargs: Any) -> float:
    """Examples/s of ``model.fit`` over epochs 2..N (the first call pays for tracing)."""
    model.fit(data, epochs=1, verbose=0, **fit_kwargs)
    t0 = time.perf_counter()
    model.fit(data, epochs=epochs - 1, verbose=0, **fit_kwargs)
    return (epochs - 1) * n / (time.perf_counter() - t0)


def _naive(build: Callable, x: Any, y: Any, epochs: int) -> float:
    import keras

    model = build()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x, y, epochs=1, verbose=0)
    t0 = time.perf_counter()
    model.fit(x, y, epochs=epochs - 1, verbose=0)
    del keras
    return (epochs - 1) * len(x) / (time.perf_counter() - t0)


def _hand_tuned(build: Callable, x: Any, y: Any, epochs: int, batch: int) -> float:
    """The best hand-tuned Keras fit: cached tf.data, prefetch, steps_per_execution=64, with and without XLA."""
    import tensorflow as tf

    best = 0.0
    for jit in (True, False):
        model = build()
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                      steps_per_execution=64, jit_compile=jit)
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=0).batch(batch).cache().prefetch(
            tf.data.AUTOTUNE)
        best = max(best, _timed_fit(model, ds, epochs, len(x)))
    return best


def _hand_xla_loop(build: Callable, x: Any, y: Any, epochs: int, batch: int) -> float:
    """The reference: the whole epoch in one XLA-compiled tf.while_loop, no Keras fit, no metrics."""
    import keras
    import tensorflow as tf

    model = build()
    opt = keras.optimizers.Adam()
    opt.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    xs, ys = tf.constant(x), tf.constant(y)
    steps = len(x) // batch

    @tf.function(jit_compile=True)
    def epoch(order: Any) -> Any:
        def body(i: Any, total: Any) -> Any:
            idx = tf.slice(order, [i * batch], [batch])
            with tf.GradientTape() as tape:
                loss = loss_fn(tf.gather(ys, idx), model(tf.gather(xs, idx), training=True))
            opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
            return i + 1, total + loss

        return tf.while_loop(lambda i, _: i < steps, body, (tf.constant(0), tf.constant(0.0)))[1]

    rng = np.random.default_rng(0)
    epoch(tf.constant(rng.permutation(len(x)).astype(np.int32)))
    t0 = time.perf_counter()
    for _ in range(epochs - 1):
        float(epoch(tf.constant(rng.permutation(len(x)).astype(np.int32))))
    return (epochs - 1) * steps * batch / (time.perf_counter() - t0)


def _compile_and_fit(build: Callable, x: Any, y: Any, epochs: int, **kwargs: Any) -> tuple:
    from tfaccel.train.api import compile_and_fit

    result = compile_and_fit(build, (x, y), epochs=epochs, loss="sparse_categorical_crossentropy",
                             metrics=["accuracy"], verbose=0, strategy="default", **kwargs)
    return result.examples_per_sec, result


def measure_speedups(config: BenchConfig) -> Dict[str, Any]:
    """P1-P3 for every model: all contenders in every round, ratios per round."""
    log = get_logger()
    out: Dict[str, Any] = {}
    for name in config.models:
        build = _builder(name)
        x, y = _data(name, config.examples)
        rounds: List[Dict[str, float]] = []
        plan = None
        for r in range(config.repeats):
            cf, result = _compile_and_fit(build, x, y, config.epochs)
            batch = result.global_batch_size
            plan = result.plan.to_dict() if hasattr(result.plan, "to_dict") else str(result.plan)
            row = {"compile_and_fit": cf, "naive": _naive(build, x, y, config.epochs),
                   "hand_tuned": _hand_tuned(build, x, y, config.epochs, batch),
                   "hand_xla_loop": _hand_xla_loop(build, x, y, config.epochs, batch)}
            rounds.append(row)
            log.info("bench %s round %d: %s", name, r + 1, ", ".join(f"{k} {v:,.0f} ex/s" for k, v in row.items()))
        out[name] = {
            "examples_per_sec": {k: _summary([row[k] for row in rounds]) for k in rounds[0]},
            "p1": _summary([row["compile_and_fit"] / row["naive"] for row in rounds]),
            "p2": _summary([row["compile_and_fit"] / row["hand_tuned"] for row in rounds]),
            "p3": _summary([row["compile_and_fit"] / row["hand_xla_loop"] for row in rounds]),
            "global_batch_size": batch, "loop": result.details.get("loop"), "plan": plan,
        }
    return out


_SCALING_WORKER = r"""
import json, os, sys
import numpy as np
import tfaccel
n, batch, epochs = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
strategy = sys.argv[4]
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
result = tfaccel.compile_and_fit(build, (x, y), epochs=epochs, per_replica_batch_size=batch, strategy=strategy,
    loss="sparse_categorical_crossentropy", scale_learning_rate="none", verbose=0, seed=0, loop="keras",
    steps_per_execution=1)  # the same loop in every contender (multi_worker runs 1 step per execution)
print(json.dumps({"examples_per_sec": result.examples_per_sec, "replicas": result.plan.num_replicas,
                  "strategy": result.plan.strategy}))
"""


def _scaling_env() -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update({"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "2", "OMP_NUM_THREADS": "1",
                "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"})
    return env


def _last_json(text: str) -> Dict[str, Any]:
    for line in reversed(text.strip().splitlines()):
        if "{" in line and line.rstrip().endswith("}"):  # horovodrun prefixes rank lines with "[0]<stdout>:"
            return json.loads(line[line.index("{"):])
    raise RuntimeError(f"no result line in worker output:\n{text[-1500:]}")


def _single_worker(script: str, config: BenchConfig, per_worker_examples: int) -> float:
    proc = subprocess.run([sys.executable, script, str(per_worker_examples), str(config.scaling_batch), "3",
                           "default"], capture_output=True, text=True, timeout=config.scaling_timeout,
                          env=_scaling_env())
    if proc.returncode != 0:
        raise RuntimeError(f"single-worker run failed:\n{proc.stderr[-1500:]}")
    return float(_last_json(proc.stdout)["examples_per_sec"])


def _two_independent(script: str, config: BenchConfig, per_worker_examples: int) -> float:
    """Two unconnected single-worker processes at once: what this machine allows with no communication at all."""
    argv = [sys.executable, script, str(per_worker_examples), str(config.scaling_batch), "3", "default"]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_scaling_env())
             for _ in range(2)]
    total = 0.0
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=config.scaling_timeout)
            if proc.returncode != 0:
                raise RuntimeError(f"independent run failed:\n{err[-1500:]}")
            total += float(_last_json(out)["examples_per_sec"])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return total


def _two_workers_mwms(script: str, config: BenchConfig, per_worker_examples: int) -> float:
    from tfaccel.launch import run_local

    cmd = [sys.executable, script, str(2 * per_worker_examples), str(config.scaling_batch), "3", "multi_worker"]
    result = run_local(cmd, workers=2, timeout=config.scaling_timeout, env=_scaling_env(), echo=False)
    if result.returncode != 0:
        raise RuntimeError(f"2-worker run failed (exit {result.returncode})")
    chief = result.tasks[0]
    return float(_last_json(chief.stdout)["examples_per_sec"])


def _two_ranks_horovod(script: str, config: BenchConfig, per_worker_examples: int) -> Optional[float]:
    from tfaccel.launch.horovod import run_horovod

    try:
        import horovod.tensorflow  # noqa: F401
    except Exception:  # noqa: BLE001 - Horovod not built here: the figure is reported as not measured
        return None

    cmd = [sys.executable, script, str(2 * per_worker_examples), str(config.scaling_batch), "3", "horovod"]
    outcome = run_horovod(2, cmd, timeout=config.scaling_timeout, env=_scaling_env(), echo=False)
    text = "".join(t.stdout for t in outcome.tasks)
    if outcome.returncode != 0:
        raise RuntimeError(f"2-rank Horovod run failed (exit {outcome.returncode}):\n{text[-1500:]}")
    rank0 = [line for line in text.splitlines() if line.startswith("[0]")] or text.splitlines()
    return float(_last_json("\n".join(rank0))["examples_per_sec"])


def measure_scaling(config: BenchConfig) -> Dict[str, Any]:
    """P4: weak scaling of 2 workers x 1 thread against 1 worker x 1 thread, per round side by side."""
    log = get_logger()
    per_worker = config.scaling_examples
    with tempfile.TemporaryDirectory(prefix="tfaccel-bench-") as tmp:
        script = os.path.join(tmp, "scaling_worker.py")
        with open(script, "w") as fh:
            fh.write(_SCALING_WORKER)
        rows = []
        for r in range(config.repeats):
            one = _single_worker(script, config, per_worker)
            independent = _two_independent(script, config, per_worker)
            two = _two_workers_mwms(script, config, per_worker)
            hvd = _two_ranks_horovod(script, config, per_worker)
            rows.append({"one_worker": one, "two_independent": independent, "mwms_two_workers": two,
                         "horovod_two_ranks": hvd})
            log.info("bench scaling round %d: %s", r + 1, rows[-1])
    out: Dict[str, Any] = {
        "examples_per_sec": {k: _summary([row[k] for row in rows])
                             for k in ("one_worker", "two_independent", "mwms_two_workers")},
        "p4_mwms": _summary([row["mwms_two_workers"] / (2 * row["one_worker"]) for row in rows]),
        # The machine's own ceiling: two processes that do not communicate at all (memory bandwidth, shared
        # caches). P4 cannot exceed it whatever the all-reduce costs.
        "p4_ceiling": _summary([row["two_independent"] / (2 * row["one_worker"]) for row in rows]),
        "per_worker_batch": config.scaling_batch,
    }
    if all(row["horovod_two_ranks"] is not None for row in rows):
        out["p4_horovod"] = _summary([row["horovod_two_ranks"] / (2 * row["one_worker"]) for row in rows])
        out["examples_per_sec"]["horovod_two_ranks"] = _summary([row["horovod_two_ranks"] for row in rows])
    else:
        out["p4_horovod_note"] = "not measured: Horovod is not built here (scripts/install_horovod.sh)"
    return out


def run_bench(config: BenchConfig, *, json_path: Optional[str] = None, png_path: Optional[str] = None
              ) -> Dict[str, Any]:
    """Runs the benchmark and returns (and optionally writes) the report.

    The report has top-level ``p1``, ``p2``, ``p3`` (the worst model's median, with that model's spread),
    ``p4_mwms`` (and ``p4_horovod``), each ``{"median", "min", "max"}``, plus ``machine``, ``versions``,
    ``per_model``, ``scaling`` and ``targets``.
    """
    import keras
    import tensorflow as tf

    from tfaccel._version import __version__

    # Every contender builds fresh tf.functions each round, on purpose (no contender reuses another's
    # traces); TF's "triggered tf.function retracing" warning about that is noise here.
    tf.get_logger().setLevel("ERROR")
    t0 = time.perf_counter()
    speed = measure_speedups(config)
    report: Dict[str, Any] = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": sys.version.split()[0],
                    "gpus": [d.name for d in tf.config.list_physical_devices("GPU")]},
        "versions": {"tfaccel": __version__, "tensorflow": tf.__version__, "keras": keras.__version__},
        "config": dataclasses.asdict(config), "targets": TARGETS, "per_model": speed,
    }
    for key in ("p1", "p2", "p3"):
        worst = min(speed.values(), key=lambda m: m[key]["median"])
        report[key] = {k: worst[key][k] for k in ("median", "min", "max")}
    if config.scaling:
        scaling = measure_scaling(config)
        report["scaling"] = scaling
        for key in ("p4_mwms", "p4_horovod"):
            if key in scaling:
                report[key] = {k: scaling[key][k] for k in ("median", "min", "max")}
    report["seconds"] = round(time.perf_counter() - t0, 1)
    if json_path:
        from tfaccel.train.backups import atomic_write_text

        os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
        atomic_write_text(json_path, json.dumps(report, indent=2, default=str))
    if png_path:
        plot(report, png_path)
    return report


def plot(report: Dict[str, Any], path: str) -> None:
    """Bar chart of every figure's median with its min-max range and its target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in ("p1", "p2", "p3", "p4_mwms", "p4_horovod") if k in report]
    medians = [report[k]["median"] for k in keys]
    lower = [report[k]["median"] - report[k]["min"] for k in keys]
    upper = [report[k]["max"] - report[k]["median"] for k in keys]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), gridspec_kw={"width_ratios": [1, 3]})
    axes[0].bar(["p1"], [medians[0]], yerr=[[lower[0]], [upper[0]]], color="tab:blue", capsize=6)
    axes[0].axhline(TARGETS["p1"], color="red", linestyle="--", label="target")
    axes[0].set_title("P1 speed-up vs naive fit")
    axes[0].legend()
    rest = keys[1:]
    axes[1].bar(rest, medians[1:], yerr=[lower[1:], upper[1:]], color="tab:green", capsize=6)
    for i, k in enumerate(rest):
        axes[1].hlines(TARGETS[k], i - 0.4, i + 0.4, colors="red", linestyles="--")
    axes[1].set_ylim(0, max(1.1, max(medians[1:] + [0]) * 1.15))
    axes[1].set_title("P2/P3 ratios, P4 weak-scaling efficiency (red: target)")
    fig.suptitle(f"tfaccel bench on {report['machine']['cpus']} CPUs, TF {report['versions']['tensorflow']}")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def format_report(report: Dict[str, Any]) -> str:
    """The lines ``tfaccel bench`` prints."""
    lines = []
    names = {"p1": "P1 compile_and_fit / naive fit", "p2": "P2 compile_and_fit / hand-tuned fit",
             "p3": "P3 compile_and_fit / hand XLA loop", "p4_mwms": "P4 weak scaling, MultiWorkerMirrored",
             "p4_horovod": "P4 weak scaling, Horovod"}
    for key, label in names.items():
        if key in report:
            r = report[key]
            ok = "meets" if r["median"] >= TARGETS[key] else "BELOW"
            lines.append(f"{label}: {r['median']:.2f} (min {r['min']:.2f}, max {r['max']:.2f}); target "
                         f">= {TARGETS[key]} -> {ok}")
    if "scaling" in report:
        c = report["scaling"]["p4_ceiling"]
        lines.append(f"P4 ceiling of this machine (2 independent processes, no communication): {c['median']:.2f} "
                     f"(min {c['min']:.2f}, max {c['max']:.2f})")
    if "scaling" in report and "p4_horovod_note" in report["scaling"]:
        lines.append(f"P4 Horovod: {report['scaling']['p4_horovod_note']}")
    for model, m in report.get("per_model", {}).items():
        eps = ", ".join(f"{k} {v['median']:,.0f}" for k, v in m["examples_per_sec"].items())
        lines.append(f"  {model} (batch {m['global_batch_size']}, {m['loop']}): examples/s {eps}")
    lines.append(f"  took {report['seconds']}s")
    return "\n".join(lines)
