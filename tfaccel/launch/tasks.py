"""From a cluster to the tasks a launcher starts: local clusters on 127.0.0.1 with ports from the OS, the checks a
local or per-host launch makes on a cluster's addresses, and one :class:`LaunchTask` per task, each with its own
TF_CONFIG (through ``ClusterSpec.export``, the one writer of TF_CONFIG).

- MultiWorkerMirrored clusters (no ps): the command runs in every worker, the chief and the evaluator;
- parameter-server clusters: the command runs on the chief (the coordinator) and the evaluator; ps and
  worker tasks run ``python -m tfaccel.launch.server``.
"""

import ipaddress
import json
import os
import socket
from typing import Any, Callable, List, Mapping, Optional, Tuple

from tfaccel.cluster import ClusterSpec
from tfaccel.cluster.address import socket_address
from tfaccel.errors import ConfigError
from tfaccel.launch.command import server_command
from tfaccel.launch.outcome import LaunchTask
from tfaccel.launch.procs import LOOPBACK, free_ports
from tfaccel.launch.supervisor import RESTART_ENV
from tfaccel.log import get_logger

__all__ = ["build_tasks", "local_cluster", "local_specs", "load_spec", "check_count", "check_local_hosts",
           "check_ps_has_chief", "network_for"]


def _is_ps_cluster(spec: Any) -> bool:
    return bool(spec.roles.get("ps"))


def build_tasks(spec: Any, command_for: Callable[[str], Tuple[str, ...]], *, env: Mapping[str, str],
                attempt: int = 0, only: Optional[str] = None) -> List[LaunchTask]:
    """One :class:`LaunchTask` per task of ``spec`` (a ``tfaccel.cluster.ClusterSpec``).

    Args:
        spec: the cluster.
        command_for: returns the argv of the user's command for a task name (``"worker:1"``).
        env: the base environment of every task (TF_CONFIG is added per task through ``spec.export``).
        attempt: the restart count, exported as ``TFACCEL_RESTART_COUNT``. Defaults to 0.
        only: build just this task (per-host mode). Defaults to every task.

    Returns:
        The tasks in ``spec.tasks()`` order.
    """
    ps_cluster = _is_ps_cluster(spec)
    tasks = []
    for task_type, index in spec.tasks():
        name = f"{task_type}:{index}"
        if only is not None and name != only:
            continue
        server = ps_cluster and task_type in ("ps", "worker")
        child = dict(env)
        child[RESTART_ENV] = str(attempt)
        doc = spec.export(name, environ=child)  # the one writer of TF_CONFIG, into the child's env only
        cmd = server_command() if server else command_for(name)
        try:
            address: Optional[str] = spec.address(name)
        except Exception:  # noqa: BLE001 - e.g. an evaluator, which has no address in the cluster
            address = None
        tasks.append(LaunchTask(task_type, index, tuple(cmd), child, server=server, address=address,
                                tf_config=json.dumps(doc)))
    return tasks


def local_cluster(*, workers: int = 2, ps: int = 0, chief: bool = False, evaluator: bool = False,
                  host: str = LOOPBACK) -> Any:
    """A ``ClusterSpec`` on ``host`` with ports chosen by the OS.

    Args:
        workers: number of worker tasks. Defaults to 2.
        ps: number of parameter-server tasks. Defaults to 0.
        chief: add a chief task. Defaults to False.
        evaluator: add an evaluator task. Defaults to False.
        host: the address every task listens on. Defaults to 127.0.0.1.

    Raises:
        ConfigError: a count is out of range.
    """
    check_count("workers", workers, minimum=1)
    check_count("ps", ps, minimum=0)
    ports = iter(free_ports(workers + ps + int(chief) + int(evaluator), host=host))
    addr = lambda: f"{host}:{next(ports)}"  # noqa: E731
    return ClusterSpec.from_hosts(workers=[addr() for _ in range(workers)], ps=[addr() for _ in range(ps)],
                                  chief=addr() if chief else None, evaluator=addr() if evaluator else None)


