"""Which source describes this process's cluster, in one explicit order, and what a conflict between two is.

1. ``TF_CONFIG``, when set and not blank, wins: the user's own, a Kubeflow TFJob's (legacy), SageMaker's (MWMS or
   parameter servers) or Vertex AI's. A Kubernetes or cloud source present beside it must describe the same cluster
   (Kubernetes, Vertex AI: the same roles and sizes, the same task; SageMaker: only hosts of ``SM_HOSTS``), else it
   is an error naming both, never a silent pick. SLURM beside a TF_CONFIG is not compared: ``tfaccel launch`` inside
   an allocation sets TF_CONFIG for the processes it starts.
2. Otherwise the one platform source present: a JobSet (or a Trainer v2 TrainJob), an Indexed Job, Vertex AI's
   ``CLUSTER_SPEC``, SageMaker's ``SM_HOSTS``, SLURM (inside ``srun``). Two of them at once is an error.
3. None of them: a single process.

A Kubernetes cluster's host names are waited for in DNS (``tfaccel.cluster.kubernetes.wait_resolvable``) before the
cluster is handed out.
"""

import os
from typing import Callable, List, Mapping, Optional, Tuple

from tfaccel.cluster.cloud import read_sagemaker, read_vertex, without_vertex_keys
from tfaccel.cluster.described import EnvCluster, Fact, read_slurm, read_tf_config
from tfaccel.cluster.errors import ClusterConfigError
from tfaccel.cluster.kubernetes import read_indexed_job, read_jobset, wait_resolvable

__all__ = ["read_env", "SOURCES", "KUBERNETES_SOURCES"]

# Every source tfaccel reads, in precedence order (the docs and `tfaccel tf-config --explain` list them so).
SOURCES: Tuple[str, ...] = ("TF_CONFIG", "JobSet", "TrainJob", "Indexed Job", "Vertex AI", "SageMaker", "SLURM")
KUBERNETES_SOURCES: Tuple[str, ...] = ("JobSet", "TrainJob", "Indexed Job")
_PLATFORMS: Tuple[Callable[[Mapping[str, str]], Optional[EnvCluster]], ...] = (
    read_jobset, read_indexed_job, read_vertex, read_sagemaker)


def read_env(environ: Optional[Mapping[str, str]] = None, *, port: Optional[int] = None,
             ps: Optional[int] = None, resolve: bool = True) -> Optional[EnvCluster]:
    """The environment's cluster, from the first source of :data:`SOURCES` present (see the module doc).

    Args:
        environ: the environment to read (never written). Defaults to ``os.environ``.
        port: SLURM only: first port on each node. Defaults to ``$TFACCEL_SLURM_PORT``, else 8888.
        ps: SLURM only: number of parameter servers. Defaults to ``$TFACCEL_SLURM_PS``, else 0.
        resolve: wait until a Kubernetes cluster's host names resolve. Defaults to True.

    Returns:
        The cluster as read (its ``origin`` names the source, its ``facts`` what was read where), or None for a
        single process.

    Raises:
        ClusterConfigError: a source is set but invalid, two sources disagree, or a host never resolved.
    """
    env = os.environ if environ is None else environ
    platforms: List[EnvCluster] = [found for found in (reader(env) for reader in _PLATFORMS) if found is not None]
    raw = env.get("TF_CONFIG")
    if raw is not None and raw.strip():
        vertex = any(found.origin == "Vertex AI" for found in platforms)
        found = read_tf_config(without_vertex_keys(raw) if vertex else raw)
        if found is None:
            return None
        facts = _tf_config_facts(found)
        for platform in platforms:
            _check_agrees(found, platform)
            facts += (Fact("agrees with", platform.origin, ", ".join(f.origin.split(" ")[0] for f in platform.facts)),)
        return found._replace(facts=facts)
    slurm = read_slurm(env, port=port, ps=ps)
    if slurm is not None:
        platforms.append(slurm._replace(facts=_slurm_facts(env)))
    if len(platforms) > 1:
        raise ClusterConfigError(f"{' and '.join(p.origin for p in platforms)} both describe this process's cluster "
                                 f"({'; '.join(_shape(p) for p in platforms)}); tfaccel does not pick one: unset the "
                                 "variables of the one that is not in charge, or set TF_CONFIG")
    if not platforms:
        return None
    found = platforms[0]
    if resolve and found.origin in KUBERNETES_SOURCES:
        addresses = wait_resolvable(found, environ=env)
        found = found._replace(facts=found.facts + (Fact("resolved", ", ".join(f"{h}={a}" for h, a in
                                                                                  addresses.items()), "DNS"),))
    return found


