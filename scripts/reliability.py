"""Runs the issue-9 reliability scenarios N times and prints tallies (real processes on 127.0.0.1).

    python scripts/reliability.py                  # R1 x10, every R2 scenario x3
    python scripts/reliability.py --r1 10 --r2 1 --json rel_out/tallies.json
    python scripts/reliability.py --r1 0 --r2 0 --r3 0 --r1_horovod 5   # R1 under Horovod only
    python scripts/reliability.py --r1 0 --r2 0 --r3 0 --r1_ray 10      # R1 on Ray Train only (issue 14)
    python scripts/reliability.py --r1 0 --r2 0 --r3 0 --kills 50       # SIGKILLs during (async) backup writes
    python scripts/reliability.py --r1 0 --r2 0 --r3 0 --preempt 10     # SIGTERM to a worker (issue 25)
    python scripts/reliability.py --r1 0 --r2 0 --r3 0 --preempt_horovod 10 --preempt_ps 5 --preempt_ray 10
    python scripts/reliability.py --r1 0 --r2 0 --r3 0 --elastic 10 --elastic_growth 5   # elastic 3 -> 2, 2 -> 3

Prints one line per promise, e.g. ``R1 resume-equals-uninterrupted: 10/10``, then the measurements of every
trial (kill point, restart, resumed-from backup, max weight difference; exit time after a peer was lost).
The scenarios live in tests/reliability/rel_scenarios.py, shared with the test suite (which runs 1 trial).
"""

import functools
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from absl import app, flags

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "reliability"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # harness (for tests/ray)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "ray"))

FLAGS = flags.FLAGS


def define_flags() -> None:
    flags.DEFINE_integer("r1", 10, "R1 trials (kill a worker at a random step, restart, compare weights)")
    flags.DEFINE_integer("r1_horovod", 0, "R1 trials under Horovod (tfaccel launch --backend horovod -np 2 "
                         "--max-restarts 1: kill a rank at a random step, restart all ranks, compare weights); "
                         "every second trial gives each rank its own backup_dir (hosts without a shared disk)")
    flags.DEFINE_integer("r1_ray", 0, "R1 trials on Ray Train (tfaccel launch --backend ray --workers 2 "
                         "--max-restarts 1 on a private local Ray instance: a worker dies at a random step, its "
                         "training command or Ray's worker process SIGKILLed in turn; Ray restarts the worker group, "
                         "which resumes from tfaccel's backup in Ray's run storage; compare weights)")
    flags.DEFINE_integer("kills", 0, "trials that SIGKILL a one-process job (a backup after every step, written in "
                         "a background thread while training goes on) at a random moment while it writes backups, "
                         "then restart it: it must resume from a complete backup or from the start and end with the "
                         "uninterrupted run's weights (issues 24, 35)")
    flags.DEFINE_integer("preempt", 0, "preemption trials on multi_worker (tfaccel launch --workers 2 "
                         "--max-restarts 0: SIGTERM to one worker at a random step; every worker must exit 75 within "
                         "the grace period, the launcher restart, 0 steps lost, final weights equal to the "
                         "uninterrupted run's)")
    flags.DEFINE_integer("preempt_horovod", 0, "the same preemption trials under Horovod (2 ranks)")
    flags.DEFINE_integer("preempt_ps", 0, "the same with a parameter-server job (--ps 1 --workers 2): SIGTERM to "
                         "the chief")
    flags.DEFINE_integer("preempt_ray", 0, "the same on 2 Ray Train workers (--backend ray, a private local Ray)")
    flags.DEFINE_integer("elastic", 0, "elastic shrink trials (issue 25): tfaccel launch --workers 2:3 --max-restarts "
                         "0, one of 3 workers SIGKILLed at a random step; the job must end on 2 workers with the "
                         "uninterrupted 3-worker run's weights (1e-5), optimizer steps and history")
    flags.DEFINE_integer("elastic_growth", 0, "elastic growth trials (issue 25): 2 workers offered by a capacity file, "
                         "which offers 3 right before one of them is SIGKILLed; the job must go on with 3 and end "
                         "like the uninterrupted 3-worker run")
    flags.DEFINE_integer("elastic_ray", 0, "elastic shrink trials on Ray Train (issue 25): tfaccel launch --backend "
                         "ray --workers 2:3 --max-restarts 0 on a private local Ray instance, one of 3 Ray workers "
                         "SIGKILLed at a random step; the run is restarted with 2 Ray workers and must end like 3 "
                         "uninterrupted local workers")
    flags.DEFINE_integer("r2", 3, "trials of every R2 scenario (lost peer: local, per-host, Horovod)")
    flags.DEFINE_integer("r3", 1, "trials of each R3 scenario (parameter server: worker lost, ps lost)")
    flags.DEFINE_integer("seed", 9, "seed of the random kill points")
    flags.DEFINE_string("json", None, "also write every trial's measurements here")
    flags.DEFINE_string("workdir", None, "where trials write (default: a temporary directory, removed)")


