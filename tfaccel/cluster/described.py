"""The cluster this process's environment describes, read but not yet validated: TF_CONFIG and SLURM here, the
Kubernetes and cloud trainers' readers beside it (``tfaccel.cluster.kubernetes``, ``.cloud``), the order among them in
``tfaccel.cluster.sources``.

The readers stop short of a ``ClusterSpec``: ``ClusterSpec.from_env`` and ``tfaccel.cluster.env`` validate what they
return (``TaskInfo.from_env_cluster``), so the dependency runs one way, from the spec to its readers.
"""

from typing import Any, Mapping, NamedTuple, Optional, Tuple

from tfaccel.cluster.errors import ClusterConfigError
from tfaccel.cluster.limits import MAX_BYTES, loads_json, nesting_problem, show
from tfaccel.cluster.slurm import slurm_cluster

__all__ = ["EnvCluster", "Fact", "read_tf_config", "read_slurm"]


class Fact(NamedTuple):
    """One thing a reader learnt from the environment, and where (``tfaccel tf-config --explain`` lists them).

    Attributes:
        what: ``"jobset"``, ``"index"``, ``"hosts"``, ...
        value: what was read.
        origin: the variable (and the label or document it carries), e.g. ``"TFACCEL_JOBSET_NAME (label ...)"``.
    """

    what: str
    value: str
    origin: str


class EnvCluster(NamedTuple):
    """A cluster as the environment describes it.

    Attributes:
        document: what ``ClusterSpec.from_dict`` reads: a whole TF_CONFIG document, or SLURM's roles.
        task: SLURM's ``(type, index)``; None for a TF_CONFIG, whose document names its task.
        source: what error messages name first (``"TF_CONFIG"``, ``"SLURM"``, ...).
        origin: the kind of source (``TaskInfo.source``): ``"TF_CONFIG"``, ``"SLURM"``, ``"Indexed Job"``,
            ``"JobSet"``, ``"TrainJob"``, ``"Vertex AI"``, ``"SageMaker"``.
        facts: what was read, and from where.
    """

    document: Any
    task: Optional[Tuple[str, int]]
    source: str
    origin: str
    facts: Tuple[Fact, ...] = ()


def read_tf_config(raw: str, *, source: str = "TF_CONFIG") -> Optional[EnvCluster]:
    """Reads a TF_CONFIG string: bounded JSON, an object with a ``"cluster"``; None for ``""`` or ``{}``.

    Args:
        raw: the TF_CONFIG value.
        source: what error messages name first. Defaults to ``"TF_CONFIG"``.

    Returns:
        The document, or None for an empty TF_CONFIG (no cluster, as for TensorFlow).

    Raises:
        ClusterConfigError: the JSON is malformed or too large, or it is not an object with a ``"cluster"``.

    Example:
        >>> read_tf_config("{}") is None
        True
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
    return EnvCluster(doc, None, source, "TF_CONFIG")


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


def read_slurm(environ: Optional[Mapping[str, str]] = None, *, port: Optional[int] = None,
               ps: Optional[int] = None) -> Optional[EnvCluster]:
    """SLURM's cluster and this task's place in it (``tfaccel.cluster.slurm.slurm_cluster``); None outside srun.

    Args:
        environ: the environment to read. Defaults to ``os.environ``.
        port: first port on each node. Defaults to ``$TFACCEL_SLURM_PORT``, else 8888.
        ps: number of parameter servers. Defaults to ``$TFACCEL_SLURM_PS``, else 0.

    Returns:
        The roles and this task, or None when this process is not a task of a SLURM job step.

    Raises:
        ClusterConfigError: a SLURM variable is malformed or inconsistent, or the port / ps count is invalid.
    """
    found = slurm_cluster(environ, port=port, ps=ps)
    return None if found is None else EnvCluster(found[0], found[1], "SLURM", "SLURM")