def _tf_config_facts(found: EnvCluster) -> Tuple[Fact, ...]:
    """What a TF_CONFIG says (read before it is validated: whatever is not of the expected type is left out)."""
    doc = found.document
    task, cluster = doc.get("task"), doc.get("cluster")
    facts = []
    if isinstance(task, dict):
        facts.append(Fact("task", f"{task.get('type')}:{task.get('index', 0)}", "TF_CONFIG task"))
    if isinstance(cluster, dict):
        facts.append(Fact("roles", ", ".join(f"{r} x{len(a)}" for r, a in cluster.items() if isinstance(a, list)),
                          "TF_CONFIG cluster"))
    if isinstance(doc.get("environment"), str):
        facts.append(Fact("environment", doc["environment"], "TF_CONFIG environment (\"cloud\": Kubeflow TFJob, "
                          "SageMaker, Vertex AI)"))
    return tuple(facts)


def _slurm_facts(env: Mapping[str, str]) -> Tuple[Fact, ...]:
    names = ("SLURM_PROCID", "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_STEP_TASKS_PER_NODE",
             "SLURM_TASKS_PER_NODE", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_STEP_ID", "TFACCEL_SLURM_PORT",
             "TFACCEL_SLURM_PS")
    return tuple(Fact(name[6:].lower() if name.startswith("SLURM_") else name.lower(), env[name], name)
                 for name in names if env.get(name))


def _shape(found: EnvCluster) -> str:
    """``"JobSet: worker x2; this task worker:1"``."""
    return f"{found.origin}: {', '.join(f'{r} x{n}' for r, n in _sizes(found).items())}; this task " \
           f"{':'.join(map(str, _task(found)))}"


def _sizes(found: EnvCluster) -> dict:
    roles = found.document["cluster"] if "cluster" in found.document else found.document
    return {role: len(addrs) for role, addrs in roles.items() if isinstance(addrs, list) and addrs}


def _task(found: EnvCluster) -> tuple:
    if found.task is not None:
        return tuple(found.task)
    task = found.document.get("task") or {}
    return task.get("type"), task.get("index", 0)


def _check_agrees(tf_config: EnvCluster, platform: EnvCluster) -> None:
    """Raises when the platform present beside a TF_CONFIG describes another cluster or another task."""
    cluster = tf_config.document["cluster"]
    if platform.origin == "SageMaker":
        hosts = {a.rsplit(":", 1)[0] for a in platform.document["worker"]}
        outside = sorted({str(a).rsplit(":", 1)[0] for addrs in cluster.values() if isinstance(addrs, list)
                          for a in addrs} - hosts)
        if not outside:
            return
        problem = f"TF_CONFIG names hosts {outside} that are not in SM_HOSTS {sorted(hosts)}"
    else:
        if _sizes(tf_config) == _sizes(platform) and _task(tf_config) == _task(platform):
            return
        problem = f"they differ ({_shape(tf_config)} against {_shape(platform)})"
    raise ClusterConfigError(f"TF_CONFIG and {platform.origin} both describe this process's cluster and {problem}; "
                             f"tfaccel does not pick one: unset TF_CONFIG to use {platform.origin}'s, or fix it")
