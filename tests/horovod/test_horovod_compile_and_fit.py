"""compile_and_fit under 2 real Horovod ranks against the same script in one process.

``tfaccel launch --backend horovod -np 2 -- python hvd_fit_script.py``: strategy "auto" picks Horovod from
horovodrun's environment; every rank builds its model from a different seed and trains on its own shard
with per-rank batch 16. The single-process run (global batch 32, same data order) is the reference: with
plain SGD, averaged gradients over two halves of each batch equal the gradient of the whole batch.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import harness
from hvd_testing import require_horovod
from tfaccel.launch.procs import pid_alive, terminate

SCRIPT = Path(__file__).resolve().parent / "hvd_fit_script.py"

pytestmark = [pytest.mark.horovod, pytest.mark.slow]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k != "TF_CONFIG" and not k.startswith(("HOROVOD_", "OMPI_", "PMI_", "SLURM_"))}
    env.update(harness.CHILD_ENV, PYTHONPATH=str(harness.REPO_ROOT))
    return env


def test_two_ranks_match_each_other_and_the_single_process_run(tmp_path) -> None:
    require_horovod()
    cmd = [sys.executable, "-m", "tfaccel", "launch", "--backend", "horovod", "-np", "2", "--gloo-timeout", "120",
           "--timeout", "240", "--", sys.executable, str(SCRIPT), "--out", str(tmp_path)]
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    harness.STARTED_PIDS.append(proc.pid)
    try:
        out, _ = proc.communicate(timeout=300)
    finally:
        terminate([proc])  # a no-op when it already ended; else ends it and its group
    assert proc.returncode == 0, out[-4000:]
    assert "[0]<stdout>:Epoch 2/2" in out and "[1]<stdout>:Epoch" not in out  # rank 0 alone reports progress
    single = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)], env=_env(), timeout=240,
                            capture_output=True, text=True)
    assert single.returncode == 0, single.stderr[-4000:]

    infos = {tag: json.loads((tmp_path / f"fit{tag}.json").read_text()) for tag in ("0", "1", "single")}
    weights = {tag: np.load(tmp_path / f"fit{tag}.npz") for tag in infos}
    for tag in ("0", "1"):
        assert infos[tag]["strategy"] == "horovod" and infos[tag]["replicas"] == 2
        assert infos[tag]["global_batch"] == 32 and infos[tag]["steps_per_epoch"] == 8
        deadline = time.monotonic() + 10
        while pid_alive(infos[tag]["pid"]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not pid_alive(infos[tag]["pid"]), f"rank {tag} outlived the launch"
    assert infos["single"]["strategy"] == "default"
    names = weights["0"].files
    for name in names:  # identical on both ranks, from different initial weights and shards
        np.testing.assert_array_equal(weights["0"][name], weights["1"][name])
    for name in names:  # and the same model as one process with the global batch
        np.testing.assert_allclose(weights["0"][name], weights["single"][name], rtol=1e-4, atol=1e-5)
    assert infos["0"]["loss"] == infos["1"]["loss"]
    np.testing.assert_allclose(infos["0"]["loss"], infos["single"]["loss"], rtol=1e-4)
    assert infos["0"]["loss"][-1] < infos["0"]["loss"][0]