def _line(name: str, results: list) -> str:
    good = sum(1 for r in results if r["ok"])
    return f"{name}: {good}/{len(results)}"


def _r1_ray(work: Path, rng: random.Random) -> dict:
    """R1 on Ray (issue 14): one reference run, then FLAGS.r1_ray trials; the two ways to die alternate."""
    import rel_ray

    ref = rel_ray.r1_ray_reference(work / "r1-ray-reference")
    if not ref["ok"]:
        sys.exit(f"R1 Ray reference run failed: {ref['why']}")
    print(f"  R1 ray reference: {ref['seconds']} s", flush=True)
    results = []
    for i in range(FLAGS.r1_ray):
        result = rel_ray.r1_ray_trial(work / f"r1-ray-{i}", Path(ref["weights"]), rng=rng,
                                      what=rel_ray.KILL_WHAT[i % 2])
        results.append({k: v for k, v in result.items() if k != "text"})
        print(f"  R1 ray trial {i + 1}: {'ok' if result['ok'] else 'FAILED'} {rel_ray.summary(result)}"
              + (f"\n    {result['why'][:3000]}" if not result["ok"] else ""), flush=True)
    return {"R1 ray resume-equals-uninterrupted": results}


def _kills(work: Path, rng: random.Random) -> dict:
    """Kills during saves (issue 24): one reference run, then FLAGS.kills trials; prints what each kill left."""
    import rel_kills

    ref = rel_kills.reference(work / "kills-reference")
    if not ref["ok"]:
        sys.exit(f"kills reference run failed: {ref['why']}")
    print(f"  kills reference: backups over {ref['backup_span_s']} s ({ref['backups_written']} backups; writer: "
          f"{json.dumps(ref['backup_writer'])})", flush=True)
    results = []
    for i in range(FLAGS.kills):
        result = rel_kills.trial(work / f"kills-{i}", ref, rng=rng)
        results.append(result)
        print(f"  kill trial {i + 1}: {'ok' if result['ok'] else 'FAILED'} "
              + json.dumps({k: v for k, v in result.items() if k not in ("ok", "why", "files")})
              + (f"\n    {result['why'][:2000]}" if not result["ok"] else ""), flush=True)
    print("  kills: " + json.dumps(rel_kills.tally(results)), flush=True)
    return {"kills during saves: restart resumes from a complete backup or the start, ends like the reference":
            results}


