"""Reliability scenarios (issue 9), shared by tests/reliability and scripts/reliability.py.

Every scenario runs real processes on 127.0.0.1 through the real front end (``python -m tfaccel launch``),
bounds them by a timeout, ends every process it started by PID, and returns a dict: ``ok`` (the promise
held), ``why`` (what failed, if anything), and the measurements. Nothing here imports TensorFlow.
"""

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent
JOB = HERE / "scripts" / "rel_job.py"
for _path in (REPO_ROOT, HERE.parent):  # tfaccel; tests/ (the harness)
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from harness import CHILD_ENV, with_optional_imports  # noqa: E402  (quiet, 2-core friendly children)
from tfaccel.launch.procs import free_ports, pid_alive, start_process, terminate  # noqa: E402

EPOCHS = 3
BACKUP_FREQ = 5
STEPS_PER_EPOCH = 23  # digits train split (1437 examples) / global batch 64, rounded up
LOST_PEER_LIMIT_S = 60.0  # R2: a lost peer fails every survivor within this many seconds
STARTED_PIDS: List[int] = []  # every PID started here (launchers and the tasks they report)
_STARTED_RE = re.compile(r"started (\w+:\d+) pid=(\d+)")
# AutoGraph (TensorFlow) imports the code it generates from files in TMPDIR, so Python caches their bytecode in
# TMPDIR/__pycache__ unless PYTHONDONTWRITEBYTECODE is set (a clean-clone CI run without that variable saw them):
# TensorFlow's cache, not a file of the job's.
_AUTOGRAPH_CACHE = re.compile(r"__pycache__(/__autograph_generated_file\w+\.cpython-\d+\.pyc)?$")


def job_files_in_tmp(names: Iterable[str]) -> List[str]:
    """The entries of a job's TMPDIR (relative paths) that are not TensorFlow AutoGraph's bytecode cache."""
    return [name for name in names if not _AUTOGRAPH_CACHE.match(name)]


def env_for(extra: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG" and not k.startswith(("REL_", "TFACCEL_"))}
    env.update(CHILD_ENV)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


class Run:
    """One ``python -m tfaccel launch ...`` process: timestamped output lines, task PIDs, bounded wait."""

    def __init__(self, args: Sequence[str], *, env: Optional[Mapping[str, str]] = None,
                 cwd: Optional[Path] = None) -> None:
        self.begun = time.monotonic()
        args = list(args)
        backend = args[args.index("--backend") + 1] if "--backend" in args else None
        if env and backend in ("horovod", "ray"):
            # horovodrun ranks and Ray workers get only an allowlist of the launcher's environment: name the job's
            cut = args.index("--")
            args[cut:cut] = [word for name in env for word in ("--env", name)]
        child_env = env_for(env)
        if backend == "ray":  # Ray Train imports pandas
            child_env = with_optional_imports(child_env)
        self.proc = start_process([sys.executable, "-m", "tfaccel", "launch", *args], env=child_env,
                                  cwd=str(cwd or REPO_ROOT))
        STARTED_PIDS.append(self.proc.pid)
        self.lines: List[tuple] = []  # (seconds since start, stream, text)
        self.task_pids: List[int] = []
        self.pid_of: Dict[str, int] = {}  # task name -> PID of its latest start
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._read, args=(s, n), daemon=True)
                         for s, n in ((self.proc.stdout, "out"), (self.proc.stderr, "err"))]
        for thread in self._threads:
            thread.start()
        self.returncode: Optional[int] = None
        self.seconds = 0.0
        self.timed_out = False
        # When the launcher exited, stamped as it happens: wait() may be called late (after another launch's
        # wait), and a test must not count that delay as this launcher's time.
        self._exited_at: Optional[float] = None
        self._waiter = threading.Thread(target=self._stamp_exit, daemon=True)
        self._waiter.start()

    def _stamp_exit(self) -> None:
        self.proc.wait()
        self._exited_at = time.monotonic() - self.begun

    def _read(self, stream: Any, name: str) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            match = _STARTED_RE.search(line)
            if match:
                self.task_pids.append(int(match.group(2)))
                self.pid_of[match.group(1)] = int(match.group(2))
                STARTED_PIDS.append(int(match.group(2)))
            with self._lock:
                self.lines.append((time.monotonic() - self.begun, name, line))
        stream.close()

    def wait(self, timeout: float) -> "Run":
        try:
            self.returncode = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.timed_out = True
            terminate([self.proc], grace=5)
            self.returncode = self.proc.returncode
        self._waiter.join(timeout=5)
        self.seconds = self._exited_at if self._exited_at is not None else time.monotonic() - self.begun
        for thread in self._threads:
            thread.join(timeout=10)
        for pid in self.task_pids:  # the launcher ends its tasks; make sure, whatever happened
            if pid_alive(pid):
                with_suppress_kill(pid)
        return self

    @property
    def text(self) -> str:
        with self._lock:
            return "\n".join(line for _, _, line in self.lines)

    def first(self, pattern: str) -> Optional[float]:
        """Seconds after start at which a line matching ``pattern`` arrived, or None."""
        regex = re.compile(pattern)
        with self._lock:
            for stamp, _, line in self.lines:
                if regex.search(line):
                    return stamp
        return None

    def json_lines(self) -> List[dict]:
        return job_reports(line for _, _, line in list(self.lines))

    def timeline(self, n: int = 40) -> str:
        with self._lock:
            return "\n".join(f"{stamp:7.1f} {line}" for stamp, _, line in self.lines[-n:])

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.text.splitlines()[-n:])


