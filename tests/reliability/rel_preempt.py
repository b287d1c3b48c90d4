"""Preemption (issue 25): SIGTERM to one process of a running job, from outside, at a random step.

One trial: ``tfaccel launch`` runs the reliability job (rel_job.py, backups on); when the victim announces the
chosen step it is sent SIGTERM by this harness, which then watches every process of that attempt until it is gone.
The promise: every process exits with ``EXIT_PREEMPTED`` within the grace period, all of them stopped at the same
(epoch, step), the launcher restarts the job without spending a ``--max-restarts`` restart, the restart resumes at
exactly that step (0 steps lost) and ends with the uninterrupted run's weights (max abs difference <= 1e-6).
Shared by tests/reliability and scripts/reliability.py. Nothing here imports TensorFlow.
"""

import os
import random
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import rel_scenarios as rs  # noqa: E402
from tfaccel.errors import EXIT_PREEMPTED  # noqa: E402
from tfaccel.launch.procs import pid_alive  # noqa: E402

GRACE_S = 30.0  # GCE spot and Kubernetes' default terminationGracePeriodSeconds
_READY_RE = re.compile(r"REL: (\S+) ready for a preemption signal after epoch (\d+) step (\d+) pid=(\d+)")
_TRAINS_RE = re.compile(r"REL: (\S+) trains pid=(\d+)")
_STOP_RE = re.compile(r"preemption: (.+?) stops at epoch (\d+), step (\d+)")
_RESTART_RE = re.compile(r"restarting the whole job .*preempt", re.IGNORECASE)


def _watch_exits(pids: Sequence[int], exits: Dict[int, float], stop: threading.Event) -> None:
    """Notes when each pid is gone (polled every 10 ms)."""
    while not stop.is_set() and len(exits) < len(pids):
        for pid in pids:
            if pid not in exits and not pid_alive(pid):
                exits[pid] = time.monotonic()
        time.sleep(0.01)


