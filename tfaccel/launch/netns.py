"""A private, loopback-only network for a local cluster (Linux network namespaces).

TensorFlow 2.21's gRPC server binds ``0.0.0.0:<port>`` and ``[::]:<port>`` whatever address the cluster gives
a task (``grpc_server_lib.cc``), so a "local" tf.distribute cluster on 127.0.0.1 is in fact reachable on every
interface of the machine: anyone on the network can connect to its workers and ps tasks, which run whatever
graph they are sent. tfaccel therefore runs a local cluster inside a network namespace of its own in which the
only interface is ``lo``: the tasks still bind 0.0.0.0, but that namespace's 0.0.0.0 is its loopback alone, so
nothing of the cluster can be reached from outside it — not even from the host's own loopback.

How: a small *holder* process (``python -S -c``) unshares a new network namespace — as root (CAP_SYS_ADMIN) a
plain ``unshare(CLONE_NEWNET)``; otherwise inside a new user namespace that maps only the caller's own uid and
gid (what ``unshare -rn`` does, without the root mapping) — brings ``lo`` up and then answers port probes for
the launcher (which stays outside). Every task is started through the launcher's exec stub, which ``setns``-es
into the holder's namespaces (file descriptors passed to it) before it execs the command, so all tasks share
one loopback. The holder dies with the launcher (PR_SET_PDEATHSIG) and the namespace with its last process.

The price: the tasks cannot reach other machines (no downloads, no remote file systems). ``network="host"``
(``tfaccel launch --network host``) runs them on the host's network as before.

Example:
    >>> from tfaccel.launch.netns import PrivateNetwork
    >>> with PrivateNetwork.create() as net:  # doctest: +SKIP
    ...     net.port_open("127.0.0.1", 8470)
    False
"""

import contextlib
import dataclasses
import functools
import os
import select
import subprocess
import sys
import time
from typing import List, Optional, Tuple

from tfaccel.errors import ConfigError, TfaccelError

__all__ = ["NETWORK_MODES", "PrivateNetwork", "NetworkIsolationError", "check_network_mode", "open_network",
           "isolation_available", "JOIN_STUB"]

NETWORK_MODES = ("auto", "private", "host")
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
_READY_TIMEOUT_S = 15.0

# The holder: make the namespace, bring lo up, report "ready <kind>", answer "probe <host> <port> <timeout>"
# lines with "1"/"0" until stdin closes. Errors are reported as "error <text>" and exit 3.
_HOLDER = r"""
import ctypes, errno, fcntl, os, socket, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(1, 9)  # PR_SET_PDEATHSIG = SIGKILL: gone with the launcher
if os.getppid() != int(sys.argv[1]):
    os._exit(137)
NEWNET, NEWUSER = 0x40000000, 0x10000000
def fail(text):
    sys.stdout.write("error " + text.replace("\n", " ") + "\n"); sys.stdout.flush(); os._exit(3)
def unshare(flags):
    if libc.unshare(flags) != 0:
        return os.strerror(ctypes.get_errno())
    return None
kind, why = None, []
if os.geteuid() == 0:
    err = unshare(NEWNET)
    if err is None:
        kind = "net"
    else:
        why.append("unshare(CLONE_NEWNET) as root: " + err)
if kind is None:
    uid, gid = os.geteuid(), os.getegid()
    err = unshare(NEWUSER | NEWNET)
    if err is not None:
        why.append("unshare(CLONE_NEWUSER|CLONE_NEWNET): " + err)
        fail("; ".join(why))
    try:
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write("%d %d 1" % (uid, uid))
        with open("/proc/self/gid_map", "w") as f:
            f.write("%d %d 1" % (gid, gid))
    except OSError as exc:
        fail("mapping uid/gid in the new user namespace: %s" % exc)
    kind = "user"
try:  # lo comes up DOWN in a new namespace: SIOCGIFFLAGS / SIOCSIFFLAGS with IFF_UP
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    flags = struct.unpack("16sH", fcntl.ioctl(sock, 0x8913, struct.pack("16sH", b"lo", 0)))[1]
    fcntl.ioctl(sock, 0x8914, struct.pack("16sH", b"lo", flags | 1))
    sock.close()
except OSError as exc:
    fail("bringing up lo in the new network namespace: %s" % exc)
sys.stdout.write("ready %s\n" % kind); sys.stdout.flush()
for line in sys.stdin:
    words = line.split()
    ok = 0
    if len(words) == 4 and words[0] == "probe":
        try:
            socket.create_connection((words[1], int(words[2])), timeout=float(words[3])).close()
            ok = 1
        except (OSError, ValueError):
            ok = 0
    sys.stdout.write("%d\n" % ok); sys.stdout.flush()
"""

# Joins the namespaces whose descriptors are given (user first: entering a user namespace is what gives the
# right to enter a network namespace it owns), then execs the rest of the argv. Used by procs.start_process.
JOIN_STUB = (
    "def _tfaccel_join(fds):\n"
    "    import ctypes, os, sys\n"
    "    libc = ctypes.CDLL(None, use_errno=True)\n"
    "    for fd, flag in fds:\n"
    "        if libc.setns(fd, flag) != 0:\n"
    "            sys.stderr.write('tfaccel launch: cannot join the private network namespace (setns %#x): %s\\n'\n"
    "                             % (flag, os.strerror(ctypes.get_errno())))\n"
    "            os._exit(126)\n"
    "        os.close(fd)\n")


class NetworkIsolationError(TfaccelError, RuntimeError):
    """A private network namespace was asked for (``network="private"``) but cannot be made here."""