def _preempt(work: Path, rng: random.Random) -> dict:
    """Preemption tallies (issue 25): one reference per path, then the trials; prints each and the summary."""
    import rel_preempt as rp
    import rel_scenarios as rs

    tallies = {}
    for name, count, ref_fn, kwargs in rp.paths(FLAGS.preempt, FLAGS.preempt_horovod, FLAGS.preempt_ps,
                                                FLAGS.preempt_ray):
        if not count:
            continue
        ref = ref_fn(work / f"preempt-{name}-reference")
        if not ref["ok"]:
            sys.exit(f"preemption {name} reference run failed: {ref['why']}")
        results = []
        for i in range(count):
            result = rp.preempt_trial(work / f"preempt-{name}-{i}", Path(ref["weights"]), rng=rng, **kwargs)
            results.append({k: v for k, v in result.items() if k != "why"} | {"why": result["why"][:2000]})
            print(f"  preempt {name} trial {i + 1}: {'ok' if result['ok'] else 'FAILED'} {rp.main_line(result)}"
                  + (f"\n    {result['why'][:3000]}" if not result["ok"] else ""), flush=True)
        print(f"  preempt {name}: " + json.dumps(rp.summary(results)), flush=True)
        tallies[f"preemption {name}: every process exits 75 within {rp.GRACE_S:g} s, restart, 0 steps lost, weights "
                f"equal (1e-6)"] = results
    del rs
    return tallies


def _elastic(work: Path, rng: random.Random) -> dict:
    """Elastic restarts (issue 25): one uninterrupted 3-worker reference, then the shrink and growth trials."""
    import rel_elastic

    ref = rel_elastic.reference(work / "elastic-reference")
    if not ref["ok"]:
        sys.exit(f"elastic reference run failed: {ref['why']}")
    print(f"  elastic reference (3 workers): {ref['seconds']} s", flush=True)
    tallies = {}
    ray_shrink = functools.partial(rel_elastic.shrink_trial, ray=True, timeout=600)
    for slug, name, trial, count in (("shrink", "shrink 3 -> 2", rel_elastic.shrink_trial, FLAGS.elastic),
                                     ("grow", "grow 2 -> 3", rel_elastic.grow_trial, FLAGS.elastic_growth),
                                     ("ray", "ray shrink 3 -> 2", ray_shrink, FLAGS.elastic_ray)):
        results = []
        for i in range(count):
            result = trial(work / f"elastic-{slug}-{i}", ref, rng=rng)
            results.append(result)
            print(f"  elastic {name} trial {i + 1}: {'ok' if result['ok'] else 'FAILED'} "
                  + json.dumps({k: v for k, v in result.items() if k not in ("ok", "why")})
                  + (f"\n    {result['why'][:2000]}" if not result["ok"] else ""), flush=True)
        if results:
            tallies[f"elastic {name}: same weights (1e-5), optimizer steps and history as 3 uninterrupted workers"] = \
                results
    return tallies


