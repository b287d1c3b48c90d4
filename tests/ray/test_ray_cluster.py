"""tfaccel on a real two-node Ray cluster (`ray start --head` + `ray start --address`, both on 127.0.0.1)."""

import json
import re
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import harness
import ray_util

pytestmark = pytest.mark.slow
REL_JOB = harness.REPO_ROOT / "tests" / "reliability" / "scripts" / "rel_job.py"


def _same_weights(a: Path, b: Path, atol: float = 1e-6) -> float:
    wa, wb = np.load(a), np.load(b)
    assert wa.files == wb.files
    diff = max(float(np.max(np.abs(wa[k] - wb[k]))) for k in wa.files)
    assert diff <= atol, f"{a.name} and {b.name} differ by {diff}"
    return diff


def _driver(cluster: "ray_util.RayCluster", out: Path, flow: str) -> dict:
    done = ray_util.run_in(cluster, [sys.executable, str(ray_util.SCRIPTS / "getting_started.py"), cluster.address,
                                     str(out), flow], timeout=240)
    assert done.returncode == 0, done.stdout[-4000:]
    return harness.last_json_line(done.stdout)


def test_ray_getting_started_flow_with_tfaccel_strategy(ray_cluster, tmp_path):
    """Ray's own TF flow, only the strategy line changed: both workers (one per node) end with identical weights."""
    report = _driver(ray_cluster, tmp_path, "ray_doc")
    assert report["error"] is None
    _same_weights(tmp_path / "ray_doc-0.npz", tmp_path / "ray_doc-1.npz")


def test_compile_and_fit_in_a_ray_train_function_reports_to_ray(ray_cluster, tmp_path):
    """compile_and_fit inside a user's Ray Train function: strategy "auto" -> multi_worker from Ray's TF_CONFIG,
    identical weights, and tfaccel's report callback puts the last epoch's metrics in Ray's Result."""
    report = _driver(ray_cluster, tmp_path, "tfaccel")
    _same_weights(tmp_path / "tfaccel-0.npz", tmp_path / "tfaccel-1.npz")
    assert report["metrics"]["epoch"] == 2 and report["metrics"]["loss"] > 0, report
    saved = json.loads(Path(report["checkpoint"], "tfaccel.json").read_text())
    assert saved["epoch"] == 2 and saved["checkpoint_path"] is None


def _rel_env(work: Path, **extra: str) -> dict:
    env = {"REL_EPOCHS": "2", "REL_BACKUP_FREQ": "5", "REL_KILL_MARKER": str(work / "killed"),
           "REL_BACKUP_DIR": str(work / "backup"), "REL_WEIGHTS_OUT": str(work / "w-{task}.npz")}
    env.update(extra)
    return env


def _json_reports(text: str) -> list:
    return [json.loads(line[line.index('{"task"'):]) for line in text.splitlines() if '{"task"' in line]


def test_killed_worker_ray_restarts_group_and_resumes_to_uninterrupted_weights(ray_cluster, tmp_path):
    """worker:1 SIGKILLs itself mid-epoch 1; Ray restarts the worker group (--max-restarts 1) and both workers
    resume from tfaccel's backup to the weights of an uninterrupted run."""
    ref, run = tmp_path / "ref", tmp_path / "run"
    ref.mkdir()
    run.mkdir()
    common = ["--backend", "ray", "--workers", "2", "--address", ray_cluster.address, "--timeout", "280",
              "--storage-path", str(tmp_path / "storage")]
    done = ray_util.launch([*common, "--", str(REL_JOB)], cluster=ray_cluster, env=_rel_env(ref), timeout=300)
    assert done.returncode == 0, done.stdout[-4000:]
    done = ray_util.launch([*common, "--max-restarts", "1", "--", str(REL_JOB)], cluster=ray_cluster,
                           env=_rel_env(run, REL_KILL_AT="worker:1:1:7"), timeout=300)
    assert done.returncode == 0, done.stdout[-4000:]
    assert (run / "killed").read_text().strip() == "1:7"
    assert re.search(r"\[worker 1\] REL: worker:1 kills itself after epoch 1 step 7", done.stdout)
    assert re.search(r"Ray Train finished OK after 1 restart", done.stdout), done.stdout[-3000:]
    reports = _json_reports(done.stdout)
    assert sorted(r["task"] for r in reports) == ["worker:0", "worker:1"], reports
    assert {tuple(r["resumed_from"]) for r in reports} == {(1, 5)}, reports
    for task in ("worker0", "worker1"):
        _same_weights(ref / "w-worker0.npz", run / f"w-{task}.npz", atol=1e-5)
    assert not (run / "backup").exists(), "the backup was not removed after training completed"


def test_worker_that_raises_fails_the_launch_naming_it_within_60s(ray_cluster, tmp_path):
    """A worker's command raises: the launcher exits with its code (1), names worker:1, within 60 s."""
    began = time.time()
    done = ray_util.launch(["--backend", "ray", "--workers", "2", "--address", ray_cluster.address,
                            "--storage-path", str(tmp_path / "storage"), "--timeout", "200", "--",
                            str(ray_util.SCRIPTS / "fit_job.py")],
                           cluster=ray_cluster, env={"JOB_RAISE_RANK": "1", "JOB_OUT": str(tmp_path)}, timeout=220)
    ended = time.time()
    assert done.returncode == 1, done.stdout[-4000:]
    raised = re.search(r"\[worker 1\] JOB: worker:1 raises at ([\d.]+)", done.stdout)
    assert raised, done.stdout[-4000:]
    assert "ValueError: worker 1 was told to fail" in done.stdout
    assert re.search(r"tfaccel ERROR: launch: worker:1 \(pid \d+, Ray node 127\.0\.0\.1\) failed: exit code 1",
                     done.stdout), done.stdout[-4000:]
    assert ended - float(raised.group(1)) < 60, f"the launcher exited {ended - float(raised.group(1)):.0f} s later"
    assert ended - began < 200
