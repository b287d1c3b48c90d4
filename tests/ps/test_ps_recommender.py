"""Parameter-server training for real: chief + 2 workers + 2 ps (real processes on loopback, ``tfaccel.launch``).

A recommender (user/item ids -> a 200k x 32 Embedding split over both ps -> MLP -> sigmoid) is trained from
TFRecord shards written here; every worker reads only its own shards (``dataset_fn(input_context)``), nothing of the
data passes through the coordinator. Checked: each ps task holds only its shard of the table; the coordinator's
memory is the same with 4x the data (and 2 workers instead of 1); with one worker (updates in order, no asynchrony)
every metric equals the same model trained by plain Keras ``fit`` from the same initial weights on the same data; Keras ``evaluate`` of the trained model equals the coordinator's last validation metrics; the
step accounting is exact (nothing lost).
"""

import json
import sys
from pathlib import Path

import numpy as np

from tfaccel.datasets import write_tfrecords
from tfaccel.launch import run_local

JOB = Path(__file__).with_name("ps_recommender_job.py")
STEPS, EPOCHS, BATCH = 16, 1, 64


def write_shards(directory: Path, examples: int) -> str:
    """``examples`` (user, item) pairs in 4 shards: 1000 users and 1000 items spread over the 200k-row table."""
    rng = np.random.default_rng(7)
    users = rng.choice(100_000, 1000, replace=False)
    items = 100_000 + rng.choice(100_000, 1000, replace=False)
    u, i = rng.integers(0, 1000, examples), rng.integers(0, 1000, examples)
    label = (u % 2) ^ (i % 2)  # a taste that the embeddings can learn
    write_tfrecords(np.stack([users[u], items[i]], axis=1).astype(np.int32), label, str(directory), num_shards=4)
    return str(directory / "*.tfrecord")


def launch(files: str, *, workers: int = 2, reference: bool = False) -> dict:
    result = run_local([sys.executable, str(JOB)], workers=workers, ps=2, chief=True, timeout=240, echo=False,
                       env={"REC_FILES": files, "REC_STEPS": str(STEPS), "REC_EPOCHS": str(EPOCHS),
                            "REC_REFERENCE": "1" if reference else "0"})
    chief = result.task("chief:0")
    assert result.returncode == 0, f"{result.message}\n{chief.stdout[-3000:]}\n{chief.stderr[-5000:]}"
    return json.loads(chief.stdout.strip().splitlines()[-1])


def test_recommender_on_two_ps_from_worker_shards(tmp_path):
    one = launch(write_shards(tmp_path / "x1", 4096), workers=1, reference=True)
    four = launch(write_shards(tmp_path / "x4", 4 * 4096), workers=2)
    print("measured:", json.dumps({k: {m: run.get(m) for m in ("examples_per_sec", "seconds", "rss_before_mb",
                                                                "rss_after_mb", "peak_rss_mb", "accounting")}
                                    for k, run in (("1x", one), ("4x", four))}))
    # The table is split over both ps tasks, each holding only its half of the rows.
    shards = [shard for shard in one["shards"] if shard[0] == "ids/embeddings"]
    assert sorted(device.split("/device")[0] for _, _, device, _ in shards) == \
        ["/job:ps/replica:0/task:0", "/job:ps/replica:0/task:1"], shards
    assert sum(rows for *_, rows in shards) == 200_000 and all(rows == 100_000 for *_, rows in shards), shards
    # Nothing of the data passes through the coordinator: 4x the data (read by 2 workers), the same memory.
    assert abs(four["rss_after_mb"] - one["rss_after_mb"]) <= 0.10 * one["rss_after_mb"], (one, four)
    # Every scheduled update applied once, by the workers together; every example of a batch counted.
    for run, workers in ((one, ["worker:0"]), (four, ["worker:0", "worker:1"])):
        accounting = run["accounting"]
        assert accounting["updates_applied"] == accounting["updates_scheduled"] == STEPS * EPOCHS
        assert accounting["updates_not_counted"] == 0 and sum(accounting["updates_counted_per_worker"].values()) == 16
        assert accounting["closures_rerun"] == 0 and sorted(accounting["examples_seen"]) == workers
        assert accounting["examples_seen_total"] == STEPS * EPOCHS * BATCH  # 2 * 2 files of 1024 (4096): no remainder
        assert run["examples_per_sec"] > 0
    # Keras' evaluate on the trained model = the coordinator's validation pass of the last epoch.
    for key, value in one["evaluated"].items():
        np.testing.assert_allclose(value, one["history"][f"val_{key}"][-1], rtol=1e-5, err_msg=key)
    # One worker applies its updates in order: the same model as plain Keras fit from the same initial weights on
    # the same data (the parity rule). With 2 workers the updates are asynchronous, so no run equals another.
    reference = one["reference"]
    assert sorted(reference) == sorted(one["history"]), (reference, one["history"])
    for key, value in reference.items():
        np.testing.assert_allclose(one["history"][key][-1], value, rtol=1e-5, atol=1e-5, err_msg=key)