def main(argv: list) -> None:
    del argv
    import rel_horovod as rh
    import rel_scenarios as rs

    tmp = None if FLAGS.workdir else tempfile.TemporaryDirectory(prefix="tfaccel-reliability-")
    work = Path(FLAGS.workdir or tmp.name)
    rng = random.Random(FLAGS.seed)
    tallies = {}
    began = time.monotonic()
    try:
        if FLAGS.r1:
            ref = rs.r1_reference(work / "r1-reference")
            if not ref["ok"]:
                sys.exit(f"R1 reference run failed: {ref['why']}")
            results = []
            for i in range(FLAGS.r1):
                result = rs.r1_trial(work / f"r1-{i}", Path(ref["weights"]), rng=rng)
                results.append(result)
                print(f"  R1 trial {i + 1}: {'ok' if result['ok'] else 'FAILED'} "
                      + json.dumps({k: v for k, v in result.items() if k not in ("ok", "why")})
                      + (f"\n    {result['why']}" if not result["ok"] else ""), flush=True)
            tallies["R1 resume-equals-uninterrupted"] = results
        if FLAGS.r1_horovod:
            ref = rh.r1_horovod_reference(work / "r1-horovod-reference")
            if not ref["ok"]:
                sys.exit(f"R1 Horovod reference run failed: {ref['why']}")
            print(f"  R1 horovod reference: {ref['seconds']} s", flush=True)
            results = []
            for i in range(FLAGS.r1_horovod):
                result = rh.r1_horovod_trial(work / f"r1-horovod-{i}", Path(ref["weights"]), rng=rng,
                                             per_rank_dirs=i % 2 == 1)
                results.append(result)
                print(f"  R1 horovod trial {i + 1}: {'ok' if result['ok'] else 'FAILED'} "
                      + json.dumps({k: v for k, v in result.items() if k not in ("ok", "why")})
                      + (f"\n    {result['why'][:2000]}" if not result["ok"] else ""), flush=True)
            tallies["R1 horovod resume-equals-uninterrupted"] = results
        if FLAGS.r1_ray:
            tallies.update(_r1_ray(work, rng))
        if FLAGS.kills:
            tallies.update(_kills(work, rng))
        if FLAGS.preempt or FLAGS.preempt_horovod or FLAGS.preempt_ps or FLAGS.preempt_ray:
            tallies.update(_preempt(work, rng))
        if FLAGS.elastic or FLAGS.elastic_growth or FLAGS.elastic_ray:
            tallies.update(_elastic(work, rng))
        for name, scenario in rs.R2_SCENARIOS.items():
            results = []
            for i in range(FLAGS.r2):
                result = scenario(work / f"r2-{name.replace(' ', '_').replace(':', '')}-{i}")
                results.append(result)
                print(f"  R2 {name} trial {i + 1}: {'ok' if result['ok'] else 'FAILED'} "
                      + json.dumps({k: v for k, v in result.items() if k not in ("ok", "why")})
                      + (f"\n    {result['why'][:2000]}" if not result["ok"] else ""), flush=True)
            if results:
                tallies[f"R2 {name}: non-zero exit naming the lost task within {rs.LOST_PEER_LIMIT_S:g} s"] = results
        for victim, what in (("worker:1", "worker lost, closures re-scheduled, job completes"),
                             ("ps:0", "ps lost, job fails clearly")):
            results = [rs.r3_ps_task_lost(work / f"r3-{victim.replace(':', '')}-{i}", victim=victim)
                       for i in range(FLAGS.r3)]
            for i, result in enumerate(results):
                print(f"  R3 {victim} trial {i + 1}: {'ok' if result['ok'] else 'FAILED'} "
                      + json.dumps({k: v for k, v in result.items() if k not in ("ok", "why")}), flush=True)
            if results:
                tallies[f"R3 parameter server: {what}"] = results
        results = [rs.r3_launch_ps_worker_lost(work / f"r3-launch-{i}") for i in range(FLAGS.r3)]
        for i, result in enumerate(results):
            print(f"  R3 tfaccel launch --ps 1 --workers 2, worker:1 lost, trial {i + 1}: "
                  f"{'ok' if result['ok'] else 'FAILED'} "
                  + json.dumps({k: v for k, v in result.items() if k not in ("ok", "why")}), flush=True)
        if results:
            tallies["R3 tfaccel launch --ps: worker lost, job completes"] = results
    finally:
        left = rs.leftover_pids()
        if tmp is not None:
            tmp.cleanup()
    print(f"\ntallies ({time.monotonic() - began:.0f} s; processes left alive: {len(left)}):")
    for pid in left:  # on a busy host a PID may have been reused by an unrelated process: say what each one is
        try:
            print(f"  left alive? pid {pid}: {Path(f'/proc/{pid}/cmdline').read_bytes()[:200]!r}")
        except OSError:
            print(f"  left alive? pid {pid}: gone by now")
    for name, results in tallies.items():
        print(_line(name, results))
    if FLAGS.json:
        Path(FLAGS.json).parent.mkdir(parents=True, exist_ok=True)
        Path(FLAGS.json).write_text(json.dumps({k: v for k, v in tallies.items()}, indent=1))
    if left or not all(r["ok"] for results in tallies.values() for r in results):
        sys.exit(1)


if __name__ == "__main__":
    define_flags()
    app.run(main)
