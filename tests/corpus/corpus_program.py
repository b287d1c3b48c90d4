"""Runs every keras-io corpus case on one path, in this one process, and writes one JSON file per case and runner.

    python corpus_program.py PATH OUT_DIR [CASE ...]

PATH: ``default`` (one CPU device), ``mirrored`` (2 virtual CPUs) or ``multi_worker`` (run in each worker under
TF_CONFIG, by ``tfaccel.launch.run_local``). Each case runs first with the README's 3-line change
(``tfaccel.scope()``, all "auto", and ``tfaccel.fit``), then, on default and mirrored, as the plain Keras script
under the same strategy (one device: with the XLA setting tfaccel's plan chose). Records go to
``OUT_DIR/<runner>/<task>/<case>.json`` in parity_program.py's format (status, history, weights), so that
tests/parity's parity_compare reads them.
"""

import json
import os
import sys
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "parity")]

import corpus_cases  # noqa: E402
import parity_compare  # noqa: E402
from corpus_registry import Case, Runner  # noqa: E402


def run_case(runner: Runner, case: Case) -> dict:
    import keras

    keras.utils.set_random_seed(corpus_cases.SEED)
    started, cpu = time.monotonic(), time.process_time()
    try:
        model = case.run(runner)
    except Exception as exc:  # recorded; the test shows it
        import tfaccel

        status = "refused" if isinstance(exc, tfaccel.ConfigError) else "error"
        return {"status": status, "message": traceback.format_exc() if status == "error" else str(exc),
                "seconds": time.monotonic() - started, "cpu_seconds": time.process_time() - cpu,
                "plan_strategy": runner.plan_strategy}
    return {"status": "ok", "history": runner.history, "weights": [np.asarray(w).tolist() for w in model.get_weights()],
            "weight_paths": [w.path for w in model.weights], "jit": bool(getattr(model, "jit_compile", False)),
            "loop": ",".join(runner.loops) or "keras model.fit", "plan_strategy": runner.plan_strategy,
            "policy": keras.mixed_precision.global_policy().name, "dtype": model.dtype_policy.name,
            "optimizer": type(getattr(model, "optimizer", None)).__name__, "extras": runner.extras,
            "files": sorted(os.listdir(runner.out)) if os.path.isdir(runner.out) else [],
            "seconds": time.monotonic() - started, "cpu_seconds": time.process_time() - cpu}


def _task() -> str:
    """This process's records folder: ``worker0`` / ``worker1`` under TF_CONFIG, else ``main`` (parity_program's)."""
    task = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task")
    return f"{task['type']}{task['index']}" if task else "main"


def _write(out_dir: str, runner: str, name: str, record: dict) -> None:
    folder = os.path.join(out_dir, runner, _task())
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{parity_compare.safe(name)}.json"), "w") as fh:
        json.dump(record, fh)


def main(argv: list) -> int:
    path, out_dir, names = argv[0], argv[1], argv[2:] or list(corpus_cases.CASES)
    import tfaccel

    if path == "mirrored":
        tfaccel.configure_devices(virtual_cpus=2)
    for name in names:
        case = corpus_cases.CASES[name]
        work = os.path.join(out_dir, "work", _task(), parity_compare.safe(name))
        tfaccel_run = Runner("tfaccel", os.path.join(work, "tfaccel"))
        record = run_case(tfaccel_run, case)
        _write(out_dir, "tfaccel", name, record)
        if path != "multi_worker":  # plain Keras under the same strategy: the reference (one strategy per process)
            keras_run = Runner("keras", os.path.join(work, "keras"), strategy=tfaccel.get_strategy(),
                               jit=record.get("jit") if path == "default" else None)
            _write(out_dir, "keras", name, run_case(keras_run, case))
        print(f"corpus {path} {name}: {record['status']} {record['seconds']:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
