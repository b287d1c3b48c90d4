"""Issue 38 (1): tfaccel under a real SLURM (Debian's slurmctld/slurmd, started by scripts/local_slurm.sh).

One tiny training script (tests/slurm/scripts/slurm_job.py, strategy "auto", no cluster code) run three ways:
``srun -n 2 python job.py`` (the reference), ``srun -n 3 tfaccel launch --ps 1``, and the documented batch script
(scripts/slurm_train.sbatch: ``srun tfaccel launch -- python job.py``) under ``sbatch``, preempted with
``scancel --signal=USR1`` mid-training and requeued by the script itself. Every job runs on the one node of
partition ``debug`` (this host's name, which resolves), with ports from the OS (TFACCEL_SLURM_PORT).
"""

import json
import socket
import time
from pathlib import Path
from typing import Dict, List

import numpy as np
import pytest

JOB = Path(__file__).resolve().parent / "scripts" / "slurm_job.py"
SBATCH = Path(__file__).resolve().parents[2] / "scripts" / "slurm_train.sbatch"


def _reports(text: str) -> List[dict]:
    """The JSON line each training task printed (``JOB {...}``, maybe after a launcher's ``[worker 1]`` prefix)."""
    return [json.loads(line.split("JOB ", 1)[1]) for line in text.splitlines() if "JOB {" in line]


def _weights(out: Path, rank: str) -> List[np.ndarray]:
    with np.load(out / f"weights-{rank}.npz") as data:
        return [data[f"arr_{i}"] for i in range(len(data.files))]


def _same(a: List[np.ndarray], b: List[np.ndarray]) -> float:
    assert [w.shape for w in a] == [w.shape for w in b]
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def reference(slurm, tmp_path_factory) -> Dict[str, object]:
    """``srun -n 2 python job.py``: auto must pick multi_worker from SLURM; the two tasks end equal."""
    out = tmp_path_factory.mktemp("srun-python")
    run = slurm.run(["srun", "-n", "2", "-N", "1", "python", str(JOB)], timeout=240,
                    env={"JOB_OUT": str(out), "TFACCEL_SLURM_PORT": slurm.free_port()})
    assert run.returncode == 0, run.stderr[-4000:]
    reports = sorted(_reports(run.stdout), key=lambda r: r["rank"])
    return {"out": out, "reports": reports, "stderr": run.stderr}


def test_srun_python_trains_one_multi_worker_job(reference) -> None:
    reports = reference["reports"]
    assert [r["rank"] for r in reports] == ["0", "1"], reference["stderr"][-3000:]
    for report in reports:
        assert report["strategy"] == "multi_worker" and report["replicas"] == 2, report
        assert report["reason"] == "SLURM describes 2 tasks (worker x2) without ps tasks"
    assert [r["task"] for r in reports] == ["worker:0", "worker:1"]
    assert _same(_weights(reference["out"], "0"), _weights(reference["out"], "1")) == 0.0
    assert reports[0]["loss"] == reports[1]["loss"] and reports[0]["loss"][-1] < reports[0]["loss"][0]


def test_srun_tfaccel_launch_ps_gives_rank_0_the_chief_and_rank_1_the_ps(slurm, tmp_path) -> None:
    run = slurm.run(["srun", "-n", "3", "-N", "1", "tfaccel", "launch", "--ps", "1", "--", "python", str(JOB)],
                    timeout=300, env={"JOB_OUT": str(tmp_path), "TFACCEL_SLURM_PORT": slurm.free_port(),
                                      "JOB_EPOCHS": "1"})
    assert run.returncode == 0, run.stderr[-4000:]
    (report,) = _reports(run.stdout)  # the chief alone runs the command; ps and worker run servers
    assert report["rank"] == "0" and report["task"] == "chief:0" and report["strategy"] == "parameter_server"
    assert report["reason"] == "TF_CONFIG describes 3 tasks (chief x1, worker x1, ps x1) including ps tasks"
    assert len(report["loss"]) == 1 and report["loss"][0] < 1.0
    for role in ("chief:0", "ps:0", "worker:0"):
        assert f"this srun task is {role}" in run.stderr


def test_ps_count_from_the_environment_and_local_options_refused_inside_srun(slurm) -> None:
    dry = slurm.run(["srun", "-n", "3", "-N", "1", "tfaccel", "launch", "--dry-run", "--", "python", str(JOB)],
                    env={"TFACCEL_SLURM_PS": "1", "TFACCEL_SLURM_PORT": "23456"}, timeout=120)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert dry.stdout.count("strategy hint parameter_server") == 3
    host = socket.gethostname().split(".")[0]  # the node of partition debug (scripts/local_slurm.sh)
    for line in (f"chief:0  {host}:23456  command", f"ps:0  {host}:23457  server", f"worker:0  {host}:23458  server"):
        assert line in dry.stdout, dry.stdout
    refused = slurm.run(["srun", "-n", "2", "-N", "1", "tfaccel", "launch", "--workers", "2", "--", "true"],
                        timeout=120)
    assert refused.returncode == 2
    assert "--workers: this launcher runs inside a SLURM job step" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_the_documented_batch_script_survives_a_preemption_and_its_requeue(slurm, reference, tmp_path) -> None:
    """scripts/slurm_train.sbatch as written (the guide includes this file): USR1 mid-training -> every task stops
    at an agreed step, backup written, exit 75 -> the script requeues the job -> it resumes and ends with the
    uninterrupted run's weights."""
    log = tmp_path / "job.out"
    env = {"JOB_OUT": str(tmp_path), "JOB_BACKUP": str(tmp_path / "backup"), "JOB_SLEEP": "0.3",
           "TFACCEL_SLURM_PORT": slurm.free_port()}
    sub = slurm.run(["sbatch", "--parsable", "-N", "1", f"--output={log}", str(SBATCH), "python", str(JOB)],
                    env=env, timeout=60)
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 300  # a loaded machine (a load of 15 on 2 cores) took over 180 s once
    while "JOB: training" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, f"job {job_id} never started training: {slurm.job_state(job_id)}"
        time.sleep(0.2)
    time.sleep(1.0)
    signal = slurm.run(["scancel", "--signal=USR1", job_id], timeout=30)
    assert signal.returncode == 0, signal.stderr
    slurm.wait_state(job_id, ["COMPLETED", "FAILED", "CANCELLED"], timeout=240)
    text = log.read_text()
    assert slurm.job_state(job_id) == "COMPLETED", text[-4000:]
    assert "exit status 75" in text or "exiting with 75" in text, text[-4000:]
    show = slurm.run(["scontrol", "show", "job", job_id], timeout=30).stdout
    assert "Restarts=1" in show, show
    # srun tfaccel launch: one cluster of srun's two tasks (before issue 38 each srun task started a 2-worker local
    # cluster of its own: 4 processes in 2 separate trainings, 4 reports, ranks 0, 0, 1, 1)
    assert "this srun task is worker:0" in text and "this srun task is worker:1" in text
    final = sorted(_reports(text), key=lambda r: r["rank"])
    assert [r["rank"] for r in final] == ["0", "1"], text[-4000:]
    assert all(r["reason"] == "TF_CONFIG describes 2 tasks (worker x2) without ps tasks" for r in final)
    assert all(r["resumed_from"] for r in final), final  # the second run started from the backup
    diffs = [_same(_weights(tmp_path, rank), _weights(reference["out"], "0")) for rank in ("0", "1")]
    print(f"\nslurm: preempted + requeued job against the uninterrupted run: max weight difference {max(diffs)}")
    assert max(diffs) <= 1e-6
