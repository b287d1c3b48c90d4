"""Local mode: every task of a cluster on this machine.

``run_local`` (and ``tfaccel launch --workers N`` / ``tfaccel launch --cluster FILE``) builds a cluster on
127.0.0.1 with ports chosen by the OS (or takes a cluster whose addresses are all on this host), gives every
task its own TF_CONFIG and starts one process per task under the supervisor:

- MultiWorkerMirrored clusters (no ps): the command runs in every worker, the chief and the evaluator;
- parameter-server clusters: the command runs on the chief (the coordinator) and the evaluator; ps and
  worker tasks run ``python -m tfaccel.launch.server``; they are ended when the command tasks are done.
"""

import os
import pickle
import shlex
import shutil
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from tfaccel.errors import ConfigError
from tfaccel.launch.netns import check_network_mode
from tfaccel.launch.procs import LOOPBACK, free_ports
from tfaccel.launch.supervisor import RESTART_ENV, LaunchResult, LaunchTask, TaskOutcome, run_job
from tfaccel.log import get_logger

__all__ = ["run_local", "local_cluster", "local_specs", "build_tasks", "normalize_command", "server_command",
           "child_base_env", "check_local_hosts", "check_ps_has_chief", "load_spec", "warn_inherited_tf_config",
           "CHILD_DEFAULT_ENV"]

Command = Union[str, Sequence[str], Callable[..., Any]]

# Set in every child unless the caller's environment already has them.
# PYTHONUNBUFFERED: lines reach the launcher as they are written. TFACCEL_OUTPUT_PREFIXED: the launcher
# prefixes every line with the task, so tfaccel's logger in the task does not add a second prefix.
CHILD_DEFAULT_ENV = {"PYTHONUNBUFFERED": "1", "TFACCEL_OUTPUT_PREFIXED": "1"}


def server_command() -> Tuple[str, ...]:
    """The argv of a server task (ps, or worker of a parameter-server cluster)."""
    return (sys.executable, "-m", "tfaccel.launch.server")


def normalize_command(cmd: Union[str, Sequence[str]], *, check_exists: bool = False,
                      env: Optional[Mapping[str, str]] = None) -> Tuple[Tuple[str, ...], List[str]]:
    """Turns a command into an argv (never a shell) and says what it filled in.

    A string is split like a shell would (``shlex``) but never run by one; a first word ending in ``.py`` is run
    with this Python (``sys.executable``).

    Args:
        cmd: the command.
        check_exists: raise when the program is not found here (on ``PATH`` of ``env``, or as a path).
            Defaults to False (e.g. a command for other hosts).
        env: the environment whose ``PATH`` is searched. Defaults to this process's.

    Returns:
        ``(argv, notes)`` where notes describe what was filled in.

    Raises:
        ConfigError: the command is empty, or (``check_exists``) its program or script is not found.
    """
    argv = shlex.split(cmd) if isinstance(cmd, str) else [str(part) for part in cmd]
    notes = []
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise ConfigError("command: received an empty command; put the program after `--`, e.g. "
                          "`tfaccel launch --workers 2 -- python train.py`")
    if argv[0].endswith(".py"):
        if check_exists and not os.path.isfile(argv[0]):
            raise ConfigError(f"command: script {argv[0]!r} not found (received {shlex.join(argv)!r}, working "
                              f"directory {os.getcwd()}); check the path")
        notes.append(f"{argv[0]} is run with this Python ({sys.executable})")
        argv = [sys.executable] + argv
    elif check_exists:
        path = (env if env is not None else os.environ).get("PATH", os.defpath)
        if shutil.which(argv[0], path=path) is None:
            where = "not an executable file" if os.sep in argv[0] else "not found on PATH"
            raise ConfigError(f"command: program {argv[0]!r} {where} (received {shlex.join(argv)!r}); give its full "
                              "path or install it")
    return tuple(argv), notes


