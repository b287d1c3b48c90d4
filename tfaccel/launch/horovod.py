"""``tfaccel launch --backend horovod``: start Horovod ranks through ``horovodrun`` (Gloo).

tfaccel builds Horovod without MPI (see ``scripts/install_horovod.sh``), so ranks always talk over Gloo:
``horovodrun --gloo -np N -H host:slots,... CMD``. ``horovodrun`` starts the ranks itself (locally, or
over ssh on other hosts) and prefixes their output with ``[rank]<stdout>:``; tfaccel supervises the one
``horovodrun`` process: bounded by a timeout, stopped with its process group, its output streamed.

Restarts (``max_restarts``, issue 9 R1): horovodrun ends every rank when one fails and exits non-zero; the
job is then run again as a whole (a fresh horovodrun, all ranks, a fresh rendezvous port). With
``compile_and_fit(backup_dir=...)`` the ranks resume from the last step-level backup (written by rank 0).

What reaches the ranks: horovodrun writes every variable of its own environment onto each rank's command line
(``env K=V ... CMD``, which any user of the host can read with ``ps``, and which goes over ssh to other hosts), so
horovodrun gets only what the ranks need (:func:`horovod_env`): what running a program needs (``PATH``, ``HOME``,
``PYTHONPATH``, ...), ``TFACCEL_*``, ``TF_*``, ``HOROVOD_*``, ``GLOO_*``, the launch's ``env`` and ``--env`` names.

Batch semantics: every rank runs the same command on its own shard; tfaccel's ``global_batch_size`` is
still the global batch (each rank steps on ``global_batch_size // N`` examples).
"""

import os
import re
import shutil
import sys
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

from tfaccel.cluster.limits import shorten
from tfaccel.errors import EXIT_PREEMPTED, BackendUnavailableError, ConfigError
from tfaccel.launch.envpolicy import check_env_names, runtime_env
from tfaccel.job_id import new_job_id
from tfaccel.launch.command import CHILD_DEFAULT_ENV, child_base_env, export_job_id, normalize_command
from tfaccel.launch.netns import check_network_mode
from tfaccel.launch.outcome import LaunchResult, LaunchTask, TaskOutcome
from tfaccel.launch.supervisor import RESTART_ENV, run_job
from tfaccel.log import get_logger

__all__ = ["build_horovodrun_command", "run_horovod", "parse_hosts", "find_horovodrun", "horovod_env",
           "rank_preempted"]

INSTALL_HINT = ("build Horovod against the installed TensorFlow with `bash scripts/install_horovod.sh .venv` "
                "(see docs/guides/horovod.md)")

_HOST_RE = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+)(?::(?P<slots>\d+))?$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PREEMPTED_RANK = re.compile(rf"Exit code:\s*{EXIT_PREEMPTED}\b")
# Horovod's and Gloo's own settings, and the ssh agent horovodrun uses to reach other hosts.
HOROVOD_PREFIXES = ("HOROVOD_", "GLOO_")
HOROVOD_NAMES = frozenset({"SSH_AUTH_SOCK"})


def find_horovodrun() -> str:
    """The ``horovodrun`` of this Python's environment (beside ``sys.executable``), else the one on PATH.

    Raises:
        BackendUnavailableError: no ``horovodrun`` is installed.
    """
    beside = Path(sys.executable).parent / "horovodrun"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("horovodrun")
    if found:
        return found
    raise BackendUnavailableError(f"launch --backend horovod: no `horovodrun` beside {sys.executable} nor on "
                                  f"PATH; {INSTALL_HINT}")


