"""Two real worker processes (TF_CONFIG on loopback) train with model.fit under get_strategy("auto"), in lock step,
without their threads growing with the steps."""

from pathlib import Path

import harness

PROGRAM = Path(__file__).with_name("strategies_fit_program.py")


def test_two_workers_fit_in_lock_step() -> None:
    """Six epochs of 8 steps. The threads of each worker stay flat from the second epoch's end to the last: with a
    per-collective timeout (tfaccel's default was 600 s) TensorFlow 2.21 starts one thread per collective that lives
    for the whole timeout, measured here +80 threads an epoch with 600 s, until a long job cannot start threads any
    more."""
    results = harness.run_tasks(PROGRAM, workers=2, timeout=150, args=["--epochs", "6"],
                                env={"TFACCEL_DISABLE_COMPAT": ""})
    harness.assert_all_ok(results)
    out = [harness.last_json_line(r.stdout) for r in results]
    for index, res in enumerate(out):
        assert res["ok"] and res["strategy"] == "multi_worker", res
        assert res["reason"] == "TF_CONFIG describes 2 tasks (worker x2) without ps tasks"
        assert (res["replicas"], res["num_workers"], res["worker_index"], res["is_chief"]) == (2, 2, index, index == 0)
    # different initial weights per worker (seeded by worker index), yet identical after training:
    assert out[0]["weights_sha"] == out[1]["weights_sha"]
    assert out[0]["loss"] == out[1]["loss"] and out[0]["mae"] == out[1]["mae"]
    assert out[0]["loss"][-1] < out[0]["loss"][0]
    for res in out:
        assert res["threads"][-1] - res["threads"][1] <= 8, res["threads"]


LATE = """
import json
import tensorflow as tf
tf.constant(1.0) + 1  # the runtime starts before the strategy: too late for collectives
from tfaccel.strategies import get_backend
try:
    get_backend("multi_worker")
    print(json.dumps({"ok": True}))
except Exception as exc:
    print(json.dumps({"ok": False, "type": type(exc).__name__, "message": str(exc)}))
"""


def test_strategy_created_too_late_says_so() -> None:
    results = harness.run_tasks(LATE, workers=2, timeout=90)
    harness.assert_all_ok(results)
    for result in results:
        out = harness.last_json_line(result.stdout)
        assert out == {"ok": False, "type": "DeviceError", "message": (
            "multi_worker: TensorFlow already ran in this process before MultiWorkerMirroredStrategy was made "
            "(TensorFlow: \"Collective ops must be configured at program startup\"): something used TensorFlow first, "
            "such as a tf.data pipeline, a tensor or a model built before tfaccel.scope(). Fix: enter `with "
            "tfaccel.scope():` (or call tfaccel.get_strategy()) first thing in the script, before building the "
            "dataset or the model")}
