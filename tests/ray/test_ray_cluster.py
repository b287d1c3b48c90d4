"""tfaccel on a real two-node Ray cluster (`ray start --head` + `ray start --address`, both on 127.0.0.1)."""

import json
import random
import re
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import harness
import ray_util
import rel_ray

pytestmark = pytest.mark.slow


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


@pytest.fixture(scope="module")
def reference(ray_cluster, tmp_path_factory):
    """The uninterrupted 2-worker run of the resume job on the cluster (multi_worker, one worker per node)."""
    ref = rel_ray.r1_ray_reference(tmp_path_factory.mktemp("ray-reference"), cluster=ray_cluster)
    assert ref["ok"], ref["why"]
    assert sorted(r["task"] for r in ref["reports"]) == ["worker:0", "worker:1"], ref["reports"]
    assert all(r["strategy"] == "multi_worker" and r["replicas"] == 2 for r in ref["reports"]), ref["reports"]
    assert all(r["resumed_from"] is None and r["restart"] == "0" for r in ref["reports"]), ref["reports"]
    _same_weights(Path(ref["weights"]), Path(ref["weights"]).with_name("weights-1.npz"))
    return ref


@pytest.mark.parametrize("victim, what", [(1, "command"), (0, "ray_worker")])
def test_killed_worker_ray_restarts_group_and_resumes_to_uninterrupted_weights(ray_cluster, reference, tmp_path,
                                                                               victim, what):
    """A worker dies right after step 7 of epoch 1 (its training command SIGKILLed, or the chief's Ray worker
    process itself); Ray restarts the worker group (--max-restarts 1), both workers resume from tfaccel's backup
    at step 5 and end with the uninterrupted run's weights; the backup is removed; no job process survives."""
    result = rel_ray.r1_ray_trial(tmp_path, Path(reference["weights"]), rng=random.Random(0), what=what,
                                  cluster=ray_cluster, victim=victim, kill_at=(1, 7))
    assert result["ok"], result["why"]
    # backups are written in the background: the step-5 one may still have been in flight when the chief's worker
    # died after step 7, and then both resume from the epoch end's (the kill tally's promise: the last complete one)
    assert result["resumed_from"] in ([(1, 5)], [(1, 0)]) and result["restarts"] == 1, result
    assert (tmp_path / "killed").read_text().strip() == "1:7"
    if what == "command":  # tfaccel's worker function reports the command's death (its last line reaches Ray)
        assert re.search(rf"\[worker {victim}\] JOB: worker:{victim} SIGKILLs command \(pid \d+\) after epoch 1 "
                         rf"step 7", result["text"]), result["text"][-3000:]
        assert re.search(rf"worker:{victim} \(pid \d+, Ray node 127\.0\.0\.1\) failed: killed by SIGKILL",
                         result["text"]), result["text"][-3000:]
    else:  # Ray's worker process is gone with whatever it had not yet forwarded: Ray says so itself
        assert "The actor is dead because its worker process has died" in result["text"], result["text"][-3000:]


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
    print(f"the launcher exited {ended - float(raised.group(1)):.1f} s after the raise, {ended - began:.1f} s after "
          "it started")  # the measurement README's Ray section quotes (pytest -rA shows it)
    assert ended - float(raised.group(1)) < 60, f"the launcher exited {ended - float(raised.group(1)):.0f} s later"
    assert ended - began < 200


def test_dead_ray_worker_process_without_restarts_left_fails_the_launch_naming_it(ray_cluster, tmp_path):
    """Ray's own worker process of worker:1 SIGKILLed with --max-restarts 0: the launcher exits 1 naming that
    worker's process (not worker:0, whose command only lost its peer)."""
    done = ray_util.launch(["--backend", "ray", "--workers", "2", "--address", ray_cluster.address,
                            "--storage-path", str(tmp_path / "storage"), "--timeout", "250", "--", str(rel_ray.JOB)],
                           cluster=ray_cluster, timeout=270,
                           env={"JOB_OUT": str(tmp_path), "JOB_KILL_AT": "1:0:2", "JOB_KILL_WHAT": "ray_worker",
                                "JOB_KILL_MARKER": str(tmp_path / "killed"), "JOB_BACKUP_DIR": str(tmp_path / "b")})
    assert done.returncode == 1, done.stdout[-4000:]
    assert (tmp_path / "killed").read_text().strip() == "0:2"
    assert re.search(r"tfaccel ERROR: launch: worker:1 \(Ray Train worker process\) failed: \S", done.stdout), \
        done.stdout[-4000:]
