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
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from tfaccel.errors import ConfigError
from tfaccel.job_id import new_job_id
from tfaccel.launch.command import child_base_env, export_job_id, normalize_command, warn_inherited_tf_config
from tfaccel.launch.netns import check_network_mode
from tfaccel.launch.outcome import LaunchResult, TaskOutcome
from tfaccel.launch.restarts import RestartBudget
from tfaccel.launch.supervisor import run_job
from tfaccel.launch.tasks import build_tasks, check_count, local_specs, network_for
from tfaccel.log import get_logger

__all__ = ["run_local", "Command"]

Command = Union[str, Sequence[str], Callable[..., Any]]
_CommandFor = Callable[[int], Callable[[str], Tuple[str, ...]]]  # attempt -> task name -> argv


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


def run_local(cmd_or_callable: Command, *, workers: int = 2, ps: int = 0, chief: bool = False,
              evaluator: bool = False, timeout: Optional[float] = None, max_restarts: int = 0,
              env: Optional[Mapping[str, str]] = None, cluster: Any = None, args: Sequence[Any] = (),
              kwargs: Optional[Mapping[str, Any]] = None, grace: float = 10.0, connect_timeout: float = 60.0,
              echo: bool = True, capture_lines: Optional[int] = None, network: str = "auto",
              job_id: Optional[str] = None, count_preemptions: bool = False,
              record: Optional[RestartBudget] = None) -> LaunchResult:
    """Runs a command (or a Python callable) in every task of a cluster on this machine.

    TensorFlow's servers bind 0.0.0.0, so by default the tasks run in a private network namespace with only loopback
    (:mod:`tfaccel.launch.netns`): nothing of the cluster is reachable from outside, nor are other machines from it.

    Args:
        cmd_or_callable: an argv list, a command string (split, never run by a shell), or a picklable callable
            (called with ``args``/``kwargs`` in each task; its return value lands in ``TaskOutcome.value``).
        workers: number of worker tasks. Defaults to 2.
        ps: number of parameter-server tasks; with ps the command runs on the chief only (one is added when
            ``chief`` is False) and ps and worker tasks run servers. Defaults to 0.
        chief, evaluator: add a chief task, an evaluator task (it runs the command too). Defaults to False.
        timeout: bound on the whole run in seconds, restarts included. Defaults to None (no bound).
        max_restarts, count_preemptions: restart the whole job (fresh ports) up to this many times after a failure;
            count restarts after a preemption (exit 75, otherwise not counted) too. Defaults to 0, False.
        env: extra environment for every task. Defaults to None.
        cluster: a cluster file, dict or ``ClusterSpec`` whose addresses are all on this machine, instead of
            ``workers``/``ps``/``chief``/``evaluator``. Defaults to None.
        args, kwargs: positional and keyword arguments for a callable. Defaults to none.
        grace, connect_timeout, echo, capture_lines, record: as for :func:`tfaccel.launch.supervisor.run_job` (10
            s between SIGTERM and SIGKILL, 60 s for the servers to accept connections, output streamed with a
            ``[worker 1]`` prefix, all of it kept; ``run_elastic``'s restart record: one attempt, never restarted).
        network: ``"private"`` (a loopback-only network namespace; an error where the system cannot make
            one), ``"host"`` (this machine's network: the ports are reachable from other machines) or
            ``"auto"`` (private where possible, else host with a warning). Defaults to "auto".
        job_id: ``TFACCEL_JOB_ID`` of every task, kept across restarts (:mod:`tfaccel.job_id`). Defaults to the
            environment's (``TFACCEL_JOB_ID``, ``SLURM_JOB_ID``), else a new one.

    Returns:
        A ``LaunchResult`` (``returncode``, every task's ``TaskOutcome``, ``restarts``, ``reason``, ...).

    Raises:
        ConfigError: bad counts, a conflict between ``cluster`` and the counts, an empty command, a cluster with
            addresses on another machine, a bad ``network``, ``network="private"`` with a non-loopback cluster.
        NetworkIsolationError: ``network="private"`` where no private network namespace can be made.

    Example:
        >>> result = run_local(["python", "-c", "import os; print(os.environ['TF_CONFIG'])"])  # doctest: +SKIP
        >>> result.returncode, [t.name for t in result.tasks]  # doctest: +SKIP
        (0, ['worker:0', 'worker:1'])
    """
    make_spec, network, base_env = _plan(workers=workers, ps=ps, chief=chief, evaluator=evaluator, cluster=cluster,
                                         max_restarts=max_restarts, timeout=timeout, network=network, env=env,
                                         job_id=job_id)
    payload, command_for = _commands(cmd_or_callable, args, kwargs, base_env)
    try:
        return run_job(lambda n: build_tasks(make_spec(n), command_for(n), env=base_env, attempt=n),
                       max_restarts=max_restarts, timeout=timeout, grace=grace, connect_timeout=connect_timeout,
                       echo=echo, capture_lines=capture_lines, count_preemptions=count_preemptions,
                       on_attempt_end=payload.collect if payload is not None else None, network=network, record=record)
    finally:
        if payload is not None:
            payload.tmp.cleanup()


def _plan(*, workers: int, ps: int, chief: bool, evaluator: bool, cluster: Any, max_restarts: int,
          timeout: Optional[float], network: str, env: Optional[Mapping[str, str]],
          job_id: Optional[str]) -> Tuple[Callable[[int], Any], str, Dict[str, str]]:
    """Checks a local launch's options: ``(make_spec, network mode, the tasks' base environment)`` (see
    :func:`tfaccel.launch.tasks.local_specs`); the environment carries the launch's job id."""
    log = get_logger()
    check_count("max_restarts", max_restarts, minimum=0)
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
    network = network_for(make_spec(0), network, "cluster" if cluster is not None else "local cluster")
    warn_inherited_tf_config()
    base_env = child_base_env(env)
    export_job_id(base_env, job_id, lambda: new_job_id("local"))
    return make_spec, network, base_env


def _commands(cmd_or_callable: Command, args: Sequence[Any], kwargs: Optional[Mapping[str, Any]],
              base_env: Dict[str, str]) -> Tuple[Optional[_CallablePayload], _CommandFor]:
    """What each task runs: ``(payload, command_for)``, ``command_for(attempt)(task name)`` the task's argv; a
    callable travels in ``payload`` (its module made importable through ``base_env``'s PYTHONPATH)."""
    if callable(cmd_or_callable):
        payload = _CallablePayload(cmd_or_callable, args, kwargs or {})
        base_env.update(_pythonpath_env(base_env))
        return payload, lambda attempt: lambda name: payload.command(attempt, name)
    if args or kwargs:
        raise ConfigError("args/kwargs: only for a callable; received a command "
                          f"{cmd_or_callable!r}; put its arguments in the command")
    argv, notes = normalize_command(cmd_or_callable, check_exists=True, env=base_env)
    for note in notes:
        get_logger().info("launch: %s", note)
    return None, lambda attempt: lambda name: argv
