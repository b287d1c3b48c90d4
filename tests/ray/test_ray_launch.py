"""`tfaccel launch --backend ray` with a private local Ray instance (no --address): real Ray on 127.0.0.1."""

import json
import re
import shutil
import tempfile
import uuid
from pathlib import Path

import numpy as np
import pytest

import ray_util

pytestmark = pytest.mark.slow


def _temporary_files(tmp: Path) -> set:
    """What a launch on a private Ray instance may leave in its temporary directory: its own directory (with the
    workers' files and Ray's session) and Ray's default session directories."""
    return set(tmp.glob("tfaccel-ray-*")) | set(tmp.glob("ray/session_*"))


@pytest.fixture
def short_tmp():
    """The launch's own TMPDIR (short: Ray's socket paths must fit 107 bytes), so that another test's Ray run at
    the same time (pytest -n) cannot leave or remove files this test counts."""
    tmp = Path(tempfile.mkdtemp(prefix="trl-"))
    yield tmp
    shutil.rmtree(tmp, ignore_errors=True)


def test_launch_backend_ray_runs_compile_and_fit_on_two_workers(tmp_path, short_tmp):
    """Two Ray Train workers on a private local instance run a script given by a path relative to the launcher's
    directory, train in lock-step (identical weights), their output is prefixed [worker i], Ray's Result holds the
    last epoch's metrics and tfaccel's checkpoint path, and no process of the run (driver, Ray, workers, commands)
    nor any of its temporary files survives it."""
    mark = f"local-{uuid.uuid4().hex[:12]}"
    tmp = short_tmp
    storage = tmp_path / "storage"
    done = ray_util.launch(["--backend", "ray", "--workers", "2", "--storage-path", str(storage), "--timeout", "280",
                            "--", "tests/ray/scripts/fit_job.py"], mark=mark, timeout=300,
                           env={"JOB_OUT": str(tmp_path), "JOB_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
                                "TMPDIR": str(tmp)})
    left = ray_util.kill_marked(mark, wait=15)
    assert done.returncode == 0, done.stdout[-4000:]
    assert not left, f"processes of the run survived it: {left}"
    assert not _temporary_files(tmp), "the launch left temporary files behind"
    assert "started a private local Ray instance on 127.0.0.1 with 2 CPU(s)" in done.stdout
    for rank in (0, 1):
        assert f"[worker {rank}] JOB: worker:{rank} done" in done.stdout
    w0, w1 = np.load(tmp_path / "weights-0.npz"), np.load(tmp_path / "weights-1.npz")
    assert all(np.array_equal(w0[k], w1[k]) for k in w0.files)
    results = [json.loads((tmp_path / f"result-{rank}.json").read_text()) for rank in (0, 1)]
    for rank, result in enumerate(results):
        assert result["strategy"] == "multi_worker" and result["replicas"] == 2, result
        assert result["tf_config"]["task"] == {"type": "worker", "index": rank}
        assert all(a.startswith("127.0.0.1:") for a in result["tf_config"]["cluster"]["worker"])
        assert result["restart"] == "0"
    run_dir = Path(re.search(r"Ray Train finished OK; result in (\S+)", done.stdout).group(1))
    assert run_dir.parent == storage
    reported = sorted(run_dir.glob("checkpoint_*/tfaccel.json"))
    assert reported, list(run_dir.iterdir())
    last = json.loads(reported[-1].read_text())
    # tfaccel.fit adds the report callback after its checkpoint callback: the epoch's own checkpoint is reported.
    assert len(reported) == 2, reported  # one report per epoch (the job adds no callback of its own)
    assert last["epoch"] == 2 and last["loss"] == pytest.approx(results[0]["loss"][-1], rel=1e-5)
    assert last["checkpoint_path"] == str(tmp_path / "ckpt" / "ckpt-2")