def _signal_when_ready(run: rs.Run, *, processes: int, timeout: float) -> Dict[str, Any]:
    """Waits for the victim's announcement, sends it SIGTERM, and times every process of the attempt until gone."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and run.proc.poll() is None:
        ready = [m for _, _, line in list(run.lines) for m in [_READY_RE.search(line)] if m]
        pids = {m.group(1): int(m.group(2)) for _, _, line in list(run.lines) for m in [_TRAINS_RE.search(line)] if m}
        if ready and len(pids) >= processes:
            victim, epoch, step, pid = ready[0].group(1), int(ready[0].group(2)), int(ready[0].group(3)), \
                int(ready[0].group(4))
            os.kill(pid, signal.SIGTERM)
            sent = time.monotonic()
            exits: Dict[int, float] = {}
            stop = threading.Event()
            watcher = threading.Thread(target=_watch_exits, args=(list(pids.values()), exits, stop), daemon=True)
            watcher.start()
            watcher.join(GRACE_S + 15)
            stop.set()
            return {"victim": victim, "signalled_after": [epoch, step],
                    "exit_s": {name: round(exits[p] - sent, 2) if p in exits else None for name, p in pids.items()}}
        time.sleep(0.02)
    return {}


def preempt_trial(work: Path, reference: Path, *, rng: random.Random, launch: Sequence[str] = ("--workers", "2"),
                  tasks: Sequence[str] = ("worker0", "worker1"), victims: Sequence[str] = ("worker:0", "worker:1"),
                  env: Optional[Dict[str, str]] = None, timeout: float = 360, atol: float = 1e-6) -> Dict[str, Any]:
    """SIGTERM to one process at a random step; see the module doc for what must hold.

    Args:
        launch: the launch options before ``--max-restarts 0`` (the path). tasks: the processes that train (their
            weights files). victims: who may get the signal. env: the job's extra variables.
    """
    work.mkdir(parents=True, exist_ok=True)
    victim = rng.choice(list(victims))
    # Never in the last epoch: with the checks held to ~1% of the training time, a signal in the job's last steps
    # may come after its last check, and the job then simply completes (tests/training/test_preemption.py).
    epoch = rng.randrange(int((env or {}).get("REL_EPOCHS", rs.EPOCHS)) - 1)
    step = rng.randrange(1, rs.STEPS_PER_EPOCH - 1)
    run = rs.Run([*launch, "--max-restarts", "0", "--timeout", str(timeout - 10), "--", str(rs.JOB)],
                 env=rs.job_env(work, REL_BACKUP_DIR=work / "backup", REL_WEIGHTS_OUT=work / "res-{task}.npz",
                                 REL_PREEMPT_AT=f"{victim}:{epoch}:{step}", REL_STEP_SLEEP="0.02", **(env or {})))
    signalled = _signal_when_ready(run, processes=len(tasks), timeout=timeout)
    run.wait(max(5.0, timeout - run.seconds if run.seconds else timeout))
    measured: Dict[str, Any] = {"victim": victim, "chosen": [epoch, step], "seconds": round(time.monotonic() -
                                                                                           run.begun, 1), **signalled}
    return _verdict(run, work, reference, measured, tasks=tasks, atol=atol)


def _verdict(run: rs.Run, work: Path, reference: Path, measured: Dict[str, Any], *, tasks: Sequence[str],
             atol: float) -> Dict[str, Any]:
    if not measured.get("exit_s"):
        return rs.outcome(False, f"the victim never announced its step (rc={run.returncode}):\n{run.tail()}",
                          **measured)
    slow = {name: s for name, s in measured["exit_s"].items() if s is None or s > GRACE_S}
    stops = sorted({(int(m.group(2)), int(m.group(3))) for m in _STOP_RE.finditer(run.text)})
    measured.update(stopped_at=[list(s) for s in stops], rc=run.returncode,
                    max_exit_s=max((s for s in measured["exit_s"].values() if s is not None), default=None))
    if slow:
        return rs.outcome(False, f"processes still alive {GRACE_S:g} s after the signal: {slow}\n{run.tail()}",
                          **measured)
    # tfaccel's launcher logs every task's exit status (under Ray: each worker's, then the driver's); horovodrun
    # names the first rank that exited
    statuses = re.findall(r"after the preemption: (.*)", run.text)
    horovod = re.findall(r"Exit code: (\d+)", run.text)
    measured["exit_statuses"] = "; ".join(statuses) if statuses else (
        f"horovodrun: first rank exit code {horovod[0]}" if horovod else None)
    every_75 = sum(line.count(f"exit code {EXIT_PREEMPTED}") for line in statuses) >= len(tasks) or \
        not statuses and horovod[:1] == [str(EXIT_PREEMPTED)]
    if len(stops) != 1 or len(_STOP_RE.findall(run.text)) != len(tasks) or not every_75:
        return rs.outcome(False, f"expected every process to stop at one step and exit {EXIT_PREEMPTED}; got stops "
                          f"{stops}, exits {measured['exit_statuses']}:\n{run.tail(60)}", **measured)
    if run.returncode != 0 or not _RESTART_RE.search(run.text):
        return rs.outcome(False, f"the launcher did not restart the preempted job to completion (rc={run.returncode}"
                          f", timed out={run.timed_out}):\n{run.tail(60)}", **measured)
    reports = run.json_lines()
    resumed = {tuple(r["resumed_from"]) if r["resumed_from"] else None for r in reports}
    measured["resumed_from"] = sorted(resumed, key=str)
    measured["steps_lost"] = None if len(resumed) != 1 or None in resumed else \
        (stops[0][0] - next(iter(resumed))[0]) * rs.STEPS_PER_EPOCH + stops[0][1] - next(iter(resumed))[1]
    if len(reports) != len(tasks) or measured["steps_lost"] != 0:
        return rs.outcome(False, f"expected {len(tasks)} reports resuming at {stops[0]}; got {measured}", **measured)
    restarts = [r.get("restarts") for r in reports]
    measured["restarts_reported"] = restarts[0]
    if any(not r or r[-1].get("why") != "preemption" or r[-1].get("steps_lost") != 0
           or r[-1].get("resumed_from") != list(stops[0]) for r in restarts):
        return rs.outcome(False, f"FitResult.details['restarts'] does not say: a preemption, resumed from "
                          f"{stops[0]}, 0 steps lost: {restarts}", **measured)
    mismatch, max_diff = rs.compare_weights(reference, work, tasks, rtol=0.0, atol=atol)
    measured["max_abs_diff"] = max_diff
    if mismatch:
        return rs.outcome(False, mismatch, **measured)
    if (work / "backup").exists():
        return rs.outcome(False, "the backup directory was not removed after training completed", **measured)
    return rs.outcome(True, **measured)


def summary(results: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The tally: runs, promises kept, the slowest signal-to-exit, steps lost, the largest weight difference."""
    exits = [r["max_exit_s"] for r in results if r.get("max_exit_s") is not None]
    return {"runs": len(results), "ok": sum(1 for r in results if r["ok"]),
            "signal_to_exit_s": {"max": max(exits), "median": sorted(exits)[len(exits) // 2]} if exits else None,
            "steps_lost": sorted({r.get("steps_lost") for r in results}, key=str),
            "max_abs_diff": max((r.get("max_abs_diff") or 0.0 for r in results), default=None)}


def main_line(result: Dict[str, Any]) -> str:
    """One line per trial for the tally script."""
    keys = ("victim", "signalled_after", "stopped_at", "exit_s", "resumed_from", "steps_lost", "max_abs_diff",
            "seconds")
    return " ".join(f"{k}={result.get(k)}" for k in keys if k in result)



def ps_reference(work: Path, *, timeout: float = 300) -> Dict[str, Any]:
    """The uninterrupted parameter-server job (``--ps 1 --workers 2``, backups on): the chief's final weights."""
    work.mkdir(parents=True, exist_ok=True)
    run = rs.Run(["--ps", "1", "--workers", "2", "--timeout", str(timeout - 10), "--", str(rs.JOB)],
                 env=rs.job_env(work, REL_BACKUP_DIR=work / "ref-backup", REL_WEIGHTS_OUT=work / "ref-{task}.npz",
                                 REL_STRATEGY="parameter_server"))
    run.wait(timeout)
    ok = run.returncode == 0 and (work / "ref-chief0.npz").exists()
    return rs.outcome(ok, "" if ok else f"reference run failed (rc={run.returncode}):\n{run.tail()}",
                      weights=str(work / "ref-chief0.npz"), seconds=round(run.seconds, 1))


def ray_reference(work: Path, *, timeout: float = 300) -> Dict[str, Any]:
    """The uninterrupted job on 2 Ray Train workers (a private local Ray instance), backups on."""
    work.mkdir(parents=True, exist_ok=True)
    run = rs.Run(["--backend", "ray", "--workers", "2", "--timeout", str(timeout - 10), "--", str(rs.JOB)],
                 env=rs.job_env(work, REL_BACKUP_DIR=work / "ref-backup", REL_WEIGHTS_OUT=work / "ref-{task}.npz"))
    run.wait(timeout)
    ok = run.returncode == 0 and (work / "ref-worker0.npz").exists()
    return rs.outcome(ok, "" if ok else f"reference run failed (rc={run.returncode}):\n{run.tail()}",
                      weights=str(work / "ref-worker0.npz"), seconds=round(run.seconds, 1))


def paths(multi_worker: int, horovod: int, ps: int, ray: int = 0) -> List[Tuple[str, int, Callable[..., Dict[str, Any]],
                                                                  Dict[str, Any]]]:
    """(name, trials, reference function, preempt_trial options) of each path the tally covers."""
    import rel_horovod as rh

    hvd = dict(launch=("--backend", "horovod", "-np", "2", "--gloo-timeout", "120"), tasks=("rank0", "rank1"),
               victims=("rank:0", "rank:1"), env={"REL_EPOCHS": str(rh.EPOCHS)})
    return [("multi_worker", multi_worker, rs.r1_reference, {}),
            ("horovod", horovod, rh.r1_horovod_reference, hvd),
            ("parameter_server chief", ps, ps_reference,
             dict(launch=("--ps", "1", "--workers", "2"), tasks=("chief0",), victims=("chief:0",),
                  env={"REL_STRATEGY": "parameter_server"})),
            ("ray", ray, ray_reference, dict(launch=("--backend", "ray", "--workers", "2")))]
