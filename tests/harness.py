"""Test harness for real multi-process clusters on loopback.

``run_tasks`` starts one Python process per task, each with its own TF_CONFIG on 127.0.0.1 with ports
chosen by the OS, bounds the whole run by a timeout, collects exit codes and output, and ends every
process by PID (its whole process group) whatever happens. Every PID it starts is recorded in
``STARTED_PIDS`` so the ``no_leftover_processes`` fixture can prove nothing outlives a test.
"""

import dataclasses
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

from tfaccel.launch.procs import LOOPBACK, free_ports, start_process, terminate

REPO_ROOT = Path(__file__).resolve().parent.parent
STARTED_PIDS: List[int] = []
# First on the PYTHONPATH of every process a test starts (tests/conftest.py): pandas and matplotlib are not
# importable there, as after `pip install tfaccel[cpu]` (tests/lean_site/README.md).
LEAN_SITE = str(Path(__file__).resolve().parent / "lean_site")


def _without_lean_site(pythonpath: Optional[str]) -> List[str]:
    return [p for p in (pythonpath or "").split(os.pathsep) if p and p != LEAN_SITE]


def lean_pythonpath(pythonpath: Optional[str]) -> str:
    """``pythonpath`` with LEAN_SITE first (once)."""
    return os.pathsep.join([LEAN_SITE] + _without_lean_site(pythonpath))


def with_optional_imports(environ: Mapping[str, str]) -> Dict[str, str]:
    """A copy of ``environ`` whose PYTHONPATH lacks LEAN_SITE: for a process that needs matplotlib or pandas."""
    return {**environ, "PYTHONPATH": os.pathsep.join(_without_lean_site(environ.get("PYTHONPATH")))}

# Quiet, small, 2-core-friendly children. Two inter-op threads, not more: an idle thread of TensorFlow's pools spins
# before it sleeps, and with several processes on 2 cores the spinning is CPU the others lose (the keras-io corpus's
# one-device process took 108-111 CPU s with 2, 119-131 s with 4, idle machine; the 4-replica ZeRO tests pass with
# 2). Parameter-server tasks set their own (workers + 1).
CHILD_ENV = {
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "TF_NUM_INTRAOP_THREADS": "1",
    "TF_NUM_INTEROP_THREADS": "2",
    "OMP_NUM_THREADS": "1",
    "PYTHONUNBUFFERED": "1",
    "PYTHONHASHSEED": "0",
}


@dataclasses.dataclass
class TaskResult:
    """What one task did: its exit code (None if it had to be killed), its output and PID."""

    task_type: str
    index: int
    pid: int
    returncode: Optional[int]
    stdout: str
    stderr: str
    timed_out: bool = False

    @property
    def name(self) -> str:
        return f"{self.task_type}:{self.index}"

    def describe(self) -> str:
        tail = "\n".join(self.stderr.strip().splitlines()[-25:])
        return f"[{self.name} pid={self.pid} rc={self.returncode} timed_out={self.timed_out}]\n{tail}"


def loopback_cluster(workers: int, *, ps: int = 0, chief: bool = False) -> Dict[str, List[str]]:
    """A cluster dict with OS-chosen free ports on 127.0.0.1."""
    ports = iter(free_ports(workers + ps + int(chief)))
    cluster: Dict[str, List[str]] = {}
    if chief:
        cluster["chief"] = [f"{LOOPBACK}:{next(ports)}"]
    cluster["worker"] = [f"{LOOPBACK}:{next(ports)}" for _ in range(workers)]
    if ps:
        cluster["ps"] = [f"{LOOPBACK}:{next(ports)}" for _ in range(ps)]
    return cluster


def tf_configs_for(cluster: Mapping[str, Sequence[str]], roles: Sequence[str] = ("chief", "worker")
                   ) -> List[Tuple[str, int, str]]:
    """(task_type, index, TF_CONFIG json) for every task of the given roles."""
    out = []
    for role in roles:
        for index in range(len(cluster.get(role, ()))):
            out.append((role, index, json.dumps({"cluster": dict(cluster), "task": {"type": role, "index": index}})))
    return out


def _reader(stream, sink: List[str]) -> None:
    for line in iter(stream.readline, ""):
        sink.append(line)
    stream.close()