def parse_hosts(hosts: Union[None, str, Sequence[str]], np: int) -> List[Tuple[str, int]]:
    """Parses ``-H`` (``"h1:2,h2:2"`` or ``["h1:2", "h2:2"]``) into ``[(host, slots), ...]``.

    A host without ``:slots`` has one slot. ``None`` means ``localhost:np``.

    Raises:
        ConfigError: a malformed entry, a repeated host, zero slots, or fewer slots than ``np``.
    """
    if hosts is None:
        return [("localhost", np)]
    entries = [h.strip() for h in hosts.split(",")] if isinstance(hosts, str) else [str(h).strip() for h in hosts]
    parsed: List[Tuple[str, int]] = []
    for entry in entries:
        match = _HOST_RE.match(entry)
        if not entry or match is None:
            raise ConfigError(f"hosts: malformed entry {shorten(repr(entry))} in {shorten(repr(hosts))}; valid: "
                              "comma-separated HOST[:SLOTS], e.g. -H localhost:2 or -H node1:4,node2:4")
        slots = int(match.group("slots")) if match.group("slots") is not None else 1
        if slots < 1:
            raise ConfigError(f"hosts: {shorten(repr(entry))} has {slots} slots; every host needs at least 1, "
                              "e.g. -H localhost:2")
        host = match.group("host")
        if host in (h for h, _ in parsed):
            raise ConfigError(f"hosts: host {shorten(repr(host))} is listed twice in {shorten(repr(hosts))}; give it "
                              "once with the total slots, e.g. -H localhost:2")
        parsed.append((host, slots))
    total = sum(slots for _, slots in parsed)
    if total < np:
        raise ConfigError(f"np: {np} ranks do not fit in the {total} slot(s) of hosts {shorten(repr(hosts))}; lower "
                          f"-np or add slots, e.g. -H {parsed[0][0]}:{np}")
    return parsed


def build_horovodrun_command(np: int, hosts: Union[None, str, Sequence[str]], cmd: Union[str, Sequence[str]], *,
                             extra_env: Optional[Mapping[str, str]] = None, horovodrun: Optional[str] = None,
                             start_timeout: Optional[int] = None, gloo_timeout: Optional[int] = None,
                             network_interfaces: Optional[str] = None, verbose: bool = False) -> List[str]:
    """The ``horovodrun`` argv that starts ``np`` Gloo ranks of ``cmd`` on ``hosts``.

    ``extra_env`` is put in the rank command as ``env K=V ... CMD``, so it reaches every rank on every host
    (horovodrun has no ``-x`` like mpirun). A first word ending in ``.py`` is run with this Python.

    Args:
        np: number of ranks (``-np``), at least 1.
        hosts: ``"host:slots,..."`` or a list of ``"host:slots"``; None for ``localhost:np``.
        cmd: the rank command (argv list, or a string split like a shell without running one).
        extra_env: variables set in every rank. Defaults to None.
        horovodrun: path of ``horovodrun``. Defaults to :func:`find_horovodrun`.
        start_timeout: seconds horovodrun waits for all ranks to start (``--start-timeout``). Defaults to
            horovodrun's own (30 s).
        gloo_timeout: seconds a Gloo operation (rendezvous included) may wait for the other ranks
            (``--gloo-timeout-seconds``); raise it on busy machines where ranks start far apart. Defaults to
            horovodrun's own (30 s).
        network_interfaces: comma-separated NICs for Gloo (``--network-interfaces``), e.g. ``"eth0"``.
            Defaults to horovodrun's discovery; ``"lo"`` when every host is ``localhost``.
        verbose: pass ``--verbose``. Defaults to False.

    Returns:
        The argv (never run through a shell).

    Raises:
        ConfigError: bad ``np``, ``hosts``, ``cmd`` or ``extra_env``.
        BackendUnavailableError: ``horovodrun`` is not installed.

    Example:
        >>> build_horovodrun_command(2, None, ["python", "train.py"], horovodrun="horovodrun")
        ['horovodrun', '--gloo', '-np', '2', '-H', 'localhost:2', '--network-interfaces', 'lo', 'python', 'train.py']
    """
    if isinstance(np, bool) or not isinstance(np, int) or np < 1:
        raise ConfigError(f"np: the number of Horovod ranks must be a whole number >= 1; received {np!r}. "
                          "Example: tfaccel launch --backend horovod -np 2 -- python train.py")
    parsed = parse_hosts(hosts, np)
    argv, _notes = normalize_command(cmd)
    env_words = _env_words(extra_env)
    if network_interfaces is None and all(host in ("localhost", "127.0.0.1") for host, _ in parsed):
        network_interfaces = "lo"  # all ranks here: keep Gloo on loopback instead of probing every NIC
    options = _option_words(network_interfaces=network_interfaces, start_timeout=start_timeout,
                            gloo_timeout=gloo_timeout, verbose=verbose)
    out = [horovodrun or find_horovodrun(), "--gloo", "-np", str(np),
           "-H", ",".join(f"{host}:{slots}" for host, slots in parsed)] + options
    return out + (["env", *env_words] if env_words else []) + list(argv)


