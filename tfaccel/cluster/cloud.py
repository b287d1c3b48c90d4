"""The cluster of a managed cloud trainer: Vertex AI custom training and Amazon SageMaker, from their documented
environments.

* Vertex AI sets ``CLUSTER_SPEC`` on every replica (and ``TF_CONFIG`` in TensorFlow containers): worker pools
  ``workerpool0`` (the primary replica: chief), ``workerpool1`` (workers), ``workerpool2`` (parameter servers),
  ``workerpool3`` (evaluators), a ``task`` with ``type``/``index`` (and ``trial`` in tuning jobs), ``environment``
  ``"cloud"`` and the job's spec under ``job``. Documented at
  https://cloud.google.com/vertex-ai/docs/training/distributed-training ("CLUSTER_SPEC", "TF_CONFIG").
* SageMaker sets ``SM_HOSTS`` (JSON list, e.g. ``["algo-1","algo-2"]``), ``SM_CURRENT_HOST``, ``SM_NUM_GPUS`` and
  ``SM_NUM_CPUS`` (https://github.com/aws/sagemaker-training-toolkit/blob/master/ENVIRONMENT_VARIABLES.md). With
  ``distribution={"multi_worker_mirrored_strategy": {"enabled": True}}`` its TensorFlow container also sets
  TF_CONFIG: every host a worker on port 8890, in ``SM_HOSTS`` order (``_build_tf_config_for_mwms`` in
  aws/sagemaker-tensorflow-training-toolkit ``src/sagemaker_tensorflow_container/training.py``). Without it, tfaccel
  builds that same cluster from ``SM_HOSTS``, so every host trains one model together instead of one each.
"""

import json
import os
from typing import Any, Dict, List, Mapping, Optional

from tfaccel.cluster.described import EnvCluster, Fact
from tfaccel.cluster.errors import ClusterConfigError
from tfaccel.cluster.limits import MAX_BYTES, show

__all__ = ["VERTEX_POOLS", "SAGEMAKER_PORT", "read_vertex", "read_sagemaker", "without_vertex_keys"]

# Vertex AI's worker pools, in workerPoolSpecs[] order, and the TF_CONFIG role each one is.
VERTEX_POOLS: Dict[str, str] = {"workerpool0": "chief", "workerpool1": "worker", "workerpool2": "ps",
                                "workerpool3": "evaluator"}
SAGEMAKER_PORT = 8890  # the port SageMaker's TensorFlow container gives every MWMS worker
_VERTEX_DOC = "https://cloud.google.com/vertex-ai/docs/training/distributed-training"


def _json(env: Mapping[str, str], name: str, source: str) -> Any:
    raw = env[name]
    if len(raw) > MAX_BYTES:
        raise ClusterConfigError(f"{source}: {name} is {len(raw):,} characters, more than {MAX_BYTES:,}")
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise ClusterConfigError(f"{source}: {name} is not valid JSON ({exc}); received {show(raw)}") from None


