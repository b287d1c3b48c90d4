"""Real Ray on 127.0.0.1 for the tests: a `ray start --head` cluster with a second node, runs of
``python -m tfaccel launch --backend ray``, and a check that no process a test started survives it.

The cluster lives in a private loopback-only network namespace (tfaccel.launch.netns), with its drivers and
launches: Ray 2.60 replaces a 127.0.0.1 address given to `ray.init` / `ray start --address` by this machine's
own IP (``resolve_ip_for_localhost``), which a head bound to 127.0.0.1 does not listen on; inside the namespace
that IP is 127.0.0.1 itself, and nothing of the cluster can be reached from outside.

Every process a test starts carries ``TFACCEL_RAY_TEST_MARK=<uuid>`` in its environment, and Ray's own
processes (GCS, raylet, workers) inherit it from the `ray start` (or driver) that started them, so
:func:`marked_pids` finds all of them, whatever session or process group they put themselves in.
"""

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

import harness
from tfaccel.launch.netns import PrivateNetwork
from tfaccel.launch.procs import start_process, terminate

MARK_ENV = "TFACCEL_RAY_TEST_MARK"
SCRIPTS = Path(__file__).resolve().parent / "scripts"
RAY_BIN = Path(sys.executable).parent / "ray"


def test_env(mark: str, extra: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """This process's environment for a child: quiet TF, the repo on PYTHONPATH (pandas importable: see
    harness.LEAN_SITE), the mark, no stray cluster."""
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "RAY_ADDRESS")}
    env.update(harness.CHILD_ENV)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(harness.REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    if mark.startswith("cluster-"):
        env["RAY_AUTH_MODE"] = "disabled"  # see RayCluster.__init__
    env[MARK_ENV] = mark
    env.update(extra or {})
    return harness.with_optional_imports(env)  # Ray Train imports pandas


def marked_pids(mark: str) -> List[int]:
    """PIDs of live (non-zombie) processes whose environment carries ``mark``."""
    import psutil

    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get(MARK_ENV) == mark:
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def kill_marked(mark: str, *, wait: float = 20.0) -> List[int]:
    """SIGKILLs every process carrying ``mark`` after ``wait`` seconds of letting them exit; returns the
    PIDs that were still alive after ``wait`` (they should have ended on their own)."""
    deadline = time.monotonic() + wait
    while marked_pids(mark) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = marked_pids(mark)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


class RayCluster:
    """`ray start --head --block` on 127.0.0.1 plus ``extra_nodes`` nodes joined with `ray start --address`."""

    def __init__(self, *, head_cpus: int = 1, extra_nodes: int = 1, node_cpus: int = 1) -> None:
        self.mark = f"cluster-{uuid.uuid4().hex[:12]}"
        self.temp_dir = tempfile.mkdtemp(prefix="tfr-")  # short: Ray's unix socket paths must fit 107 bytes
        self.net = PrivateNetwork.create()
        self.port = 6379  # the namespace is empty: Ray's default port is free
        self.address = f"127.0.0.1:{self.port}"
        self.procs: List[subprocess.Popen] = []
        self.node_dirs: List[str] = []
        # Token authentication off: clients started beside the cluster did not find the head's token (its
        # --temp-dir is private); the namespace already keeps everyone else out.
        env = test_env(self.mark, {"RAY_AUTH_MODE": "disabled"})
        common = ["--block", "--disable-usage-stats", "--node-ip-address", "127.0.0.1"]
        try:
            self._start([str(RAY_BIN), "start", "--head", "--port", str(self.port), "--num-cpus", str(head_cpus),
                         "--include-dashboard", "false", "--temp-dir", self.temp_dir, *common], env)
            self.wait_for_nodes(1, timeout=90)
            for _ in range(extra_nodes):
                # Its own temp dir, as on another machine: nodes sharing the head's log directory each forward
                # every worker's output to the drivers, so every line arrived twice.
                self.node_dirs.append(tempfile.mkdtemp(prefix="tfn-"))
                self._start([str(RAY_BIN), "start", "--address", self.address, "--num-cpus", str(node_cpus),
                             "--temp-dir", self.node_dirs[-1], *common], env)
            self.wait_for_nodes(1 + extra_nodes, timeout=90)
        except BaseException:
            self.stop()  # a cluster that never came up must not outlive the test either
            raise

    def _start(self, cmd: Sequence[str], env: Mapping[str, str]) -> None:
        proc = start_process(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, netns=self.net)
        harness.STARTED_PIDS.append(proc.pid)
        self.procs.append(proc)

    def wait_for_nodes(self, count: int, *, timeout: float) -> None:
        """Waits until ``count`` nodes are alive (asked in a subprocess: no Ray state in the test process)."""
        probe = ("import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False); "
                 "print(sum(1 for n in ray.nodes() if n['Alive'])); ray.shutdown()")
        deadline = time.monotonic() + timeout
        seen = "?"
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"a `ray start` process exited: {[p.returncode for p in self.procs]}")
            run = run_in(self, [sys.executable, "-c", probe, self.address], timeout=60)
            seen = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stdout[-300:]
            if seen == str(count):
                return
            time.sleep(2)
        raise RuntimeError(f"the Ray cluster at {self.address} did not reach {count} node(s) in {timeout} s: {seen}")

    def stop(self) -> List[int]:
        """Stops every node (SIGINT to `ray start --block`, which stops its node and exits in 1-3 s; after a
        SIGTERM the head's `ray start` did not exit within 20 s, here, and was SIGKILLed) and then anything left;
        returns the PIDs that had to be SIGKILLed by mark."""
        for proc in reversed(self.procs):
            terminate([proc], grace=20, sig=signal.SIGINT)
        left = kill_marked(self.mark, wait=10)
        self.net.close()
        import shutil

        for path in [self.temp_dir, *self.node_dirs]:
            shutil.rmtree(path, ignore_errors=True)
        return left


def run_in(cluster: Optional["RayCluster"], cmd: Sequence[str], *, mark: Optional[str] = None,
           env: Optional[Mapping[str, str]] = None, timeout: float = 300) -> "subprocess.CompletedProcess[str]":
    """Runs ``cmd`` (in the cluster's network namespace when given) bounded by ``timeout``; stdout+stderr in
    ``stdout``."""
    mark = mark or cluster.mark
    proc = start_process(cmd, env=test_env(mark, env), cwd=str(harness.REPO_ROOT), stderr=subprocess.STDOUT,
                         netns=cluster.net if cluster is not None else None)
    harness.STARTED_PIDS.append(proc.pid)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        terminate([proc], grace=10)
        out, _ = proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out.decode("utf-8", "replace"), "")


def launch(args: Sequence[str], *, mark: Optional[str] = None, cluster: Optional[RayCluster] = None,
           env: Optional[Mapping[str, str]] = None, timeout: float = 300) -> "subprocess.CompletedProcess[str]":
    """``python -m tfaccel launch ARGS`` (in the cluster's network namespace when given); the job's variables in
    ``env`` are passed to the Ray workers with ``--env NAME`` (nothing else of the launcher's environment is)."""
    args = list(args)
    if env and "ray" in args and "--" in args:
        cut = args.index("--")
        args[cut:cut] = [word for name in env for word in ("--env", name)]
    return run_in(cluster, [sys.executable, "-m", "tfaccel", "launch", *args], mark=mark, env=env, timeout=timeout)
