"""Issue 9's R1 under Horovod: kill a rank at a random step, the job restarts all ranks, resumes, same result.

Shared by tests/reliability/test_reliability_horovod.py (1 trial) and scripts/reliability.py (``--r1-horovod N``).
Real processes on 127.0.0.1 through the real front end::

    python -m tfaccel launch --backend horovod -np 2 --max-restarts 1 -- rel_job.py

``rel_job.py`` (the same compile_and_fit job as the MultiWorkerMirrored R1) runs with ``backup_dir`` and a
``backup_freq``; the victim rank SIGKILLs itself right after a seeded random step, once. horovodrun ends the
other rank, the launcher runs horovodrun again, both ranks resume from rank 0's last step backup, and the final
weights of both ranks must equal those of an uninterrupted run. Every process is bounded by a timeout; ranks
(which horovodrun starts in their own sessions) are found by their command line and marker path and killed
if any outlives its launch.
"""

import random
import re
import sys
from pathlib import Path
from typing import Any, Dict, List

import rel_scenarios as rs

EPOCHS = 2  # 2 x 23 steps: enough for a kill inside epoch 0 or 1 and a resume across an epoch end
NP = 2
RANKS = tuple(f"rank:{i}" for i in range(NP))
_RESTARTS_RE = re.compile(r"job finished OK in [\d.]+ s after (\d+) restart")


def _env(work: Path, **extra: Any) -> Dict[str, str]:
    return rs.job_env(work, REL_EPOCHS=EPOCHS, **extra)


def leftover_ranks(work: Path) -> List[int]:
    """PIDs of rel_job.py ranks still alive whose environment points into ``work`` (they must all be gone)."""
    import psutil

    found = []
    marker = str(work / "killed")
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if str(rs.JOB) in " ".join(proc.info["cmdline"] or []) and proc.environ().get("REL_KILL_MARKER") == marker:
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _finish(run: "rs.Run", work: Path, timeout: float) -> List[int]:
    run.wait(timeout)
    left = leftover_ranks(work)
    for pid in left:  # report them, and do not let them outlive the trial
        rs.with_suppress_kill(pid)
    return left


def r1_horovod_reference(work: Path, *, timeout: float = 240) -> Dict[str, Any]:
    """The uninterrupted 2-rank Horovod job; its rank 0 weights are what every interrupted run must end with."""
    work.mkdir(parents=True, exist_ok=True)
    run = rs.Run(["--backend", "horovod", "-np", str(NP), "--gloo-timeout", "120", "--timeout", str(timeout - 10),
                  "--", str(rs.JOB)],
                 env=_env(work, REL_BACKUP_DIR=work / "ref-backup", REL_WEIGHTS_OUT=work / "ref-{task}.npz"))
    left = _finish(run, work, timeout)
    weights = work / "ref-rank0.npz"
    ok = run.returncode == 0 and weights.exists() and (work / "ref-rank1.npz").exists() and not left
    return rs.outcome(ok, "" if ok else f"reference run failed (rc={run.returncode}, ranks left {left}):\n{run.tail()}",
                      weights=str(weights), seconds=round(run.seconds, 1),
                      backup_left=(work / "ref-backup").exists())


def _per_rank_dir_command() -> List[str]:
    """The job with ``REL_BACKUP_DIR/rank<N>`` as each rank's backup_dir: ranks on hosts without a shared disk."""
    script = 'export REL_BACKUP_DIR="$REL_BACKUP_DIR/rank$HOROVOD_RANK"; exec "$0" "$@"'
    return ["sh", "-c", script, sys.executable, str(rs.JOB)]


def r1_horovod_trial(work: Path, reference: Path, *, rng: random.Random, timeout: float = 300,
                     atol: float = 1e-5, rtol: float = 1e-5, per_rank_dirs: bool = False) -> Dict[str, Any]:
    """R1 under Horovod: one rank of a 2-rank job SIGKILLs itself at a random step; with ``--max-restarts 1`` the
    job restarts once, resumes from one backup on both ranks, and ends with the reference weights on both.

    ``per_rank_dirs``: every rank gets its own backup_dir (as on hosts without a shared disk), so only rank 0's
    holds backups; the other rank must resume at rank 0's position with rank 0's broadcast weights."""
    work.mkdir(parents=True, exist_ok=True)
    victim = rng.choice(RANKS)
    epoch, step = rng.randrange(EPOCHS), rng.randrange(1, rs.STEPS_PER_EPOCH)
    command = _per_rank_dir_command() if per_rank_dirs else [str(rs.JOB)]
    run = rs.Run(["--backend", "horovod", "-np", str(NP), "--max-restarts", "1", "--gloo-timeout", "120",
                  "--timeout", str(timeout - 10), "--", *command],
                 env=_env(work, REL_BACKUP_DIR=work / "backup", REL_WEIGHTS_OUT=work / "res-{task}.npz",
                          REL_KILL_AT=f"{victim}:{epoch}:{step}"))
    left = _finish(run, work, timeout)
    measured: Dict[str, Any] = {"victim": victim, "kill_at": [epoch, step], "seconds": round(run.seconds, 1)}
    if per_rank_dirs:
        measured["per_rank_dirs"] = True
    if left:
        return rs.outcome(False, f"rank processes outlived the launch: {left}", **measured)
    if run.returncode != 0:
        return rs.outcome(False, f"job failed (rc={run.returncode}, timed out={run.timed_out}):\n{run.tail()}",
                          **measured)
    if not (work / "killed").exists():
        return rs.outcome(False, "the victim was never killed", **measured)
    restarts = [int(m) for m in _RESTARTS_RE.findall(run.text)]
    reports = run.json_lines()
    resumed = {tuple(r["resumed_from"]) if r["resumed_from"] else None for r in reports}
    measured.update(restarts=restarts[-1] if restarts else 0, resumed_from=sorted(resumed, key=str),
                    reports=len(reports))
    allowed = rs.expected_resume(epoch, step, victim_is_chief=victim == "rank:0")
    if measured["restarts"] != 1 or len(reports) != NP or len(resumed) != 1 or next(iter(resumed)) not in allowed:
        return rs.outcome(False, f"expected one restart, {NP} ranks resuming from one of {allowed}; got {measured}\n"
                          f"{run.tail()}", **measured)
    if per_rank_dirs and next(iter(resumed)) is not None and "resumes at rank 0's backup" not in run.text:
        return rs.outcome(False, f"rank 1 did not say it resumes at rank 0's backup:\n{run.tail()}", **measured)
    mismatch, max_diff = rs.compare_weights(reference, work, ("rank0", "rank1"), rtol=rtol, atol=atol)
    if mismatch:
        return rs.outcome(False, mismatch, **measured, max_abs_diff=max_diff)
    if (work / "backup" / "rank0" if per_rank_dirs else work / "backup").exists():
        return rs.outcome(False, "the backup directory was not removed after training completed", **measured,
                          max_abs_diff=max_diff)
    return rs.outcome(True, **measured, max_abs_diff=max_diff)
