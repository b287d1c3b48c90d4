"""Process primitives shared by the launcher and the test harness.

Every child gets its own session (process group) so that it and everything it started can be ended by
PID, even when the parent is interrupted. Ports come from the OS (bind port 0 on 127.0.0.1).
"""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

__all__ = ["free_ports", "start_process", "terminate", "pid_alive", "wait_for_ports", "port_open", "exit_status"]

LOOPBACK = "127.0.0.1"


def free_ports(count: int, host: str = LOOPBACK) -> List[int]:
    """Returns ``count`` distinct ports the OS reports free on ``host`` (all sockets held until all are chosen)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


# Run before the real command (then exec'd in the same PID): SIGKILL this process when its parent dies
# (prctl PR_SET_PDEATHSIG survives exec), so a SIGKILLed launcher does not leave its tasks running.
_EXEC = (
    "import os, sys\n"
    "try:\n"
    "    os.execvp(sys.argv[2], sys.argv[2:])\n"
    "except OSError as exc:\n"
    "    sys.stderr.write(f'tfaccel launch: cannot run {sys.argv[2]!r}: {exc}\\n')\n"
    "    os._exit(127)\n")
_DIE_WITH_PARENT = (
    "import ctypes, os, sys\n"
    "ctypes.CDLL(None).prctl(1, 9)\n"  # PR_SET_PDEATHSIG = 1, SIGKILL = 9
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(137)\n"  # the parent died before prctl took effect
    + _EXEC)


def start_process(cmd: Sequence[str], *, env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
                  stdout: int = subprocess.PIPE, stderr: int = subprocess.PIPE,
                  die_with_parent: bool = False, netns: Optional[Any] = None) -> subprocess.Popen:
    """Starts ``cmd`` (never through a shell) in a new session so it can be ended with its children.

    ``die_with_parent`` (Linux): the process is SIGKILLed if this process dies first, even by SIGKILL. It goes
    through a tiny Python stub that sets ``PR_SET_PDEATHSIG`` and execs ``cmd`` in the same PID (no
    ``preexec_fn``, which is unsafe with threads). Processes the command starts itself are not covered.
    ``netns``: a :class:`tfaccel.launch.netns.PrivateNetwork`; the stub joins its namespaces before the exec,
    so the command and everything it starts live in that private network.
    """
    argv = list(cmd)
    pass_fds: Tuple[int, ...] = ()
    if netns is not None or (die_with_parent and sys.platform.startswith("linux")):
        stub = ""
        if netns is not None:
            from tfaccel.launch.netns import JOIN_STUB

            pass_fds = tuple(fd for fd, _ in netns.fds)
            stub = JOIN_STUB + f"_tfaccel_join({list(netns.fds)!r})\n"
        stub += _DIE_WITH_PARENT if die_with_parent else _EXEC
        argv = [sys.executable, "-S", "-c", stub, str(os.getpid())] + argv
    return subprocess.Popen(argv, env=dict(env) if env is not None else None, cwd=cwd, stdout=stdout,
                            stderr=stderr, stdin=subprocess.DEVNULL, start_new_session=True, pass_fds=pass_fds)


def pid_alive(pid: int) -> bool:
    """True while a process with this PID exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().split(b") ", 1)[1][:1] != b"Z"
    except (OSError, IndexError):
        return True


def exit_status(proc: subprocess.Popen) -> Optional[int]:
    """``proc``'s exit status like ``Popen.returncode`` (negative: killed by that signal); None while it runs.

    Unlike ``Popen.poll()`` it never reaps the process: an exited task stays a zombie, so its PID -- the id of its
    process group -- cannot be given to another process before :func:`terminate` has signalled what is left of
    the group and reaped it.
    """
    if proc.returncode is not None:
        return proc.returncode
    try:
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped by someone else
        return proc.poll()
    if info is None or info.si_pid == 0:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    """Signals the process and its group, only while it is not reaped (its PID and group id are still its own).

    The process gets the signal once: a second delivery can land after its handler has run (Python restores the
    default action while it exits), and a task that stopped on the preemption signal (exit 75) would die of the
    second one instead (measured: SIGUSR1 twice 2 ms apart killed 8 of 8 such tasks, 10 ms apart 2 of 8).
    """
    if proc.returncode is not None:
        return  # reaped: the PID may belong to an unrelated process (and group) by now
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)  # the child leads its own session: its group id is its pid
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(proc.pid) != proc.pid:  # it left its group (or never led one): the group's signal missed it
            os.kill(proc.pid, sig)  # Popen.send_signal would reap a zombie first


def terminate(procs: Iterable[subprocess.Popen], *, grace: float = 5.0, sig: int = signal.SIGTERM) -> None:
    """Ends every process (and its group): ``sig`` (SIGTERM), then SIGKILL after ``grace`` seconds; reaps them all.

    A process that was reaped before this call (``returncode`` set) is not signalled at all, nor its group: its
    PID may have been reused. One that exited but is not reaped (see :func:`exit_status`) still pins its group id,
    so what it left running in its group gets the SIGKILL.
    """
    procs = list(procs)
    for proc in procs:
        if exit_status(proc) is None:
            _signal_group(proc, sig)
    deadline = time.monotonic() + grace
    while any(exit_status(proc) is None for proc in procs) and time.monotonic() < deadline:
        time.sleep(0.02)
    for proc in procs:
        # SIGKILL the group even when the leader has exited: its children may still be alive.
        _signal_group(proc, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when something accepts TCP connections at host:port."""
    with contextlib.suppress(OSError):
        with socket.create_connection((host, port), timeout=timeout):
            return True
    return False


def wait_for_ports(addresses: Sequence[Tuple[str, int]], *, timeout: float,
                   poll: float = 0.2) -> List[Tuple[str, int]]:
    """Waits until every address accepts connections; returns those that never did within ``timeout``."""
    pending = list(addresses)
    deadline = time.monotonic() + timeout
    while pending:
        pending = [addr for addr in pending if not port_open(*addr)]
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(poll)
    return pending


def child_env(extra: Optional[Dict[str, str]] = None, *, drop: Iterable[str] = ()) -> Dict[str, str]:
    """A copy of this process's environment with ``extra`` set and the names in ``drop`` removed."""
    env = {k: v for k, v in os.environ.items() if k not in set(drop)}
    env.update(extra or {})
    return env
