"""Elastic scenarios (issue 25), shared by tests/reliability and scripts/reliability.py (``--elastic N``).

Real processes on 127.0.0.1 through ``python -m tfaccel launch --workers 2:3``, bounded in time, every PID ended:
- reference: an uninterrupted 3-worker run;
- shrink: 3 workers, one SIGKILLed mid-epoch and not allowed back (``--max-restarts 0``): the job must end on 2
  workers with the reference's weights (max abs difference <= 1e-5), its number of optimizer steps, every epoch's
  history once (equal to the reference's), the change of world size recorded at the step it resumed from, and
  ``details["restarts"]`` one restart: a resize after a failure, 3 -> 2 workers, from where it resumed;
- grow: 2 workers offered by a capacity file; one dies (``--max-restarts 1``) right after the file offers 3: the
  job restarts on 3 workers, with the same checks.
The job (tests/reliability/scripts/elastic_job.py) trains the reliability MLP on the first 1344 digits examples
in batches of 96 (14 steps per epoch), a backup every 2 steps. Nothing here imports TensorFlow.
"""

import random
from pathlib import Path
from typing import Any, Dict, List, Optional

import rel_scenarios as rs

JOB = rs.HERE / "scripts" / "elastic_job.py"
EPOCHS, STEPS_PER_EPOCH, BACKUP_FREQ = 3, 14, 2
ATOL = 1e-5


def _env(work: Path, **extra: Any) -> Dict[str, str]:
    env = {"ELASTIC_EPOCHS": str(EPOCHS), "ELASTIC_BACKUP_FREQ": str(BACKUP_FREQ),
           "ELASTIC_BACKUP_DIR": str(work / "backup"), "ELASTIC_WEIGHTS_OUT": str(work / "res-{task}.npz"),
           "ELASTIC_KILL_MARKER": str(work / "killed")}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def reference(work: Path, *, timeout: float = 300) -> Dict[str, Any]:
    """The uninterrupted 3-worker run: its weights and history are what every elastic run must end with."""
    work.mkdir(parents=True, exist_ok=True)
    run = rs.Run(["--workers", "3", "--timeout", str(timeout - 10), "--", str(JOB)], env=_env(work))
    run.wait(timeout)
    reports = run.json_lines()
    ok = run.returncode == 0 and len(reports) == 3 and (work / "res-worker0.npz").exists()
    return rs.outcome(ok, "" if ok else f"reference run failed (rc={run.returncode}):\n{run.tail()}",
                      weights=str(work / "res-worker0.npz"), history=reports[0]["history"] if reports else None,
                      iterations=reports[0]["iterations"] if reports else None, seconds=round(run.seconds, 1))


def _allowed(epoch: int, step: int, victim_is_chief: bool) -> List[List[int]]:
    """The backups a job killed right after (epoch, step) may resume from (the chief writes them)."""
    last = step // BACKUP_FREQ * BACKUP_FREQ
    steps = [last - BACKUP_FREQ, last] if last == step else [last]
    if victim_is_chief and last == step:  # the chief dies before writing that step's backup
        steps = steps[:1]
    return [[epoch, s] if (epoch, s) != (0, 0) else [] for s in steps if s >= 0]  # []: no backup yet, a fresh start


def _verdict(run: "rs.Run", work: Path, ref: Dict[str, Any], *, sizes: List[int], kill: List[int], victim: str,
             measured: Dict[str, Any]) -> Dict[str, Any]:
    if run.returncode != 0:
        return rs.outcome(False, f"job failed (rc={run.returncode}, timed out={run.timed_out}):\n{run.tail()}",
                          **measured)
    reports = run.json_lines()
    resumed = sorted({tuple(r["resumed_from"] or ()) for r in reports})
    measured.update(resumed_from=[list(r) for r in resumed], workers_at_end=len(reports),
                    iterations=sorted({r["iterations"] for r in reports}),
                    optimizer_state=sorted({str(r.get("optimizer_state")) for r in reports}),
                    world_size=reports[0]["world_size"] if reports else None)
    allowed = _allowed(kill[0], kill[1], victim == "worker:0")
    problems = []
    if not (work / "killed").exists():
        problems.append("the victim was never killed")
    if len(reports) != sizes[1] or len(resumed) != 1 or list(resumed[0]) not in allowed:
        problems.append(f"expected {sizes[1]} workers resuming from one of {allowed}")
    if measured["iterations"] != [ref["iterations"]]:
        problems.append(f"optimizer steps {measured['iterations']}, the reference took {ref['iterations']}")
    at = list(resumed[0]) if resumed and resumed[0] else [0, 0]
    expected_change = [{"from": sizes[0], "to": sizes[1], "epoch": at[0], "step": at[1]}]
    if [{k: c[k] for k in ("from", "to", "epoch", "step")} for c in measured["world_size"] or []] != expected_change:
        problems.append(f"details['world_size'] {measured['world_size']}, expected {expected_change}")
    if f"elastic: world size {sizes[0]} -> {sizes[1]}" not in run.text:
        problems.append("the launcher did not log the change of world size")
    problems += _restarts_problems(reports, sizes, list(resumed[0]) if resumed and resumed[0] else None)
    problems += _history_problems([r["history"] for r in reports], ref["history"])
    if problems:
        return rs.outcome(False, "; ".join(problems) + f"\n{run.tail()}", **measured)
    tasks = [f"worker{i}" for i in range(sizes[1])]
    mismatch, max_diff = rs.compare_weights(Path(ref["weights"]), work, tasks, rtol=0.0, atol=ATOL)
    measured["max_abs_diff"] = max_diff
    if mismatch or (work / "backup").exists():
        return rs.outcome(False, mismatch or "the backup directory was not removed", **measured)
    return rs.outcome(True, **measured)


