"""A real one-host SLURM cluster for the tests of this folder, started once per test session by
``scripts/local_slurm.sh up`` (which installs Debian's packages when they are missing) and stopped by ``down`` at
the end, a failed test or not. If SLURM cannot be installed or started, every test here fails (an error, not a
skip): CI runs as root on Debian and must run them.

Each session's cluster lives in a directory of its own, with ports taken from the OS, so two sessions (pytest-xdist
workers, two checkouts) never share one.
"""

import dataclasses
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

import harness
import pytest

SCRIPT = harness.REPO_ROOT / "scripts" / "local_slurm.sh"
VENV_BIN = str(Path(sys.executable).parent)


def _free_port_run(length: int) -> int:
    """A first port such that it and the next ``length - 1`` can be bound now on 127.0.0.1."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + length > 65000:
            continue
        try:
            held = []
            for port in range(base, base + length):
                sock = socket.socket()
                held.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise RuntimeError(f"no {length} consecutive free ports found")


@dataclasses.dataclass
class Slurm:
    """The running cluster: its directory, the environment to run SLURM commands and jobs in, and helpers."""

    dir: Path
    env: Dict[str, str]
    up_seconds: float

    def run(self, args: Sequence[str], *, timeout: float = 120, env: Optional[Dict[str, str]] = None,
            cwd: Optional[Path] = None) -> subprocess.CompletedProcess:
        """Runs a command (srun, sbatch, scontrol, ...) against the cluster, bounded in time."""
        return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout,
                              env={**self.env, **(env or {})}, cwd=str(cwd or self.dir))

    def free_port(self, length: int = 4) -> str:
        """A TFACCEL_SLURM_PORT for one job: the first of ``length`` free ports."""
        return str(_free_port_run(length))

    def job_state(self, job_id: str) -> str:
        out = self.run(["scontrol", "show", "job", job_id], timeout=30).stdout
        for field in out.split():
            if field.startswith("JobState="):
                return field.split("=", 1)[1]
        return "UNKNOWN"

    def wait_state(self, job_id: str, states: Sequence[str], timeout: float) -> str:
        """Polls the job until its state is one of ``states``; fails the test with the state it is stuck in."""
        deadline, state = time.monotonic() + timeout, ""
        while time.monotonic() < deadline:
            state = self.job_state(job_id)
            if state in states:
                return state
            time.sleep(0.3)
        raise AssertionError(f"job {job_id} still {state} after {timeout} s; wanted {list(states)}")


def _daemon_pids(directory: Path) -> List[int]:
    pids = []
    for pidfile in (directory / "run").glob("*.pid"):
        text = pidfile.read_text().strip()
        if text.isdigit():
            pids.append(int(text))
    return pids


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Slurm]:
    """Brings the cluster up once per session; brings it down (each daemon by its PID) at the end."""
    directory = tmp_path_factory.mktemp("slurm")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k != "TF_CONFIG"}
    env.update(harness.CHILD_ENV)
    env.update({"SLURM_CONF": str(directory / "slurm.conf"), "TFACCEL_SLURM_DIR": str(directory),
                "TFACCEL_SLURM_PORT_BASE": str(_free_port_run(4)),
                "PATH": os.pathsep.join([VENV_BIN, "/usr/sbin", "/usr/bin", "/sbin", "/bin", env.get("PATH", "")]),
                "PYTHONPATH": os.pathsep.join(filter(None, [str(harness.REPO_ROOT), os.environ.get("PYTHONPATH")]))})
    began = time.monotonic()
    up = subprocess.run(["bash", str(SCRIPT), "up", str(directory)], capture_output=True, text=True, timeout=600,
                        env=env)
    pids = _daemon_pids(directory)
    try:
        assert up.returncode == 0, (f"scripts/local_slurm.sh up failed (exit {up.returncode}): SLURM is required "
                                    f"for these tests\n{up.stdout}\n{up.stderr}")
        assert f"export SLURM_CONF={directory}/slurm.conf" in up.stdout, up.stdout
        print(f"\nslurm: cluster up in {time.monotonic() - began:.1f} s: " + " | ".join(up.stdout.strip().splitlines()))
        yield Slurm(directory, env, time.monotonic() - began)
    finally:
        down = subprocess.run(["bash", str(SCRIPT), "down", str(directory)], capture_output=True, text=True,
                              timeout=120, env=env)
        alive = [pid for pid in pids if _alive(pid)]
        for pid in alive:  # `down` failed to end them: end them here, by PID, and say so
            os.kill(pid, 9)
        assert down.returncode == 0 and not alive, f"local_slurm.sh down: {down.stdout}{down.stderr}; alive: {alive}"
        shutil.rmtree(directory / "state", ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie of ours is gone for this purpose
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except OSError:
        return False