def check_network_mode(network: str, *, where: str = "network") -> str:
    """Validates a network mode ("auto", "private", "host") and returns it."""
    if network not in NETWORK_MODES:
        raise ConfigError(f"{where}: must be one of {', '.join(NETWORK_MODES)}; received {network!r}. 'private' "
                          "runs the local cluster in a loopback-only network namespace, 'host' on this machine's "
                          "network, 'auto' private where the system allows it")
    return network


@dataclasses.dataclass
class PrivateNetwork:
    """A loopback-only network namespace held by a helper process; tasks join it, the launcher probes through it.

    Attributes:
        kind: ``"net"`` (a network namespace made as root) or ``"user"`` (inside a user namespace mapping the
            caller's own uid).
        holder: the helper process (it answers port probes).
        fds: open descriptors of the namespaces to join, in order (``(fd, CLONE_*)``).
    """

    kind: str
    holder: subprocess.Popen
    fds: List[Tuple[int, int]]

    @classmethod
    def create(cls, *, timeout: float = _READY_TIMEOUT_S) -> "PrivateNetwork":
        """Makes the namespace. Raises NetworkIsolationError (with the system's reason) where it cannot."""
        if not sys.platform.startswith("linux"):
            raise NetworkIsolationError(f"network namespaces are Linux only; this is {sys.platform}")
        holder = subprocess.Popen([sys.executable, "-S", "-c", _HOLDER, str(os.getpid())], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
                                  start_new_session=True)
        line = _read_line(holder, timeout)
        if not line.startswith("ready "):
            _end(holder)
            err = holder.stderr.read() if holder.stderr else ""
            reason = line[len("error "):] if line.startswith("error ") else (line or err.strip() or
                                                                            f"no answer in {timeout:g} s")
            raise NetworkIsolationError(reason)
        kind = line.split()[1]
        fds: List[Tuple[int, int]] = []
        try:
            if kind == "user":
                fds.append((os.open(f"/proc/{holder.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC), CLONE_NEWUSER))
            fds.append((os.open(f"/proc/{holder.pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC), CLONE_NEWNET))
        except OSError as exc:
            for fd, _ in fds:
                os.close(fd)
            _end(holder)
            raise NetworkIsolationError(f"cannot open the namespace of the helper process: {exc}") from exc
        return cls(kind=kind, holder=holder, fds=fds)

    @property
    def inode(self) -> int:
        """The network namespace's inode (what ``/proc/<pid>/ns/net`` of every task points to)."""
        return os.fstat(self.fds[-1][0]).st_ino

    def describe(self) -> str:
        how = "as root" if self.kind == "net" else "in a user namespace mapping only this uid"
        return f"a private network namespace (net:[{self.inode}], {how}) whose only interface is lo"

    def port_open(self, host: str, port: int, timeout: float = 0.5) -> bool:
        """True when something accepts TCP connections at host:port *inside* the namespace."""
        if self.holder.poll() is not None or self.holder.stdin is None:
            return False
        try:
            self.holder.stdin.write(f"probe {host} {int(port)} {float(timeout)}\n")
            self.holder.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            return False
        return _read_line(self.holder, timeout + 5.0) == "1"

    def close(self) -> None:
        for fd, _ in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = []
        _end(self.holder)

    def __enter__(self) -> "PrivateNetwork":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read_line(proc: subprocess.Popen, timeout: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        return ""
    return proc.stdout.readline().strip()


def _end(proc: subprocess.Popen) -> None:
    with contextlib.suppress(OSError, ValueError):
        if proc.stdin:
            proc.stdin.close()
    try:
        proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)
    for stream in (proc.stdout, proc.stderr):
        with contextlib.suppress(OSError, ValueError):
            if stream:
                stream.close()


@functools.lru_cache(maxsize=None)
def isolation_available() -> Tuple[bool, str]:
    """(True, kind) when a private network namespace can be made here, else (False, the reason). Cached."""
    try:
        with PrivateNetwork.create() as net:
            return True, net.kind
    except NetworkIsolationError as exc:
        return False, str(exc)


def open_network(network: str, *, log: object = None) -> Optional[PrivateNetwork]:
    """The namespace for ``network`` ("auto"/"private"/"host"): a PrivateNetwork, or None for the host network.

    "private" raises NetworkIsolationError when it cannot be made; "auto" falls back to the host network with a
    warning that says why and what the cluster's exposure is.
    """
    check_network_mode(network)
    if network == "host":
        return None
    started = time.monotonic()
    try:
        net = PrivateNetwork.create()
    except NetworkIsolationError as exc:
        if network == "private":
            raise NetworkIsolationError(
                f"network='private': cannot make a private network namespace here: {exc}. Run as root, allow "
                "unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1 / "
                "user.max_user_namespaces > 0; in a container: --cap-add SYS_ADMIN or a seccomp profile that "
                "allows unshare), or pass --network host and firewall the cluster's ports") from exc
        if log is not None:
            log.warning("launch: the local cluster runs on this machine's network: a private network namespace "
                        "cannot be made here (%s), so other machines can reach the cluster's ports: firewall them "
                        "(the next warning names them), or pass --network host to choose this explicitly", exc)
        return None
    if log is not None:
        log.info("launch: tasks run in %s (made in %.2f s): the cluster's ports cannot be reached from outside it, "
                 "and the tasks cannot reach other machines (pass --network host if they must)", net.describe(),
                 time.monotonic() - started)
    return net