def read_vertex(environ: Optional[Mapping[str, str]] = None) -> Optional[EnvCluster]:
    """Vertex AI's ``CLUSTER_SPEC``, its worker pools as roles; None when it is not set.

    Raises:
        ClusterConfigError: the JSON is malformed, names a pool Vertex AI does not have, or no task.

    Example:
        >>> spec = '{"cluster": {"workerpool0": ["wp0-0:2222"], "workerpool1": ["wp1-0:2222"]}, ' \\
        ...        '"task": {"type": "workerpool1", "index": 0}}'
        >>> read_vertex({"CLUSTER_SPEC": spec}).task
        ('worker', 0)
    """
    env = os.environ if environ is None else environ
    if not env.get("CLUSTER_SPEC", "").strip():
        return None
    source = "Vertex AI"
    doc = _json(env, "CLUSTER_SPEC", source)
    cluster = doc.get("cluster") if isinstance(doc, dict) else None
    task = doc.get("task") if isinstance(doc, dict) else None
    if not isinstance(cluster, dict) or not isinstance(task, dict):
        raise ClusterConfigError(f"{source}: CLUSTER_SPEC must be an object with \"cluster\" and \"task\" ({_VERTEX_DOC})"
                                 f"; received {show(doc)}")
    roles: Dict[str, List[str]] = {}
    for pool, addresses in cluster.items():
        if pool not in VERTEX_POOLS:
            raise ClusterConfigError(f"{source}: CLUSTER_SPEC cluster {show(pool)}: not a Vertex AI worker pool; valid: "
                                     f"{', '.join(VERTEX_POOLS)} ({_VERTEX_DOC})")
        if addresses:
            roles[VERTEX_POOLS[pool]] = addresses
    pool = task.get("type")
    if pool not in VERTEX_POOLS:
        raise ClusterConfigError(f"{source}: CLUSTER_SPEC task.type {show(pool)}: valid: {', '.join(VERTEX_POOLS)}")
    index = task.get("index", 0)
    facts = [Fact("task", f"{pool}:{index} -> {VERTEX_POOLS[pool]}:{index}", "CLUSTER_SPEC task (workerpool0 chief, "
                  "workerpool1 worker, workerpool2 ps, workerpool3 evaluator)"),
             Fact("pools", ", ".join(f"{p} x{len(a)}" for p, a in cluster.items() if a), "CLUSTER_SPEC cluster")]
    if task.get("trial") is not None:
        facts.append(Fact("trial", str(task["trial"]), "CLUSTER_SPEC task.trial (hyperparameter tuning)"))
    if isinstance(doc.get("environment"), str):
        facts.append(Fact("environment", doc["environment"], "CLUSTER_SPEC environment"))
    document = {"cluster": {r: roles[r] for r in ("chief", "worker", "ps", "evaluator") if r in roles},
                "task": {"type": VERTEX_POOLS[pool], "index": index}}
    return EnvCluster(document, None, source, source, tuple(facts))


def without_vertex_keys(raw: str) -> str:
    """Vertex AI's TF_CONFIG less what only Vertex AI puts there (``job``, ``task.trial``), for the TF_CONFIG reader.

    A TF_CONFIG that is not a JSON object comes back unchanged (the TF_CONFIG reader says what is wrong with it).
    """
    try:
        doc = json.loads(raw) if len(raw) <= MAX_BYTES else None
    except ValueError:
        return raw
    if not isinstance(doc, dict):
        return raw
    doc.pop("job", None)
    if isinstance(doc.get("task"), dict):
        doc["task"].pop("trial", None)
    return json.dumps(doc)


def read_sagemaker(environ: Optional[Mapping[str, str]] = None) -> Optional[EnvCluster]:
    """SageMaker's hosts as MWMS workers (port 8890, ``SM_HOSTS`` order); None when ``SM_HOSTS`` is not set.

    Raises:
        ClusterConfigError: ``SM_HOSTS`` is not a JSON list of names, or ``SM_CURRENT_HOST`` is not among them.

    Example:
        >>> read_sagemaker({"SM_HOSTS": '["algo-1","algo-2"]', "SM_CURRENT_HOST": "algo-2"}).task
        ('worker', 1)
    """
    env = os.environ if environ is None else environ
    if not env.get("SM_HOSTS", "").strip():
        return None
    source = "SageMaker"
    hosts = _json(env, "SM_HOSTS", source)
    if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) and h for h in hosts):
        raise ClusterConfigError(f"{source}: SM_HOSTS must be a JSON list of host names, e.g. [\"algo-1\",\"algo-2\"]"
                                 f"; received {show(hosts)}")
    current = env.get("SM_CURRENT_HOST", "")
    if current not in hosts:
        raise ClusterConfigError(f"{source}: SM_CURRENT_HOST {show(current)} is not in SM_HOSTS {show(hosts)}")
    facts = [Fact("hosts", ",".join(hosts), "SM_HOSTS"), Fact("current host", current, "SM_CURRENT_HOST"),
             Fact("port", str(SAGEMAKER_PORT), "the port of SageMaker's own MWMS TF_CONFIG")]
    facts += [Fact(name.lower()[3:].replace("_", " "), env[name], name) for name in ("SM_NUM_GPUS", "SM_NUM_CPUS")
              if env.get(name)]
    document = {"worker": [f"{host}:{SAGEMAKER_PORT}" for host in hosts]}
    return EnvCluster(document, ("worker", hosts.index(current)), source, source, tuple(facts))