def _env_words(extra_env: Optional[Mapping[str, str]]) -> List[str]:
    """``["K=V", ...]`` for ``env K=V ... CMD``; every name checked."""
    words = []
    for name, value in (extra_env or {}).items():
        if not _ENV_NAME_RE.match(str(name)):
            raise ConfigError(f"extra_env: {name!r} is not a valid environment variable name; valid: letters, "
                              "digits and '_', not starting with a digit")
        words.append(f"{name}={value}")
    return words


def _option_words(*, network_interfaces: Optional[str], start_timeout: Optional[int], gloo_timeout: Optional[int],
                  verbose: bool) -> List[str]:
    """horovodrun's options after ``-H``; the timeouts checked."""
    for name, value in (("start_timeout", start_timeout), ("gloo_timeout", gloo_timeout)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"{name}: must be a whole number of seconds >= 1; received {value!r}")
    out: List[str] = []
    if network_interfaces:
        out += ["--network-interfaces", network_interfaces]
    if start_timeout is not None:
        out += ["--start-timeout", str(start_timeout)]
    if gloo_timeout is not None:
        out += ["--gloo-timeout-seconds", str(gloo_timeout)]
    if verbose:
        out.append("--verbose")
    return out


def horovod_env(environ: Mapping[str, str], names: Sequence[str] = ()) -> Dict[str, str]:
    """The environment horovodrun (and so every rank) gets: :func:`tfaccel.launch.envpolicy.runtime_env`, Horovod's
    and Gloo's settings, ``SSH_AUTH_SOCK`` and ``names``; never the rest (secrets stay off the command lines).

    Example:
        >>> sorted(horovod_env({"PATH": "/bin", "HOROVOD_LOG_LEVEL": "INFO", "AWS_SECRET_ACCESS_KEY": "s"}))
        ['HOROVOD_LOG_LEVEL', 'PATH', 'PYTHONUNBUFFERED', 'TFACCEL_EXIT_ON_CONFIG_ERROR', 'TFACCEL_OUTPUT_PREFIXED']
    """
    env = runtime_env(environ, names, CHILD_DEFAULT_ENV)
    env.update({k: v for k, v in environ.items() if k.startswith(HOROVOD_PREFIXES) or k in HOROVOD_NAMES})
    return env


