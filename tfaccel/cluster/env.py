"""Where am I? This process's task from TF_CONFIG, a Kubernetes Job / JobSet / TrainJob, a cloud trainer or SLURM."""

from typing import Mapping, Optional

from tfaccel.cluster.described import read_slurm, read_tf_config
from tfaccel.cluster.sources import read_env
from tfaccel.cluster.task import TaskInfo

__all__ = ["task_from_env", "task_from_tf_config", "slurm_task"]


def task_from_tf_config(raw: str, *, source: str = "TF_CONFIG") -> Optional[TaskInfo]:
    """Parses and validates a TF_CONFIG string.

    Kubeflow TFJob's form (``"environment": "cloud"``, an ``evaluator`` role) is read like any other.
    An empty string or ``{}`` means "no cluster", as it does for TensorFlow.

    Args:
        raw: the TF_CONFIG value.
        source: what error messages name first. Defaults to ``"TF_CONFIG"``.

    Returns:
        The task, or None for an empty TF_CONFIG.

    Raises:
        ClusterConfigError: the JSON is malformed, a key is unknown, the cluster is invalid, the task is
            missing or not in the cluster.

    Example:
        >>> info = task_from_tf_config('{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}}')
        >>> info.name, info.is_chief
        ('worker:1', False)
    """
    found = read_tf_config(raw, source=source)
    return None if found is None else TaskInfo.from_env_cluster(found)


def slurm_task(environ: Optional[Mapping[str, str]] = None, *, port: Optional[int] = None,
               ps: Optional[int] = None) -> Optional[TaskInfo]:
    """This SLURM task's place in a cluster built from SLURM's variables; None outside ``srun``.

    Args:
        environ: the environment to read. Defaults to ``os.environ``.
        port: first port on every node; task ``k`` of a node uses ``port + k``. Defaults to
            ``$TFACCEL_SLURM_PORT``, else 8888.
        ps: number of parameter servers (rank 0 becomes the chief, ranks 1..ps the ps). Defaults to
            ``$TFACCEL_SLURM_PS``, else 0 (all workers).

    Returns:
        A ``TaskInfo`` with ``source="SLURM"``, or None when ``SLURM_PROCID`` or a node list is missing, or
        when this process is not a task of a job step (the batch script itself: no ``SLURM_STEP_NODELIST``
        or ``SLURM_STEP_ID``; a warning says so once).

    Raises:
        ClusterConfigError: a SLURM variable is malformed or inconsistent, or the port / ps count is invalid.

    Example:
        >>> env = {"SLURM_PROCID": "1", "SLURM_STEP_NODELIST": "node[1-2]", "SLURM_STEP_TASKS_PER_NODE": "1(x2)"}
        >>> slurm_task(env, port=2222).spec.roles
        {'worker': ('node1:2222', 'node2:2222')}
    """
    found = read_slurm(environ, port=port, ps=ps)
    return None if found is None else TaskInfo.from_env_cluster(found)


def task_from_env(environ: Optional[Mapping[str, str]] = None, *, port: Optional[int] = None,
                  ps: Optional[int] = None) -> Optional[TaskInfo]:
    """This process's task from the first source present (``tfaccel.cluster.sources``): TF_CONFIG, a JobSet or
    TrainJob, an Indexed Job, Vertex AI, SageMaker, SLURM (inside ``srun``); else None.

    Args:
        environ: the environment to read (never written). Defaults to ``os.environ``.
        port: SLURM only: first port on each node. Defaults to ``$TFACCEL_SLURM_PORT``, else 8888.
        ps: SLURM only: number of parameter servers. Defaults to ``$TFACCEL_SLURM_PS``, else 0.

    Returns:
        A ``TaskInfo`` (``source`` names where it came from, ``facts`` what was read), or None for a single process.

    Raises:
        ClusterConfigError: a source is set but invalid, two sources disagree, or a Kubernetes host never resolved.

    Example:
        >>> task_from_env({}) is None
        True
    """
    found = read_env(environ, port=port, ps=ps)
    return None if found is None else TaskInfo.from_env_cluster(found)