def check_count(what: str, value: Any, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{what}: must be an integer >= {minimum}; received {value!r}")


def _is_local_address(host: str) -> bool:
    """True when ``host`` resolves to an address of this machine (binding to it succeeds)."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    for family, _, _, _, sockaddr in infos:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.bind((sockaddr[0], 0))
                return True
        except OSError:
            continue
    return False


def check_local_hosts(spec: Any, *, source: str = "cluster") -> None:
    """Raises ``ConfigError`` unless every address of ``spec`` is on this machine (local mode runs them all)."""
    remote = []
    for task_type, index in spec.tasks():
        try:
            address = spec.address(f"{task_type}:{index}")
        except Exception:  # noqa: BLE001 - a task without an address is not a host to check
            continue
        host = socket_address(address)[0]
        if not _is_local_address(host):
            remote.append(f"{task_type}:{index} ({address})")
    if remote:
        raise ConfigError(f"{source}: local mode starts every task on this machine, but these addresses are not "
                          f"on it: {', '.join(remote)}; run `tfaccel launch --cluster FILE --task NAME -- CMD` on "
                          "each host instead")


def _is_loopback(host: str) -> bool:
    """True when every address ``host`` resolves to is a loopback one (127.0.0.0/8, ::1)."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def network_for(spec: Any, network: str, source: str) -> str:
    """The network mode to use for ``spec``: a private namespace has only loopback, so every address must be one."""
    if network == "host":
        return network
    other = []
    for task_type, index in spec.tasks():
        try:
            address = spec.address(f"{task_type}:{index}")
        except Exception:  # noqa: BLE001 - a task without an address needs no network
            continue
        if not _is_loopback(socket_address(address)[0]):
            other.append(f"{task_type}:{index} ({address})")
    if not other:
        return network
    if network == "private":
        raise ConfigError(f"network='private': a private network namespace has only loopback, but the {source} "
                          f"names non-loopback addresses: {', '.join(other)}; use 127.0.0.1 addresses or "
                          "--network host")
    get_logger().warning("launch: the %s names non-loopback addresses (%s): running on this machine's network, "
                         "where TensorFlow's servers can be reached from other machines; use 127.0.0.1 addresses "
                         "to run in a private network", source, ", ".join(other))
    return "host"


def check_ps_has_chief(spec: Any, source: str) -> None:
    """Stops a parameter-server cluster without a chief: the chief is the task that runs the command.

    Args:
        spec: the cluster (a ``tfaccel.cluster.ClusterSpec``).
        source: what the error names first, e.g. ``"cluster file c.yaml"``.

    Raises:
        ConfigError: the cluster has ps tasks but no chief.
    """
    if _is_ps_cluster(spec) and not spec.roles.get("chief"):
        raise ConfigError(f"{source}: a parameter-server cluster needs a chief to run the command (the "
                          f"ClusterCoordinator); received roles {sorted(spec.roles)}; add a `chief` entry")


def load_spec(cluster: Any) -> Tuple[Any, str]:
    """The ``ClusterSpec`` of a launcher's ``cluster`` argument, and what error messages call it.

    Args:
        cluster: a cluster file (path), a cluster mapping or a ``tfaccel.cluster.ClusterSpec``.

    Returns:
        ``(spec, source)``: the spec, and ``"cluster file PATH"`` (also for a spec read from a file) or
        ``"cluster"``.

    Raises:
        ClusterConfigError: the file or mapping is not a valid cluster.
    """
    if isinstance(cluster, (str, os.PathLike)):
        cluster = ClusterSpec.from_file(cluster)
    elif isinstance(cluster, Mapping):
        return ClusterSpec.from_dict(dict(cluster)), "cluster"
    source = getattr(cluster, "source", "")
    return cluster, source if source.startswith("cluster file ") else "cluster"


def local_specs(*, workers: int = 2, ps: int = 0, chief: bool = False, evaluator: bool = False,
                cluster: Any = None) -> Tuple[Callable[[int], Any], List[str]]:
    """Validates a local-mode request and returns ``(make_spec, notes)``.

    ``make_spec(attempt)`` returns the cluster of an attempt: fresh OS-chosen ports on 127.0.0.1 each time
    for counts, the same addresses for a given ``cluster``. ``notes`` say what was filled in.

    Raises:
        ConfigError: bad counts, a parameter-server cluster without a chief in a file, or addresses that are
            not on this machine.
    """
    notes: List[str] = []
    if cluster is not None:
        spec, source = load_spec(cluster)
        check_ps_has_chief(spec, source)
        check_local_hosts(spec, source=source)
        return (lambda attempt: spec), notes
    check_count("workers", workers, minimum=1)
    check_count("ps", ps, minimum=0)
    if ps and not chief:
        notes.append(f"--chief: added (ps={ps} without a chief; the chief runs the command as the coordinator, "
                     "ps and worker tasks run servers)")
        chief = True
    first = local_cluster(workers=workers, ps=ps, chief=chief, evaluator=evaluator)

    def make_spec(attempt: int) -> Any:
        return first if attempt == 0 else local_cluster(workers=workers, ps=ps, chief=chief, evaluator=evaluator)

    return make_spec, notes
