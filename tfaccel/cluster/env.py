"""Where am I? This process's task from TF_CONFIG (plain or Kubeflow TFJob), else from SLURM."""

import os
from typing import Any, Mapping, Optional

from tfaccel.cluster.limits import MAX_BYTES, loads_json, nesting_problem, show
from tfaccel.cluster.spec import ClusterConfigError, ClusterSpec, TaskInfo

__all__ = ["task_from_env", "task_from_tf_config"]


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
    if not raw.strip():
        return None
    doc = _parse(raw, source)
    if doc == {}:
        return None
    if not isinstance(doc, dict):
        raise ClusterConfigError(f"{source}: must be a JSON object with \"cluster\" and \"task\", received "
                                 f"{show(raw)}")
    if "cluster" not in doc:
        raise ClusterConfigError(f"{source}: \"cluster\" is missing; received keys {show(sorted(map(str, doc)))}; "
                                 "expected {\"cluster\": {\"worker\": [...]}, \"task\": {\"type\": \"worker\", "
                                 "\"index\": 0}}")
    spec = ClusterSpec.from_dict(doc, source=source)
    if spec.task is None:
        raise ClusterConfigError(f"{source}: \"task\" is missing; add e.g. \"task\": {{\"type\": "
                                 f"\"{spec.tasks()[0][0]}\", \"index\": 0}} (valid tasks: "
                                 f"{', '.join(f'{r}:{i}' for r, i in spec.tasks()[:8])})")
    return TaskInfo(spec, spec.task[0], spec.task[1], environment=spec.environment, source="TF_CONFIG")


def _parse(raw: str, source: str) -> Any:
    """The JSON of a TF_CONFIG, bounded: at most ``MAX_BYTES``, no key twice, nesting and values within limits."""
    hint = "set it with `tfaccel tf-config FILE --task worker:0 --format env`"
    if len(raw) > MAX_BYTES:
        raise ClusterConfigError(f"{source}: {len(raw):,} characters, more than the {MAX_BYTES:,} a TF_CONFIG may "
                                 f"have; received {show(raw)}; {hint}")

    def duplicate(key: str) -> None:
        raise ClusterConfigError(f"{source}: key {show(key)} given twice in one object (TensorFlow would keep the "
                                 "last silently); keep one")

    try:
        doc: Any = loads_json(raw, duplicate)
    except ClusterConfigError:
        raise
    except RecursionError:
        raise ClusterConfigError(f"{source}: nested too deeply to read; received {show(raw)}; {hint}") from None
    except ValueError as exc:
        raise ClusterConfigError(f"{source}: not valid JSON ({exc}); received {show(raw)}; {hint}") from None
    problem = nesting_problem(doc)
    if problem is not None:
        raise ClusterConfigError(f"{source}: {problem}; received {show(raw)}; {hint}")
    return doc


def task_from_env(environ: Optional[Mapping[str, str]] = None, *, port: Optional[int] = None,
                  ps: Optional[int] = None) -> Optional[TaskInfo]:
    """This process's task: from TF_CONFIG when it is set, else from SLURM (inside ``srun``), else None.

    Args:
        environ: the environment to read (never written). Defaults to ``os.environ``.
        port: SLURM only: first port on each node. Defaults to ``$TFACCEL_SLURM_PORT``, else 8888.
        ps: SLURM only: number of parameter servers. Defaults to ``$TFACCEL_SLURM_PS``, else 0.

    Returns:
        A ``TaskInfo`` (``source`` ``"TF_CONFIG"`` or ``"SLURM"``), or None for a single process.

    Raises:
        ClusterConfigError: TF_CONFIG or the SLURM variables are set but invalid.

    Example:
        >>> task_from_env({}) is None
        True
    """
    from tfaccel.cluster.slurm import slurm_task

    env = os.environ if environ is None else environ
    raw = env.get("TF_CONFIG")
    if raw is not None and raw.strip():
        return task_from_tf_config(raw)
    return slurm_task(env, port=port, ps=ps)