def run_tasks(program: Union[str, Path], *, workers: int = 2, timeout: float = 120.0,
              tasks: Optional[Sequence[Tuple[str, int, Optional[str]]]] = None, args: Sequence[str] = (),
              env: Optional[Mapping[str, str]] = None, per_task_env: Optional[Mapping[str, Mapping[str, str]]] = None,
              fail_fast_grace: float = 20.0) -> List[TaskResult]:
    """Runs one process per task and returns their results in task order.

    Args:
        program: Python source (run with ``-c``) or the path of a ``.py`` file.
        workers: number of MultiWorkerMirrored workers when ``tasks`` is not given.
        timeout: bound on the whole run in seconds; tasks still running then are killed (``timed_out``).
        tasks: explicit ``(task_type, index, tf_config_json_or_None)`` list; None means ``workers`` workers on
            a fresh loopback cluster.
        args: extra command-line arguments for every task.
        env: extra environment for every task.
        per_task_env: extra environment per task, keyed ``"worker:1"``.
        fail_fast_grace: after a task fails, how long the others may still run before they are ended.
    """
    if tasks is None:
        tasks = tf_configs_for(loopback_cluster(workers))
    if isinstance(program, Path) or str(program).endswith(".py"):
        base_cmd = [sys.executable, str(program)]
    else:
        base_cmd = [sys.executable, "-c", str(program)]
    procs, outs, errs, threads = [], [], [], []
    try:
        for task_type, index, tf_config in tasks:
            child = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
            child.update(CHILD_ENV)
            child["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
            child.update(env or {})
            child.update((per_task_env or {}).get(f"{task_type}:{index}", {}))
            if tf_config is not None:
                child["TF_CONFIG"] = tf_config
            proc = start_process(base_cmd + list(args), env=child, cwd=str(REPO_ROOT))
            STARTED_PIDS.append(proc.pid)
            out: List[str] = []
            err: List[str] = []
            for stream, sink in ((proc.stdout, out), (proc.stderr, err)):
                thread = threading.Thread(target=_reader, args=(_text(stream), sink), daemon=True)
                thread.start()
                threads.append(thread)
            procs.append(proc)
            outs.append(out)
            errs.append(err)
        deadline = time.monotonic() + timeout
        failed_at: Optional[float] = None
        timed_out = False
        while any(p.poll() is None for p in procs):
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            if failed_at is None and any(p.poll() not in (None, 0) for p in procs):
                failed_at = now
            if failed_at is not None and now - failed_at > fail_fast_grace:
                break
            time.sleep(0.1)
        still_running = [p.poll() is None for p in procs]
    finally:
        terminate(procs, grace=3.0)
        for thread in threads:
            thread.join(timeout=5)
    results = []
    for (task_type, index, _), proc, out, err, running in zip(tasks, procs, outs, errs, still_running):
        results.append(TaskResult(task_type, index, proc.pid, None if running else proc.returncode,
                                  "".join(out), "".join(err), timed_out=running and timed_out))
    return results


def _text(stream):
    import io

    return io.TextIOWrapper(stream, encoding="utf-8", errors="replace")


def assert_all_ok(results: Sequence[TaskResult]) -> None:
    """Fails the test with every task's last stderr lines unless every task exited 0."""
    bad = [r for r in results if r.returncode != 0]
    assert not bad, "tasks failed:\n" + "\n".join(r.describe() for r in bad)


def last_json_line(text: str) -> dict:
    """The last line of ``text`` that starts with a JSON object (how child scripts report results). What follows
    the object on its line is left: ``print`` writes the text and its newline apart, and Ray's log monitor, writing
    the workers' lines to the driver's stdout from a thread of its own, once wrote between them (CI, 2026-11-30)."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                found, _ = json.JSONDecoder().raw_decode(line)
            except ValueError:
                continue
            if isinstance(found, dict):
                return found
    raise AssertionError(f"no JSON result line in output:\n{text[-2000:]}")


def run_small_ps_cluster(program: Union[str, Path], tmp_path: Path, *, timeout: float = 150.0) -> dict:
    """Runs ``program`` as a chief + 1 worker + 1 ps cluster on 127.0.0.1; returns the chief's JSON result line.

    The program gets ``PS_TEST_DONE`` (a file the chief creates when done, so the servers can exit); every task
    must exit 0.
    """
    cluster = loopback_cluster(1, ps=1, chief=True)
    tasks = tf_configs_for(cluster, roles=("ps", "worker", "chief"))
    results = run_tasks(program, tasks=tasks, timeout=timeout, env={"PS_TEST_DONE": str(tmp_path / "done")})
    assert_all_ok(results)
    chief = [r for r in results if r.task_type == "chief"][0]
    return last_json_line(chief.stdout)


def record_parity_outcomes(outcomes: Mapping[str, Mapping[str, str]]) -> None:
    """Merges ``{path: {case: outcome}}`` into the file ``TFACCEL_PARITY_JSON`` names (no variable: nothing), so
    that tests/parity and tests/real fill one table (scripts/parity_table.py)."""
    from tfaccel.resilience.atomic_io import atomic_write_json

    target = os.environ.get("TFACCEL_PARITY_JSON")
    if not target or not outcomes:
        return
    merged: Dict[str, Dict[str, str]] = {}
    if os.path.exists(target):
        with open(target, encoding="utf-8") as fh:
            merged = json.load(fh)
    for path, cases in outcomes.items():
        merged.setdefault(path, {}).update(cases)
    atomic_write_json(target, merged)


def run_under_horovod(program: Union[str, Path], args: Sequence[str], *, timeout: float) -> None:
    """Runs ``program args`` as 2 Horovod ranks over Gloo (fails, not skips, without Horovod); asserts both ended
    OK, showing their output otherwise. Their PIDs join STARTED_PIDS (the leftover-process check)."""
    sys.path.insert(0, str(REPO_ROOT / "tests" / "horovod"))
    from hvd_testing import require_horovod

    from tfaccel.launch.horovod import run_horovod

    require_horovod()
    env = {**{k: v for k, v in os.environ.items() if k != "TF_CONFIG"}, **CHILD_ENV, "PYTHONPATH": str(REPO_ROOT)}
    result = run_horovod(2, [sys.executable, str(program), *args], env=env, timeout=timeout, echo=False,
                         capture_lines=200)
    STARTED_PIDS.extend(result.pids)
    assert result.ok, f"{result.message}\n" + "\n".join(t.stdout[-3000:] + t.stderr[-3000:] for t in result.tasks)
