"""Per-host mode: this host's task of a cluster described in a file.

``tfaccel launch --cluster FILE --task worker:1 -- CMD`` gives the command that task's TF_CONFIG (in the
child's environment, through ``ClusterSpec.export``) and runs it -- or the tfaccel server for a ps task and
for the worker tasks of a parameter-server cluster. Meanwhile it waits up to ``connect_timeout`` seconds
for every other task of the cluster (the evaluator excepted: it does not listen) to accept connections, and
stops with an error naming the tasks that never came up.
"""

import dataclasses
from typing import Any, List, Mapping, Optional, Sequence, Tuple, Union

from tfaccel.errors import ConfigError
from tfaccel.job_id import JOB_ID_ENV, cluster_job_id
from tfaccel.launch.command import child_base_env, export_job_id, normalize_command, warn_inherited_tf_config
from tfaccel.launch.outcome import LaunchResult, LaunchTask
from tfaccel.launch.server import ENDS_WITH_ENV
from tfaccel.launch.supervisor import run_job
from tfaccel.launch.tasks import build_tasks, check_ps_has_chief, load_spec
from tfaccel.log import get_logger

__all__ = ["run_host", "host_plan"]


def host_plan(cmd: Union[str, Sequence[str]], *, cluster: Any, task: str, env: Optional[Mapping[str, str]] = None,
              attempt: int = 0, job_id: Optional[str] = None, servers_end_with_chief: bool = False
              ) -> Tuple[Any, LaunchTask, List[Tuple[str, str]], List[str]]:
    """What per-host mode would start.

    Args:
        cmd: the user's command.
        cluster: a cluster file, dict or ``ClusterSpec``.
        task: this host's task, e.g. ``"worker:1"``.
        env: extra environment for the task. Defaults to None.
        attempt: the restart count. Defaults to 0.
        job_id: the job's id. Defaults to the environment's, else one derived from the cluster: every host of the
            cluster computes the same (:func:`tfaccel.job_id.cluster_job_id`).
        servers_end_with_chief: a server task (ps, or a worker of a parameter-server cluster) ends, exit 0, once the
            chief is gone (:data:`tfaccel.launch.server.ENDS_WITH_ENV`): inside ``srun`` nothing else would end it.
            Defaults to False (the server runs until the launcher is stopped).

    Returns:
        ``(spec, launch_task, peers, notes)``: peers are ``(name, "host:port")`` of the other tasks that must
        accept connections; notes say what was filled in.

    Raises:
        ConfigError: the cluster is invalid, the task is not in it, or the command is empty.
    """
    spec, source = load_spec(cluster)
    role, index = spec.check_task(task, field="--task")
    name = f"{role}:{index}"
    base_env = child_base_env(env)
    export_job_id(base_env, job_id, lambda: cluster_job_id(spec), announce=False)
    argv, notes = normalize_command(cmd, env=base_env)
    check_ps_has_chief(spec, source)
    tasks = build_tasks(spec, lambda _name: argv, env=base_env, attempt=attempt, only=name)
    if not tasks[0].server:  # this host runs the user's script (a ps or PS-worker host runs tfaccel's server)
        normalize_command(cmd, check_exists=True, env=base_env)
    if servers_end_with_chief and tasks[0].server and spec.roles.get("chief"):
        tasks[0] = dataclasses.replace(tasks[0], env={**tasks[0].env, ENDS_WITH_ENV: spec.address(("chief", 0))})
    peers = [(f"{r}:{i}", spec.address((r, i))) for r, i in spec.tasks() if (r, i) != (role, index)
             and r != "evaluator"]
    return spec, tasks[0], peers, notes


def run_host(cmd: Union[str, Sequence[str]], *, cluster: Any, task: str, timeout: Optional[float] = None,
             max_restarts: int = 0, env: Optional[Mapping[str, str]] = None, grace: float = 10.0,
             connect_timeout: float = 300.0, echo: bool = True, capture_lines: Optional[int] = None,
             job_id: Optional[str] = None, count_preemptions: bool = False,
             servers_end_with_chief: bool = False) -> LaunchResult:
    """Runs this host's task of a cluster and waits for the other tasks to come up.

    Args:
        cmd: the user's command (argv list, or a string split without a shell).
        cluster: a cluster file, dict or ``ClusterSpec``.
        task: this host's task, e.g. ``"worker:1"``.
        timeout: bound on the whole run in seconds. Defaults to None (no bound).
        max_restarts: restart the task up to this many times after a failure. Defaults to 0.
        count_preemptions: count restarts after a preemption (exit 75) against max_restarts. Defaults to False.
        env: extra environment for the task. Defaults to None.
        grace: seconds between SIGTERM and SIGKILL. Defaults to 10.
        connect_timeout: seconds the other tasks get to accept connections. Defaults to 300.
        echo: stream the task's output with a ``[worker 1]`` prefix. Defaults to True.
        capture_lines: keep only the last N lines of output; None keeps all. Defaults to None.
        job_id: ``TFACCEL_JOB_ID`` of the task, kept across restarts. Defaults to the environment's
            (``TFACCEL_JOB_ID``, ``SLURM_JOB_ID``), else one derived from the cluster, the same on every host (and
            for every run of that cluster: give one to tell runs apart).
        servers_end_with_chief: see :func:`host_plan`. Defaults to False.

    Returns:
        A ``LaunchResult``; ``reason == "unreachable"`` (exit code 1) when some task never came up.

    Raises:
        ConfigError: the cluster is invalid, the task is not in it, or the command is empty.

    Example:
        >>> run_host(["python", "train.py"], cluster="tf_config/two_workers.yaml", task="worker:1")  # doctest: +SKIP
    """
    _spec, first, peers, notes = host_plan(cmd, cluster=cluster, task=task, env=env, job_id=job_id,
                                           servers_end_with_chief=servers_end_with_chief)
    warn_inherited_tf_config()
    for note in notes:
        get_logger().info("launch: %s", note)
    get_logger().info("launch: job id %s (%s of this task, kept across restarts; every host of the cluster derives the "
                      "same unless --job-id or the environment names one)", first.env[JOB_ID_ENV], JOB_ID_ENV)
    if connect_timeout <= 0:
        raise ConfigError(f"connect_timeout: must be a positive number of seconds; received {connect_timeout!r}")

    def make_tasks(attempt: int) -> List[LaunchTask]:
        return [host_plan(cmd, cluster=cluster, task=task, env=env, attempt=attempt, job_id=job_id,
                          servers_end_with_chief=servers_end_with_chief)[1]]

    return run_job(make_tasks, max_restarts=max_restarts, timeout=timeout, grace=grace,
                   connect_timeout=connect_timeout, peers=peers, echo=echo, capture_lines=capture_lines,
                   count_preemptions=count_preemptions)