def run_horovod(np: int, cmd: Union[str, Sequence[str]], *, hosts: Union[None, str, Sequence[str]] = None,
                extra_env: Optional[Mapping[str, str]] = None, env: Optional[Mapping[str, str]] = None,
                timeout: Optional[float] = None, grace: float = 10.0, echo: bool = True,
                capture_lines: Optional[int] = None, horovodrun: Optional[str] = None,
                start_timeout: Optional[int] = None, gloo_timeout: Optional[int] = None,
                network_interfaces: Optional[str] = None, verbose: bool = False,
                max_restarts: int = 0, network: str = "auto", forward: Sequence[str] = (),
                job_id: Optional[str] = None, count_preemptions: bool = False) -> LaunchResult:
    """Runs ``cmd`` as ``np`` Horovod ranks through ``horovodrun --gloo`` and waits for it.

    The ``horovodrun`` process is supervised like any tfaccel task (output prefixed ``[horovodrun 0]``, bounded by
    ``timeout``, stopped with its process group) and gets only :func:`horovod_env` (see the module docstring).
    TF_CONFIG is not passed on: Horovod ranks are not a tf.distribute cluster, and a stray TF_CONFIG would make
    ``strategy="auto"`` pick multi_worker.

    Args:
        np: number of ranks.
        cmd: the rank command.
        hosts: ``-H``; None for ``localhost:np``.
        extra_env: variables set in every rank (through the rank command). Defaults to None.
        env: variables set in horovodrun's own environment (passed to every rank). Defaults to None.
        timeout: bound on the whole run, restarts included, in seconds; None for no bound. Defaults to None.
        grace, echo, capture_lines: as for :func:`tfaccel.launch.supervisor.run_job`.
        horovodrun, start_timeout, gloo_timeout, network_interfaces, verbose: see
            :func:`build_horovodrun_command`.
        max_restarts, count_preemptions: run the whole job (all ranks) again up to this many times after a failure
            (every rank sees ``TFACCEL_RESTART_COUNT``); count restarts after a preemption too. Defaults to 0, False.
        network: for ranks all on this machine (``hosts`` None or localhost/127.0.0.1 only): ``"private"`` runs
            horovodrun and its ranks in a loopback-only network namespace (see :mod:`tfaccel.launch.netns`),
            ``"host"`` on this machine's network, ``"auto"`` private where possible. With other hosts ``"auto"``
            uses the real network and ``"private"`` is an error. Defaults to "auto".
        forward: names of variables of this environment the ranks get too (``--env NAME``); each must be set.
        job_id: ``TFACCEL_JOB_ID`` of every rank, kept across restarts (:mod:`tfaccel.job_id`). Defaults to the
            environment's (``TFACCEL_JOB_ID``, ``SLURM_JOB_ID``), else a new one.

    Returns:
        A ``LaunchResult`` with one task, ``horovodrun:0`` (returncode 124 on timeout), ``restarts``, ``attempts``.

    Raises:
        ConfigError: bad arguments (see :func:`build_horovodrun_command`), a bad ``max_restarts`` or ``network``.
        NetworkIsolationError: ``network="private"`` where no private network namespace can be made.
        BackendUnavailableError: ``horovodrun`` is not installed.
    """
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ConfigError(f"max_restarts: must be a whole number >= 0; received {max_restarts!r}. Example: "
                          "tfaccel launch --backend horovod -np 2 --max-restarts 1 -- python train.py")
    argv = tuple(build_horovodrun_command(np, hosts, cmd, extra_env=extra_env, horovodrun=horovodrun,
                                          start_timeout=start_timeout, gloo_timeout=gloo_timeout,
                                          network_interfaces=network_interfaces, verbose=verbose))
    network = _network_mode(network, hosts, np)
    base = _horovodrun_env(env, forward, job_id)
    get_logger().info("launch: %d Horovod rank(s) (Gloo) on %s: %s", np, argv[argv.index("-H") + 1],
                      " ".join(argv))

    def make_tasks(attempt: int) -> List[LaunchTask]:
        # horovodrun exports its environment to every rank (local and over ssh), so the count reaches them all.
        return [LaunchTask(task_type="horovodrun", task_index=0, cmd=argv, env={**base, RESTART_ENV: str(attempt)})]

    return run_job(make_tasks, max_restarts=max_restarts, timeout=timeout, grace=grace, echo=echo, network=network,
                   capture_lines=capture_lines, preempted=rank_preempted, count_preemptions=count_preemptions)


def rank_preempted(outcomes: Sequence[TaskOutcome]) -> bool:
    """Whether horovodrun ended because a rank was preempted: it exits 1 and names the first rank that exited
    non-zero with ``Exit code: N``; N is ``tfaccel.EXIT_PREEMPTED`` when that rank stopped at an agreed step."""
    return any(_PREEMPTED_RANK.search(o.stderr) or _PREEMPTED_RANK.search(o.stdout) for o in outcomes)


def _network_mode(network: str, hosts: Union[None, str, Sequence[str]], np: int) -> str:
    """The network mode for these ranks: ranks on other hosts need the real network."""
    check_network_mode(network)
    if network != "host" and any(host not in ("localhost", "127.0.0.1") for host, _ in parse_hosts(hosts, np)):
        if network == "private":
            raise ConfigError(f"network='private': a private network namespace has only loopback, but the ranks "
                              f"run on hosts {shorten(repr(hosts))}; use -H localhost:N or --network host")
        return "host"
    return network


def _horovodrun_env(env: Optional[Mapping[str, str]], forward: Sequence[str], job_id: Optional[str]) -> Dict[str, str]:
    """horovodrun's environment (:func:`horovod_env`) with the job's id, this Python environment's ``bin`` first on
    PATH (horovodrun finds itself and the ranks' python through it)."""
    full = child_base_env(env)
    base = horovod_env(full, tuple(check_env_names(forward)) + tuple(env or {}))
    export_job_id(base, job_id, lambda: new_job_id("horovod"), source=full)
    base["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), base.get("PATH", "")])
    return base