def child_base_env(env: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The environment every task starts from: this process's, without TF_CONFIG, plus defaults and ``env``."""
    base = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    for key, value in CHILD_DEFAULT_ENV.items():
        base.setdefault(key, value)
    base.update(env or {})
    if "TF_CONFIG" in (env or {}):
        raise ConfigError("env: TF_CONFIG cannot be set through env; the launcher gives every task its own. "
                          "Pass a cluster (--cluster FILE) instead")
    return base


def warn_inherited_tf_config() -> None:
    """Says that the launcher's own TF_CONFIG is not passed on (every task gets its own from the cluster)."""
    inherited = os.environ.get("TF_CONFIG")
    if inherited:
        get_logger().warning("launch: TF_CONFIG is set in the launcher's environment (%s); it is not passed on: "
                             "every task gets its own from the cluster. To launch the cluster it describes, save "
                             "its \"cluster\" part to a file and pass --cluster FILE", inherited[:120])


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
    import json

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
    from tfaccel.cluster import ClusterSpec

    _check_count("workers", workers, minimum=1)
    _check_count("ps", ps, minimum=0)
    ports = iter(free_ports(workers + ps + int(chief) + int(evaluator), host=host))
    addr = lambda: f"{host}:{next(ports)}"  # noqa: E731
    return ClusterSpec.from_hosts(workers=[addr() for _ in range(workers)], ps=[addr() for _ in range(ps)],
                                  chief=addr() if chief else None, evaluator=addr() if evaluator else None)


def _check_count(what: str, value: Any, *, minimum: int) -> None:
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
        host = address.rpartition(":")[0].strip("[]")
        if not _is_local_address(host):
            remote.append(f"{task_type}:{index} ({address})")
    if remote:
        raise ConfigError(f"{source}: local mode starts every task on this machine, but these addresses are not "
                          f"on it: {', '.join(remote)}; run `tfaccel launch --cluster FILE --task NAME -- CMD` on "
                          "each host instead")


def _is_loopback(host: str) -> bool:
    """True when every address ``host`` resolves to is a loopback one (127.0.0.0/8, ::1)."""
    import ipaddress

    try:
        infos = socket.getaddrinfo(host.strip("[]"), None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def _network_for(spec: Any, network: str, source: str) -> str:
    """The network mode to use for ``spec``: a private namespace has only loopback, so every address must be one."""
    if network == "host":
        return network
    other = []
    for task_type, index in spec.tasks():
        try:
            address = spec.address(f"{task_type}:{index}")
        except Exception:  # noqa: BLE001 - a task without an address needs no network
            continue
        if not _is_loopback(address.rpartition(":")[0]):
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
        ``(spec, source)``: the spec, and ``"cluster file PATH"`` or ``"cluster"``.

    Raises:
        ClusterConfigError: the file or mapping is not a valid cluster.
    """
    from tfaccel.cluster import ClusterSpec

    if isinstance(cluster, (str, os.PathLike)):
        return ClusterSpec.from_file(cluster), f"cluster file {cluster}"
    if isinstance(cluster, Mapping):
        return ClusterSpec.from_dict(dict(cluster)), "cluster"
    return cluster, "cluster"


class _CallablePayload:
    """Writes a callable to a temporary file and reads back what each task returned."""

    def __init__(self, func: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        try:
            import cloudpickle as pickler  # functions defined in __main__ / a notebook travel by value
        except ImportError:
            pickler = pickle
        self.tmp = tempfile.TemporaryDirectory(prefix="tfaccel-launch-")
        self.payload = Path(self.tmp.name) / "payload.pkl"
        try:
            self.payload.write_bytes(pickler.dumps((func, tuple(args), dict(kwargs))))
        except Exception as exc:  # noqa: BLE001 - pickling errors come in many types
            self.tmp.cleanup()
            raise ConfigError(f"cmd_or_callable: {func!r} cannot be sent to the task processes ({exc}); define it "
                              "at module level, or install cloudpickle") from exc

    def result_path(self, attempt: int, name: str) -> Path:
        return Path(self.tmp.name) / f"result-{attempt}-{name.replace(':', '-')}.pkl"

    def command(self, attempt: int, name: str) -> Tuple[str, ...]:
        return (sys.executable, "-m", "tfaccel.launch._call", str(self.payload), str(self.result_path(attempt, name)))

    def collect(self, attempt: int, outcomes: List[TaskOutcome]) -> None:
        for outcome in outcomes:
            path = self.result_path(attempt, outcome.name)
            if path.exists():
                outcome.value = pickle.loads(path.read_bytes())


def _pythonpath_env(base: Mapping[str, str]) -> Dict[str, str]:
    """Lets a callable's module (e.g. a test file) be imported by the task: this process's sys.path first."""
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    existing = base.get("PYTHONPATH")
    return {"PYTHONPATH": os.pathsep.join(paths + ([existing] if existing else []))}


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
    _check_count("workers", workers, minimum=1)
    _check_count("ps", ps, minimum=0)
    if ps and not chief:
        notes.append(f"--chief: added (ps={ps} without a chief; the chief runs the command as the coordinator, "
                     "ps and worker tasks run servers)")
        chief = True
    first = local_cluster(workers=workers, ps=ps, chief=chief, evaluator=evaluator)

    def make_spec(attempt: int) -> Any:
        return first if attempt == 0 else local_cluster(workers=workers, ps=ps, chief=chief, evaluator=evaluator)

    return make_spec, notes


def run_local(cmd_or_callable: Command, *, workers: int = 2, ps: int = 0, chief: bool = False,
              evaluator: bool = False, timeout: Optional[float] = None, max_restarts: int = 0,
              env: Optional[Mapping[str, str]] = None, cluster: Any = None, args: Sequence[Any] = (),
              kwargs: Optional[Mapping[str, Any]] = None, grace: float = 10.0, connect_timeout: float = 60.0,
              echo: bool = True, capture_lines: Optional[int] = None, network: str = "auto") -> LaunchResult:
    """Runs a command (or a Python callable) in every task of a cluster on this machine.

    TensorFlow's servers bind 0.0.0.0 whatever address they are given, so by default the tasks run in a private
    network namespace whose only interface is loopback (see :mod:`tfaccel.launch.netns`): nothing of the
    cluster can be reached from outside it, and the tasks cannot reach other machines either.

    Args:
        cmd_or_callable: an argv list, a command string (split, never run by a shell), or a picklable
            callable (called with ``args``/``kwargs`` in each task; its return value lands in
            ``TaskOutcome.value``).
        workers: number of worker tasks. Defaults to 2.
        ps: number of parameter-server tasks; with ps the command runs on the chief only (one is added when
            ``chief`` is False) and ps and worker tasks run servers. Defaults to 0.
        chief: add a chief task. Defaults to False.
        evaluator: add an evaluator task (it runs the command too). Defaults to False.
        timeout: bound on the whole run in seconds, restarts included. Defaults to None (no bound).
        max_restarts: restart the whole job (fresh ports) up to this many times after a failure. Defaults to 0.
        env: extra environment for every task. Defaults to None.
        cluster: a cluster file, dict or ``ClusterSpec`` whose addresses are all on this machine, instead of
            ``workers``/``ps``/``chief``/``evaluator``. Defaults to None.
        args: positional arguments for a callable. Defaults to ().
        kwargs: keyword arguments for a callable. Defaults to None.
        grace: seconds between SIGTERM and SIGKILL when tasks are stopped. Defaults to 10.
        connect_timeout: seconds the server tasks get to accept connections. Defaults to 60.
        echo: stream every task's output with a ``[worker 1]`` prefix. Defaults to True.
        capture_lines: keep only the last N lines of each task's output; None keeps all. Defaults to None.
        network: ``"private"`` (a loopback-only network namespace; an error where the system cannot make
            one), ``"host"`` (this machine's network: the ports are reachable from other machines) or
            ``"auto"`` (private where possible, else host with a warning). Defaults to "auto".

    Returns:
        A ``LaunchResult``: ``returncode``, ``tasks`` (``TaskOutcome(name, returncode, stdout, stderr, pid,
        stopped, value)``), ``restarts``, ``reason``, ``failed_task``, ``message``, ``attempts``.

    Raises:
        ConfigError: bad counts, a conflict between ``cluster`` and the counts, an empty command, a cluster with
            addresses on another machine, a bad ``network``, ``network="private"`` with a cluster whose
            addresses are not loopback ones.
        NetworkIsolationError: ``network="private"`` where no private network namespace can be made.

    Example:
        >>> from tfaccel.launch import run_local
        >>> result = run_local(["python", "-c", "import os; print(os.environ['TF_CONFIG'])"])  # doctest: +SKIP
        >>> result.returncode, [t.name for t in result.tasks]  # doctest: +SKIP
        (0, ['worker:0', 'worker:1'])
    """
    log = get_logger()
    _check_count("max_restarts", max_restarts, minimum=0)
    if timeout is not None and timeout <= 0:
        raise ConfigError(f"timeout: must be a positive number of seconds or None; received {timeout!r}")
    if cluster is not None and (ps or chief or evaluator or workers != 2):
        raise ConfigError("cluster: given together with workers/ps/chief/evaluator; received "
                          f"workers={workers}, ps={ps}, chief={chief}, evaluator={evaluator}; pass either a "
                          "cluster or the counts")
    check_network_mode(network)
    make_spec, notes = local_specs(workers=workers, ps=ps, chief=chief, evaluator=evaluator, cluster=cluster)
    for note in notes:
        log.info("launch: %s", note)
    network = _network_for(make_spec(0), network, "cluster" if cluster is not None else "local cluster")
    warn_inherited_tf_config()
    base_env = child_base_env(env)
    payload: Optional[_CallablePayload] = None
    if callable(cmd_or_callable):
        payload = _CallablePayload(cmd_or_callable, args, kwargs or {})
        base_env.update(_pythonpath_env(base_env))
    else:
        if args or kwargs:
            raise ConfigError("args/kwargs: only for a callable; received a command "
                              f"{cmd_or_callable!r}; put its arguments in the command")
        argv, notes = normalize_command(cmd_or_callable, check_exists=True, env=base_env)
        for note in notes:
            log.info("launch: %s", note)

    def make_tasks(attempt: int) -> List[LaunchTask]:
        spec = make_spec(attempt)
        if payload is not None:
            command_for = lambda name: payload.command(attempt, name)  # noqa: E731
        else:
            command_for = lambda name: argv  # noqa: E731
        return build_tasks(spec, command_for, env=base_env, attempt=attempt)

    try:
        return run_job(make_tasks, max_restarts=max_restarts, timeout=timeout, grace=grace,
                       connect_timeout=connect_timeout, echo=echo, capture_lines=capture_lines,
                       on_attempt_end=payload.collect if payload is not None else None, network=network)
    finally:
        if payload is not None:
            payload.tmp.cleanup()
