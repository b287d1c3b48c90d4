"""Issue 9's R1 on Ray (issue 14): a worker dies mid-epoch, Ray restarts the worker group, the job resumes from
tfaccel's backup and ends with the weights of an uninterrupted run.

Shared by tests/ray/test_ray_cluster.py (on a two-node ``ray start`` cluster) and scripts/reliability.py
(``--r1_ray N``, each trial on its own private local Ray instance). Real processes through the real front end::

    python -m tfaccel launch --backend ray --workers 2 --max-restarts 1 [--address ADDR] -- resume_job.py

The victim is a seeded random rank at a seeded random step; it dies in one of two ways, alternating: the
training command SIGKILLs itself (tfaccel's worker function reports the exit and fails the group), or it
SIGKILLs its parent, Ray's own worker process (Ray Train's worker-died path). Every process carries a mark in its
environment; whatever carries it after the run is reported and SIGKILLed.
"""

import dataclasses
import json
import random
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

HERE = Path(__file__).resolve().parent
for _path in (HERE, HERE.parent, HERE.parent / "reliability"):  # ray_util, harness, rel_scenarios
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import rel_scenarios as rs  # noqa: E402
import ray_util  # noqa: E402
from tfaccel.launch.procs import pid_alive  # noqa: E402

JOB = HERE / "scripts" / "resume_job.py"
EPOCHS = 2  # 2 x 23 steps of the digits job: a kill inside epoch 0 or 1, a resume across an epoch end
KILL_WHAT = ("command", "ray_worker")
_RESTARTS_RE = re.compile(r"Ray Train finished OK after (\d+) restart")


@dataclasses.dataclass
class RayRun:
    """One finished ``python -m tfaccel launch --backend ray ...``: exit code, output, time, survivors."""

    returncode: int
    text: str
    seconds: float
    left: List[int]

    def json_lines(self) -> List[dict]:
        """The job's JSON reports (lines holding ``{"task": ...}``, after any ``[worker i]`` prefix)."""
        return rs.job_reports(self.text.splitlines())

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.text.splitlines()[-n:])


def _run(work: Path, *, cluster: Optional["ray_util.RayCluster"], timeout: float, restarts: int,
         env: Dict[str, str]) -> RayRun:
    """Runs the job bounded by ``timeout``; processes of it that outlive it are listed and SIGKILLed."""
    work.mkdir(parents=True, exist_ok=True)
    mark = cluster.mark if cluster is not None else f"rel-ray-{uuid.uuid4().hex[:12]}"
    where = ["--address", cluster.address] if cluster is not None else []
    args = ["--backend", "ray", "--workers", "2", *where, "--max-restarts", str(restarts), "--timeout",
            str(int(timeout - 15)), "--storage-path", str(work / "storage"), "--", str(JOB)]
    began = time.monotonic()
    done = ray_util.launch(args, mark=mark, cluster=cluster, timeout=timeout,
                           env={**env, "JOB_OUT": str(work), "JOB_EPOCHS": str(EPOCHS)})
    seconds = time.monotonic() - began
    if cluster is None:
        left = ray_util.kill_marked(mark, wait=15)
    else:  # the cluster's own processes carry its mark: here only the job's commands must be gone
        left = [pid for pid in _job_pids(work)]
        for pid in left:
            rs.with_suppress_kill(pid)
    return RayRun(done.returncode, done.stdout, seconds, left)


def _job_pids(work: Path) -> List[int]:
    """PIDs of live resume_job.py processes writing into ``work``."""
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if (str(JOB) in " ".join(proc.info["cmdline"] or []) and proc.environ().get("JOB_OUT") == str(work)
                    and pid_alive(proc.pid)):
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _result(ok: bool, why: str = "", **measured: Any) -> Dict[str, Any]:
    return {"ok": bool(ok), "why": why, **measured}


def compare_weights(reference: Path, work: Path, *, rtol: float, atol: float) -> "tuple[Optional[str], float]":
    """Compares both workers' ``weights-<rank>.npz`` with the reference: (None or what differs, largest difference)."""
    import numpy as np

    ref = np.load(reference)
    diffs: List[float] = [0.0]
    for rank in (0, 1):
        res = np.load(work / f"weights-{rank}.npz")
        for key in ref.files:
            diffs.append(float(np.max(np.abs(res[key] - ref[key]))))
            if not np.allclose(res[key], ref[key], rtol=rtol, atol=atol):
                return f"worker:{rank} weights {key} differ from the reference by {diffs[-1]:.3g}", max(diffs)
    return None, max(diffs)


