"""parameter_server: a real chief + worker + ps on loopback; auto picks it from TF_CONFIG and the coordinator runs."""

import json
from pathlib import Path

import harness

PROGRAM = Path(__file__).with_name("strategies_ps_program.py")


def test_parameter_server_coordinator(tmp_path) -> None:
    out = harness.run_small_ps_cluster(PROGRAM, tmp_path, timeout=150)
    assert out["ok"] and out["strategy"] == "parameter_server", json.dumps(out)
    assert out["reason"] == "TF_CONFIG describes 3 tasks (chief x1, worker x1, ps x1) including ps tasks"
    assert out["uses_keras_fit"] is False and out["supports_jit"] is False and out["num_workers"] == 1
    assert out["counter"] == 4.0 and out["sums"] == [8.0] * 4
    assert out["shards"] == 2  # variable_partitioner=2 split the (4, 2) variable in two