def _restarts_problems(reports: List[Dict[str, Any]], sizes: List[int], resumed: Optional[List[int]]) -> List[str]:
    """details["restarts"]: the one restart, a resize after a failure from sizes[0] to sizes[1] workers, resumed
    where the job resumed."""
    expected = {"restart": 1, "why": "resize", "cause": "failure", "from_workers": sizes[0], "to_workers": sizes[1],
                "resumed_from": resumed}
    for report in reports:
        got = report.get("restarts") or []
        if len(got) != 1 or {k: got[0].get(k) for k in expected} != expected or "steps_lost_at_least" not in got[0]:
            return [f"details['restarts'] {got}, expected one entry with {expected}"]
    return []


def _history_problems(histories: List[Dict[str, List[float]]], expected: Dict[str, List[float]]) -> List[str]:
    """Every epoch once, each value within ATOL (relative) of the uninterrupted run's."""
    for history in histories:
        for key, values in expected.items():
            got = history.get(key, [])
            if len(got) != len(values) or any(abs(a - b) > ATOL * max(1.0, abs(b)) for a, b in zip(got, values)):
                return [f"history {key} {got}, the uninterrupted run's {values}"]
    return []


def shrink_trial(work: Path, ref: Dict[str, Any], *, rng: random.Random, victim: Optional[str] = None,
                 kill: Optional[List[int]] = None, timeout: float = 360, ray: bool = False,
                 shard: bool = False) -> Dict[str, Any]:
    """3 workers; one is SIGKILLed at a random step and not allowed back; the job ends on 2 like the reference.
    ``ray``: 3 Ray Train workers (``--backend ray``, a private local Ray instance), the job restarted on 2.
    ``shard``: the optimizer state sharded over the workers (each backs up its shard; 3 shards re-partitioned
    over 2 workers on resume)."""
    work.mkdir(parents=True, exist_ok=True)
    victim = victim or rng.choice(["worker:0", "worker:1", "worker:2"])
    kill = kill or [rng.randrange(EPOCHS), rng.randrange(1, STEPS_PER_EPOCH)]
    backend = ["--backend", "ray", "--storage-path", str(work / "ray")] if ray else []
    run = rs.Run([*backend, "--workers", "2:3", "--max-restarts", "0", "--timeout", str(timeout - 10), "--",
                  str(JOB)], env=_env(work, ELASTIC_KILL_AT=f"{victim}:{kill[0]}:{kill[1]}",
                                      ELASTIC_SHARD="1" if shard else "0"))
    run.wait(timeout)
    measured = {"victim": victim, "kill_at": kill, "seconds": round(run.seconds, 1)}
    return _verdict(run, work, ref, sizes=[3, 2], kill=kill, victim=victim, measured=measured)


def grow_trial(work: Path, ref: Dict[str, Any], *, rng: random.Random, victim: Optional[str] = None,
               kill: Optional[List[int]] = None, timeout: float = 360) -> Dict[str, Any]:
    """2 workers (a capacity file offers 2); right before one dies the file offers 3: the job goes on with 3."""
    work.mkdir(parents=True, exist_ok=True)
    capacity = work / "capacity"
    capacity.write_text("2\n")
    victim = victim or rng.choice(["worker:0", "worker:1"])
    kill = kill or [rng.randrange(EPOCHS), rng.randrange(1, STEPS_PER_EPOCH)]
    run = rs.Run(["--workers", "2:3", "--capacity-file", str(capacity), "--max-restarts", "1",
                  "--timeout", str(timeout - 10), "--", str(JOB)],
                 env=_env(work, ELASTIC_KILL_AT=f"{victim}:{kill[0]}:{kill[1]}", ELASTIC_CAPACITY=f"{capacity}:3"))
    run.wait(timeout)
    measured = {"victim": victim, "kill_at": kill, "seconds": round(run.seconds, 1)}
    return _verdict(run, work, ref, sizes=[2, 3], kill=kill, victim=victim, measured=measured)