def r1_ray_reference(work: Path, *, cluster: Optional["ray_util.RayCluster"] = None,
                     timeout: float = 420) -> Dict[str, Any]:
    """The uninterrupted 2-worker run on Ray; its worker 0 weights are what every interrupted run must end with."""
    run = _run(work, cluster=cluster, timeout=timeout, restarts=0, env={})
    reports = run.json_lines()
    ok = (run.returncode == 0 and (work / "weights-0.npz").exists() and (work / "weights-1.npz").exists()
          and not run.left)
    why = "" if ok else f"reference run failed (rc={run.returncode}, left alive {run.left}):\n{run.tail()}"
    return _result(ok, why, weights=str(work / "weights-0.npz"), seconds=round(run.seconds, 1),
                      reports=reports, text=run.text)


def r1_ray_trial(work: Path, reference: Path, *, rng: random.Random, what: Optional[str] = None,
                 cluster: Optional["ray_util.RayCluster"] = None, timeout: float = 480, atol: float = 1e-5,
                 rtol: float = 1e-5, victim: Optional[int] = None,
                 kill_at: Optional[Sequence[int]] = None) -> Dict[str, Any]:
    """R1 on Ray: one worker of a 2-worker job dies after a (seeded random) step, by ``what`` (see the module);
    with ``--max-restarts 1`` Ray restarts the group once, both workers resume from one backup and end with the
    reference weights, the backup is removed, and no process of the run survives it."""
    victim = rng.randrange(2) if victim is None else victim
    epoch, step = (rng.randrange(EPOCHS), rng.randrange(1, rs.STEPS_PER_EPOCH)) if kill_at is None else kill_at
    what = what or rng.choice(KILL_WHAT)
    run = _run(work, cluster=cluster, timeout=timeout, restarts=1,
                     env={"JOB_KILL_AT": f"{victim}:{epoch}:{step}", "JOB_KILL_WHAT": what,
                          "JOB_KILL_MARKER": str(work / "killed")})
    measured: Dict[str, Any] = {"victim": f"worker:{victim}", "what": what, "kill_at": [epoch, step],
                                "seconds": round(run.seconds, 1)}
    verdict = _trial_verdict(run, work, victim=victim, epoch=epoch, step=step, measured=measured)
    if verdict is not None:
        return _result(False, verdict, **measured, text=run.text)
    mismatch, max_diff = compare_weights(reference, work, rtol=rtol, atol=atol)
    if mismatch:
        return _result(False, mismatch, **measured, max_abs_diff=max_diff, text=run.text)
    return _result(True, **measured, max_abs_diff=max_diff, text=run.text)


def _trial_verdict(run: RayRun, work: Path, *, victim: int, epoch: int, step: int,
                   measured: Dict[str, Any]) -> Optional[str]:
    """What went wrong in a trial (None: the run itself kept every promise; the weights are compared next)."""
    if run.left:
        return f"processes outlived the launch: {run.left}"
    if run.returncode != 0:
        return f"job failed (rc={run.returncode}):\n{run.tail()}"
    if not (work / "killed").exists():
        return "the victim was never killed"
    restarts = [int(m) for m in _RESTARTS_RE.findall(run.text)]
    reports = run.json_lines()
    resumed = {tuple(r["resumed_from"]) if r["resumed_from"] else None for r in reports}
    measured.update(restarts=restarts[-1] if restarts else 0, resumed_from=sorted(resumed, key=str),
                    reports=len(reports), restart_env=sorted({str(r.get("restart")) for r in reports}))
    allowed = rs.expected_resume(epoch, step, victim_is_chief=victim == 0)
    if measured["restarts"] != 1 or len(reports) != 2 or len(resumed) != 1 or next(iter(resumed)) not in allowed:
        return f"expected one restart, 2 workers resuming from one of {allowed}; got {measured}\n{run.tail()}"
    if measured["restart_env"] != ["1"]:
        return f"TFACCEL_RESTART_COUNT of the restarted workers: expected 1, got {measured['restart_env']}"
    backup = reports[0].get("backup_dir")
    if not backup or Path(backup).exists():
        return f"the backup directory {backup} was not removed after training completed"
    scratch = Path(backup).parent / ".tfaccel-workers"  # on a cluster: the workers' files in the run's storage
    if scratch.exists():
        return f"the workers' temporary files were left in {scratch}: {sorted(p.name for p in scratch.iterdir())}"
    return None


def summary(result: Dict[str, Any]) -> str:
    """One line of a trial's measurements (no output text)."""
    return json.dumps({k: v for k, v in result.items() if k not in ("ok", "why", "text", "reports")})
