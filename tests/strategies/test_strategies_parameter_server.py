"""parameter_server: a real chief + worker + ps on loopback; auto picks it from TF_CONFIG and the coordinator runs."""

import json
from pathlib import Path

import harness

PROGRAM = Path(__file__).with_name("strategies_ps_program.py")


def test_parameter_server_coordinator(tmp_path) -> None:
    cluster = harness.loopback_cluster(1, ps=1, chief=True)
    tasks = harness.tf_configs_for(cluster, roles=("ps", "worker", "chief"))
    results = harness.run_tasks(PROGRAM, tasks=tasks, timeout=150, env={"PS_TEST_DONE": str(tmp_path / "done")})
    harness.assert_all_ok(results)
    chief = [r for r in results if r.task_type == "chief"][0]
    out = harness.last_json_line(chief.stdout)
    assert out["ok"] and out["strategy"] == "parameter_server", json.dumps(out)
    assert out["reason"] == "TF_CONFIG describes 3 tasks (chief x1, worker x1, ps x1) including ps tasks"
    assert out["uses_keras_fit"] is False and out["supports_jit"] is False and out["num_workers"] == 1
    assert out["counter"] == 4.0 and out["sums"] == [8.0] * 4
    assert out["shards"] == 2  # variable_partitioner=2 split the (4, 2) variable in two
