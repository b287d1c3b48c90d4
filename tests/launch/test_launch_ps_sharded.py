"""Issue 15: a 200k x 32 Embedding sharded over 2 ps tasks trains under `tfaccel launch --ps 2 --workers 1`.

One real job (chief + 1 worker + 2 ps processes on loopback). The chief shows three things: with the fix off
the upstream failure still happens (tfaccel.compat.keras_sharded is still needed); with it on each ps holds one
shard of the table and the optimizer slots of that shard; and the result equals plain Keras fit of the same
unsharded model from the same weights (one worker and shuffle=False keep the coordinator in fit's order), and its
checkpoint restores into the unsharded model.
"""

import json

import pytest

import launch_util

SCRIPT = launch_util.SCRIPTS / "ps_sharded.py"
PS = ["/job:ps/replica:0/task:0/device:CPU:0", "/job:ps/replica:0/task:1/device:CPU:0"]


def test_sharded_embedding_over_two_ps() -> None:
    with launch_util.Launcher("--ps", "2", "--workers", "1", "--", str(SCRIPT)) as job:
        assert job.wait(timeout=240) == 0, job.stderr[-4000:]
    line = [ln for ln in job.stdout.splitlines() if '"without_fix"' in ln][-1]
    out = json.loads(line[line.index("{"):])
    assert out["without_fix"].endswith("AttributeError: 'ShardedVariable' object has no attribute 'handle'")
    table = [p for p in out["placement"] if p["name"].endswith("embeddings")][0]
    assert table["shape"] == [200000, 32] and table["shards"] == 2
    assert table["shard_shapes"] == [[100000, 32], [100000, 32]] and sorted(table["devices"]) == PS
    for i, device in enumerate(table["devices"]):  # each shard's Adam slots live beside the shard
        assert sorted(s["device"] for s in out["slots"] if f"part_{i}_" in s["name"]) == [device, device]
    assert any("variable_partitioner every variable split along axis 0 into 2 shards" in n for n in out["plan_notes"])
    assert out["steps"] == 8 and out["history"].keys() == out["expected"].keys()
    for key, values in out["expected"].items():  # the parity rule: per-epoch values within rel 1e-5
        assert out["history"][key] == pytest.approx(values, rel=1e-5), key
    assert out["max_weight_diff"] <= 1e-6
    assert out["restored_diff"] == 0.0  # the sharded checkpoint restores into the unsharded model