def job_reports(lines: Iterable[str]) -> List[dict]:
    """The job's JSON reports: lines holding ``{"task": ...}``, after any ``[worker i]`` prefix."""
    out = []
    for line in lines:
        start = line.find('{"task"')
        if start >= 0:
            try:
                out.append(json.loads(line[start:]))
            except ValueError:
                pass
    return out


def with_suppress_kill(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def job_env(work: Path, **extra: str) -> Dict[str, str]:
    env = {"REL_EPOCHS": str(EPOCHS), "REL_BACKUP_FREQ": str(BACKUP_FREQ), "REL_KILL_MARKER": str(work / "killed")}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def outcome(ok: bool, why: str = "", **measured: Any) -> Dict[str, Any]:
    return {"ok": bool(ok), "why": why, **measured}


# ------------------------------------------------------------------------------------------------------- R1
def _tree(path: Path) -> List[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


def r1_reference(work: Path, *, timeout: float = 300) -> Dict[str, Any]:
    """The uninterrupted 2-worker run: its final weights are what every interrupted run must end with.

    It also records what the job wrote outside the directories it was given (R4): it runs in an empty working
    directory with its own empty TMPDIR and HOME, and with a checkpoint_dir (so worker:1 writes and must remove
    a temporary checkpoint directory).
    """
    work.mkdir(parents=True, exist_ok=True)
    cwd, tmp, home = work / "cwd", work / "tmp", work / "home"
    for path in (cwd, tmp, home):
        path.mkdir(exist_ok=True)
    run = Run(["--workers", "2", "--timeout", str(timeout - 10), "--", str(JOB)], cwd=cwd,
              env=job_env(work, REL_BACKUP_DIR=work / "ref-backup", REL_WEIGHTS_OUT=work / "ref-{task}.npz",
                           REL_CHECKPOINT_DIR=work / "ckpt", TMPDIR=tmp, HOME=home))
    run.wait(timeout)
    ok = run.returncode == 0 and (work / "ref-worker0.npz").exists()
    return outcome(ok, "" if ok else f"reference run failed (rc={run.returncode}):\n{run.tail()}",
                   weights=str(work / "ref-worker0.npz"), seconds=round(run.seconds, 1),
                   notes=[r.get("notes", []) for r in run.json_lines()],
                   written={"cwd": _tree(cwd), "tmp": _tree(tmp), "home": _tree(home), "ckpt": _tree(work / "ckpt"),
                            "backup_left": (work / "ref-backup").exists()})


def expected_resume(epoch: int, step: int, *, victim_is_chief: bool) -> List[Optional[tuple]]:
    """The backups a job killed right after (epoch, step) may resume from. The chief writes one every
    ``BACKUP_FREQ`` steps in the background (tfaccel's default) and moves the pointer once it is on disk, so the
    last backup before the kill may still have been in flight, and then the one before it is the last complete one
    (a second backup waits for the first, so at most one is in flight). A chief killed at a backup step dies before
    writing it."""
    last = (step // BACKUP_FREQ) * BACKUP_FREQ
    candidates: List[Optional[tuple]] = []
    for s in (last - BACKUP_FREQ, last):
        if s >= 0:
            candidates.append((epoch, s) if s > 0 else ((epoch, 0) if epoch > 0 else None))
    return candidates[:1] if victim_is_chief and last == step else candidates


def r1_trial(work: Path, reference: Path, *, rng: random.Random, timeout: float = 360,
             atol: float = 1e-5, rtol: float = 1e-5) -> Dict[str, Any]:
    """R1: kill one worker of a 2-worker MWMS job at a random step; the restarted job must end like the reference."""
    work.mkdir(parents=True, exist_ok=True)
    victim = rng.choice(["worker:0", "worker:1"])
    epoch, step = rng.randrange(EPOCHS), rng.randrange(1, STEPS_PER_EPOCH)
    run = Run(["--workers", "2", "--max-restarts", "1", "--timeout", str(timeout - 10), "--", str(JOB)],
              env=job_env(work, REL_BACKUP_DIR=work / "backup", REL_WEIGHTS_OUT=work / "res-{task}.npz",
                           REL_KILL_AT=f"{victim}:{epoch}:{step}"))
    run.wait(timeout)
    measured = {"victim": victim, "kill_at": [epoch, step], "seconds": round(run.seconds, 1)}
    if run.returncode != 0:
        return outcome(False, f"job failed (rc={run.returncode}, timed out={run.timed_out}):\n{run.tail()}", **measured)
    if not (work / "killed").exists():
        return outcome(False, "the victim was never killed", **measured)
    restarted = "restarting the whole job" in run.text
    reports = run.json_lines()
    resumed = {tuple(r["resumed_from"]) if r["resumed_from"] else None for r in reports}
    measured.update(restarted=restarted, resumed_from=sorted(resumed, key=str), reports=len(reports))
    allowed = expected_resume(epoch, step, victim_is_chief=victim == "worker:0")
    if not restarted or len(reports) != 2 or len(resumed) != 1 or next(iter(resumed)) not in allowed:
        return outcome(False, f"expected one restart resuming from one of {allowed}; got {measured}", **measured)
    told = [r.get("restarts") or [{}] for r in reports]  # issue 25: FitResult.details["restarts"]
    measured["restarts_reported"] = told[0]
    if any(t[-1].get("why") != "failure" or t[-1].get("resumed_from") != (list(next(iter(resumed)) or []) or None)
           for t in told):
        return outcome(False, f"details['restarts'] does not say: a failure, resumed from {resumed}: {told}",
                       **measured)
    mismatch, max_diff = compare_weights(reference, work, ("worker0", "worker1"), rtol=rtol, atol=atol)
    if mismatch:
        return outcome(False, mismatch, **measured, max_abs_diff=max_diff)
    backup_left = (work / "backup").exists()
    if backup_left:
        return outcome(False, "the backup directory was not removed after training completed", **measured)
    return outcome(True, **measured, max_abs_diff=max_diff)


def r1_unshared_dirs(work: Path, *, timeout: float = 240) -> Dict[str, Any]:
    """Each worker its own backup_dir (hosts without a shared disk): the chief, killed after epoch 1's step 7, has
    backups; worker:1's directory has none. The restarted job must stop on every worker with the reason (a
    ConfigError, exit 2, not restarted again), not train the two workers from different weights."""
    work.mkdir(parents=True, exist_ok=True)
    run = Run(["--workers", "2", "--max-restarts", "1", "--timeout", str(timeout - 10), "--", str(JOB)],
              env=job_env(work, REL_BACKUP_DIR=work / "backup-{task}", REL_KILL_AT="worker:0:1:7", REL_EPOCHS="2"))
    run.wait(timeout)
    measured = {"returncode": run.returncode, "seconds": round(run.seconds, 1), "reports": len(run.json_lines())}
    said = [line for line in run.text.splitlines() if "the chief resumes from the backup at epoch 1" in line]
    measured["said"] = len(said)
    ok = (run.returncode == 2 and (work / "killed").exists() and not measured["reports"] and len(said) >= 2
          and any("(this worker: no backup)" in line for line in said))
    return outcome(ok, "" if ok else f"expected every worker to stop with the reason; got {measured}\n{run.tail()}",
                   **measured)


def compare_weights(reference: Path, work: Path, tasks: Sequence[str], *, rtol: float,
                    atol: float) -> "tuple[Optional[str], float]":
    """Compares each task's ``res-<task>.npz`` with the reference: (None or what differs, the largest difference)."""
    import numpy as np

    ref = np.load(reference)
    diffs: List[float] = []
    for task in tasks:
        res = np.load(work / f"res-{task}.npz")
        for key in ref.files:
            diffs.append(float(np.max(np.abs(res[key] - ref[key]))))
            if not np.allclose(res[key], ref[key], rtol=rtol, atol=atol):
                return f"{task} weights {key} differ from the reference by {diffs[-1]:.3g}", max(diffs)
    return None, max(diffs) if diffs else 0.0


# ------------------------------------------------------------------------------------------------------- R2
def _lost_peer_verdict(run: Run, *, lost: str, limit_from: float, patterns: Sequence[str],
                       limit: float = LOST_PEER_LIMIT_S) -> Dict[str, Any]:
    measured = {"rc": run.returncode, "seconds": round(run.seconds, 1),
                "exit_after_loss_s": round(run.seconds - limit_from, 1), "timed_out": run.timed_out}
    if run.timed_out:
        return outcome(False, f"hang: still running after {run.seconds:.0f} s:\n{run.tail()}", **measured)
    if run.returncode in (0, None):
        return outcome(False, f"exit status {run.returncode}, expected non-zero:\n{run.tail()}", **measured)
    missing = [p for p in patterns if not re.search(p, run.text)]
    if missing:
        return outcome(False, f"output does not name the lost task {lost} (no match for {missing}):\n{run.tail()}",
                       **measured)
    if run.seconds - limit_from > limit:
        return outcome(False, f"exited {run.seconds - limit_from:.0f} s after {lost} was lost at {limit_from:.1f} s "
                       f"(limit {limit:g} s); the last lines, seconds after the launch:\n{run.timeline()}", **measured)
    return outcome(True, **measured)


def r2_local_dies(work: Path, *, timeout: float = 180) -> Dict[str, Any]:
    """Local mode: worker:1 is SIGKILLed mid-epoch; the job exits non-zero naming worker:1."""
    work.mkdir(parents=True, exist_ok=True)
    run = Run(["--workers", "2", "--", str(JOB)], env=job_env(work, REL_KILL_AT="worker:1:0:4", REL_EPOCHS=1))
    run.wait(timeout)
    killed = run.first(r"REL: worker:1 kills itself") or run.seconds
    return _lost_peer_verdict(run, lost="worker:1", limit_from=killed,
                              patterns=[r"worker:1 \(pid \d+\) failed: killed by SIGKILL"])


def r2_local_never_joins(work: Path, *, startup: float = 12, timeout: float = 180) -> Dict[str, Any]:
    """Local mode: worker:1 runs but never starts TensorFlow; worker:0 gives up after the start-up timeout."""
    work.mkdir(parents=True, exist_ok=True)
    run = Run(["--workers", "2", "--", str(JOB)],
              env=job_env(work, REL_HANG_BEFORE_START="worker:1", TFACCEL_STARTUP_TIMEOUT=startup))
    run.wait(timeout)
    hung = run.first(r"REL: worker:1 hangs") or 0.0
    return _lost_peer_verdict(run, lost="worker:1", limit_from=hung, limit=startup + 40,
                              patterns=[r"worker:0 \(pid \d+\) failed",
                                        r"did not come up within the start-up timeout of .*waited for: worker:1"])


def _cluster_file(work: Path) -> Path:
    ports = free_ports(2)
    path = work / "cluster.yaml"
    path.write_text("worker:\n" + "".join(f"  - 127.0.0.1:{p}\n" for p in ports))
    return path


def r2_host_never_starts(work: Path, *, startup: float = 12, timeout: float = 180) -> Dict[str, Any]:
    """Per-host mode: only worker:0's host runs; worker:1 never starts. worker:0 fails naming worker:1."""
    work.mkdir(parents=True, exist_ok=True)
    cluster = _cluster_file(work)
    run = Run(["--cluster", str(cluster), "--task", "worker:0", "--", str(JOB)],
              env=job_env(work, TFACCEL_STARTUP_TIMEOUT=startup))
    run.wait(timeout)
    return _lost_peer_verdict(run, lost="worker:1", limit_from=0.0, limit=startup + 40,
                              patterns=[r"did not come up within the start-up timeout of .*waited for: worker:1"])


def r2_host_dies(work: Path, *, timeout: float = 240) -> Dict[str, Any]:
    """Per-host mode: one launcher per task; worker:1 dies mid-epoch; worker:0's launcher exits non-zero naming
    worker:1 (TensorFlow's aborted collective names /job:worker/replica:0/task:1) within the limit."""
    work.mkdir(parents=True, exist_ok=True)
    cluster = _cluster_file(work)
    env = job_env(work, REL_KILL_AT="worker:1:0:4", REL_EPOCHS=1)
    runs = [Run(["--cluster", str(cluster), "--task", f"worker:{i}", "--", str(JOB)], env=env) for i in (0, 1)]
    runs[1].wait(timeout)
    runs[0].wait(max(5.0, timeout - runs[0].seconds if runs[0].seconds else timeout))
    killed = runs[1].first(r"REL: worker:1 kills itself")
    if killed is None:
        return outcome(False, f"worker:1 never reached its kill step:\n{runs[1].tail()}\n---\n{runs[0].tail()}")
    killed += runs[1].begun - runs[0].begun  # on worker:0's clock
    verdict = _lost_peer_verdict(runs[0], lost="worker:1", limit_from=killed,
                                 patterns=[r"/job:worker/replica:0/task:1", r"worker:0 \(pid \d+\) failed"])
    verdict["victim_launcher_rc"] = runs[1].returncode
    return verdict


def r2_horovod_dies(work: Path, *, timeout: float = 180) -> Dict[str, Any]:
    """Horovod: rank 1 is SIGKILLed mid-epoch; horovodrun ends rank 0 and the launch exits non-zero naming rank 1."""
    work.mkdir(parents=True, exist_ok=True)
    run = Run(["--backend", "horovod", "-np", "2", "--", str(JOB)],
              env=job_env(work, REL_KILL_AT="rank:1:0:4", REL_EPOCHS=1))
    run.wait(timeout)
    killed = run.first(r"REL: rank:1 kills itself") or 0.0
    return _lost_peer_verdict(run, lost="rank 1", limit_from=killed,
                              patterns=[r"Process name: 1", r"Exit code: 137"])


def r2_horovod_never_joins(work: Path, *, gloo_timeout: int = 12, timeout: float = 180) -> Dict[str, Any]:
    """Horovod: rank 1 never calls hvd.init; rank 0's Gloo rendezvous times out naming rank 1 (key 1)."""
    work.mkdir(parents=True, exist_ok=True)
    run = Run(["--backend", "horovod", "-np", "2", "--gloo-timeout", str(gloo_timeout), "--", str(JOB)],
              env=job_env(work, REL_HANG_BEFORE_START="rank:1"))
    run.wait(timeout)
    hung = run.first(r"REL: rank:1 hangs") or 0.0
    return _lost_peer_verdict(run, lost="rank 1", limit_from=hung, limit=gloo_timeout + 40,
                              patterns=[r"Wait timeout after \d+ seconds for key\(s\): 1"])


R2_SCENARIOS = {
    "local: peer dies mid-step": r2_local_dies,
    "local: peer never joins": r2_local_never_joins,
    "per-host: peer never starts": r2_host_never_starts,
    "per-host: peer dies mid-step": r2_host_dies,
    "horovod: rank dies mid-step": r2_horovod_dies,
    "horovod: rank never joins": r2_horovod_never_joins,
}


def leftover_pids() -> List[int]:
    return [pid for pid in STARTED_PIDS if pid_alive(pid)]



# ------------------------------------------------------------------------------------------------------- R3
class _Task:
    """One process of a hand-built parameter-server cluster (so a test can kill a server task itself)."""

    def __init__(self, name: str, cluster: Dict[str, List[str]], env: Mapping[str, str]) -> None:
        role, index = name.split(":")
        self.name = name
        child = env_for(env)
        child["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": role, "index": int(index)}})
        self.proc = start_process([sys.executable, str(JOB)], env=child, cwd=str(REPO_ROOT))
        STARTED_PIDS.append(self.proc.pid)
        self.lines: List[tuple] = []
        self.begun = time.monotonic()
        self._threads = [threading.Thread(target=self._read, args=(s,), daemon=True)
                         for s in (self.proc.stdout, self.proc.stderr)]
        for thread in self._threads:
            thread.start()

    def _read(self, stream: Any) -> None:
        for raw in iter(stream.readline, b""):
            self.lines.append((time.monotonic(), raw.decode("utf-8", "replace").rstrip("\n")))
        stream.close()

    @property
    def text(self) -> str:
        return "\n".join(line for _, line in list(self.lines))


def r3_ps_task_lost(work: Path, *, victim: str = "worker:1", after_epoch: int = 1,
                    timeout: float = 300) -> Dict[str, Any]:
    """Parameter server: chief + 2 workers + 1 ps; ``victim`` is SIGKILLed after the chief logs epoch
    ``after_epoch``. A lost worker: ClusterCoordinator re-schedules its closures and the job completes. A lost
    ps: the chief fails (non-zero) within the limit, naming the ps task."""
    work.mkdir(parents=True, exist_ok=True)
    ports = iter(free_ports(4))
    cluster = {"chief": [f"127.0.0.1:{next(ports)}"], "worker": [f"127.0.0.1:{next(ports)}" for _ in range(2)],
               "ps": [f"127.0.0.1:{next(ports)}"]}
    env = {"REL_EPOCHS": "4", "REL_STRATEGY": "parameter_server"}
    tasks = {name: _Task(name, cluster, env) for name in ("ps:0", "worker:0", "worker:1", "chief:0")}
    chief = tasks["chief:0"]
    killed_at: Optional[float] = None
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and chief.proc.poll() is None:
            if killed_at is None and re.search(rf"epoch {after_epoch}/\d+", chief.text):
                tasks[victim].proc.send_signal(signal.SIGKILL)
                killed_at = time.monotonic()
            time.sleep(0.1)
        timed_out = chief.proc.poll() is None
    finally:
        terminate([t.proc for t in tasks.values()], grace=2)
    for task in tasks.values():
        for thread in task._threads:
            thread.join(timeout=5)
    rc = chief.proc.returncode
    measured = {"victim": victim, "rc": rc, "timed_out": timed_out, "seconds": round(time.monotonic() - chief.begun, 1),
                "exit_after_loss_s": round(time.monotonic() - killed_at, 1) if killed_at else None}
    if killed_at is None:
        return outcome(False, f"the chief never logged epoch {after_epoch}:\n{chief.text[-3000:]}", **measured)
    if timed_out:
        return outcome(False, f"hang: the chief still ran {timeout:g} s after start:\n{chief.text[-3000:]}", **measured)
    if victim.startswith("worker"):
        reports = [json.loads(line[line.find("{\"task\""):]) for _, line in chief.lines if "{\"task\"" in line]
        ok = rc == 0 and reports and reports[-1]["steps"] > 0
        measured["steps"] = reports[-1]["steps"] if reports else None
        # At-least-once: a closure that was running on the lost worker is re-run in full elsewhere, and the
        # updates it had already applied on the ps stay; so more steps than scheduled may be counted.
        measured["steps_scheduled"] = 4 * reports[-1]["steps_per_epoch"] if reports else None
        return outcome(ok, "" if ok else f"job did not complete after losing {victim}:\n{chief.text[-3000:]}",
                       **measured)
    naming = [line for _, line in chief.lines if re.search(r"/job:ps/replica:0/task:0|\bps:0\b", line)
              and "TF_CONFIG" not in line]
    names = bool(naming)
    measured["message"] = naming[-1][:300] if naming else None
    ok = rc not in (0, None) and names and measured["exit_after_loss_s"] <= LOST_PEER_LIMIT_S
    return outcome(ok, "" if ok else f"expected a non-zero exit naming ps:0 within {LOST_PEER_LIMIT_S:g} s:\n"
                   f"{chief.text[-3000:]}", **measured)


def r3_launch_ps_worker_lost(work: Path, *, after_epoch: int = 1, timeout: float = 300) -> Dict[str, Any]:
    """`tfaccel launch --ps 1 --workers 2`: worker:1's server is SIGKILLed after the chief logs epoch
    ``after_epoch``; the launcher keeps the job going and it completes (exit 0)."""
    work.mkdir(parents=True, exist_ok=True)
    run = Run(["--ps", "1", "--workers", "2", "--timeout", str(timeout - 10), "--", str(JOB)],
              env={"REL_EPOCHS": "4", "REL_STRATEGY": "parameter_server"})
    deadline = time.monotonic() + timeout
    killed = None
    while time.monotonic() < deadline and run.proc.poll() is None:
        epoch_done = run.first(rf"\[chief 0\].*epoch {after_epoch}/\d+") is not None
        if killed is None and epoch_done and "worker:1" in run.pid_of:
            os.kill(run.pid_of["worker:1"], signal.SIGKILL)
            killed = time.monotonic() - run.begun
        time.sleep(0.1)
    run.wait(max(1.0, deadline - time.monotonic()))
    reports = run.json_lines()
    measured = {"rc": run.returncode, "seconds": round(run.seconds, 1), "killed_at_s": killed,
                "steps": reports[-1]["steps"] if reports else None,
                "steps_scheduled": 4 * reports[-1]["steps_per_epoch"] if reports else None}
    if killed is None:
        return outcome(False, f"the chief never logged epoch {after_epoch}:\n{run.tail()}", **measured)
    ok = run.returncode == 0 and bool(reports) and "a parameter-server worker, exited" in run.text
    return outcome(ok, "" if ok else f"the job did not go on after losing worker:1:\n{run.tail()}", **measured)
