"""Two real worker processes (TF_CONFIG on loopback) train with model.fit under get_strategy("auto")."""

from pathlib import Path

import harness

PROGRAM = Path(__file__).with_name("strategies_fit_program.py")


def test_two_workers_fit_in_lock_step() -> None:
    results = harness.run_tasks(PROGRAM, workers=2, timeout=150, env={"TFACCEL_DISABLE_COMPAT": ""})
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
