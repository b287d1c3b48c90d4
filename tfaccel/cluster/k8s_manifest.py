"""Kubernetes manifests that run a tfaccel script without a TF_CONFIG: an Indexed Job + headless Service, a JobSet,
or a Kubeflow Trainer v2 TrainJob on a plainML TrainingRuntime (``tfaccel k8s manifest``).

Every pod gets what ``tfaccel.cluster.kubernetes`` reads: the job's shape and port as literal variables, the
Job/JobSet labels through the downward API. And what a preemption needs: a ``podFailurePolicy`` that ignores exit 75
(preempted after its backup: the Job controller replaces the pod without counting a failure) and fails the job at
once on exit 2 (a configuration error: retrying cannot help), a ``terminationGracePeriodSeconds`` above tfaccel's
preemption timeout (so the backup is written before SIGKILL), and the backup volume mounted in every pod.
JobSet and Trainer v2 make the headless Service themselves (``network.enableDNSHostnames``); an Indexed Job gets one.

Field names: Kubernetes batch/v1 and core/v1; JobSet ``jobset.x-k8s.io/v1alpha2``
(kubernetes-sigs/jobset ``api/jobset/v1alpha2/jobset_types.go``); Trainer ``trainer.kubeflow.org/v1alpha1``
(kubeflow/trainer ``pkg/apis/trainer/v1alpha1``). tests/cluster/data/k8s_schemas.json pins the ones used.
"""

import math
from typing import Any, Dict, List, Optional, Sequence

import yaml

from tfaccel.cluster.errors import ClusterConfigError
from tfaccel.cluster.kubernetes import (DEFAULT_PORT, JOB_NAME_ENV, JOB_NAME_LABEL, JOBSET_LABELS, KINDS, PORT_ENV,
                                        SUBDOMAIN_ENV, TASKS_ENV, TRAINER_STEP_ENV, TRAINER_STEP_LABEL)
from tfaccel.cluster.limits import shorten
from tfaccel.errors import EXIT_CONFIG, EXIT_PREEMPTED, LAUNCHED_ENV
from tfaccel.job_id import JOB_ID_ENV
from tfaccel.resilience.contract import DEFAULT_TIMEOUT_S, TIMEOUT_ENV

__all__ = ["k8s_manifest", "k8s_manifest_yaml", "BACKUP_MOUNT", "GRACE_PERIOD_S", "RUNTIME_NAME"]

BACKUP_MOUNT = "/backup"  # where every pod sees the backup volume: give fit backup_dir="/backup"
# SIGTERM -> agreed step -> backup -> exit 75 must end before the kubelet's SIGKILL
GRACE_PERIOD_S = int(math.ceil(DEFAULT_TIMEOUT_S)) + 15
RUNTIME_NAME = "tfaccel-tensorflow"  # the plainML TrainingRuntime the TrainJob refers to
CONTAINER = "tensorflow"
TRAINER_CONTAINER = "node"  # Trainer v2 finds the trainer's container by this name (pkg/constants)
SERVER_COMMAND = ("python", "-m", "tfaccel.launch.server")


def _check(kind: str, name: str, image: str, workers: int, ps: int, port: int) -> None:
    if kind not in KINDS:
        raise ClusterConfigError(f"--kind {shorten(repr(kind))}: valid kinds are {', '.join(KINDS)}")
    if not isinstance(name, str) or not 1 <= len(name) <= 40 or not name.replace("-", "").isalnum() \
            or not name[0].isalpha() or name[-1] == "-" or name != name.lower():
        raise ClusterConfigError(f"--name {shorten(repr(name))}: must be a DNS label of lowercase letters, digits "
                                 "and '-', starting with a letter, at most 40 characters (pod host names add to it), "
                                 "e.g. 'mnist'")
    if not image or any(ch.isspace() for ch in image):
        raise ClusterConfigError(f"--image {shorten(repr(image))}: must be a container image reference without "
                                 "spaces, e.g. 'tensorflow/tensorflow:2.21.0'")
    if not 1 <= workers <= 1024 or not 0 <= ps <= 1024:
        raise ClusterConfigError(f"--workers {workers} / --ps {ps}: need 1-1024 workers and 0-1024 ps")
    if ps and kind != "jobset":
        raise ClusterConfigError(f"--ps {ps} with --kind {kind}: parameter servers need a role each with its own "
                                 "command (the ps and workers serve, the chief trains): use --kind jobset")
    if not 1 <= port <= 65535:
        raise ClusterConfigError(f"--port {port}: must be 1-65535")


def _env(literal: Dict[str, str], labels: Dict[str, str]) -> List[Dict[str, Any]]:
    env: List[Dict[str, Any]] = [{"name": k, "value": v} for k, v in literal.items()]
    env += [{"name": var, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{label}']"}}}
            for var, label in labels.items()]
    return env


def _pod_spec(container: str, image: str, command: Sequence[str], env: List[Dict[str, Any]], port: int,
              backup_claim: Optional[str]) -> Dict[str, Any]:
    spec: Dict[str, Any] = {"name": container, "image": image, "command": [str(c) for c in command],
                            "env": env, "ports": [{"containerPort": port, "name": "tfaccel"}]}
    pod: Dict[str, Any] = {"restartPolicy": "Never", "terminationGracePeriodSeconds": GRACE_PERIOD_S,
                           "containers": [spec]}
    if backup_claim:
        spec["volumeMounts"] = [{"name": "backup", "mountPath": BACKUP_MOUNT}]
        pod["volumes"] = [{"name": "backup", "persistentVolumeClaim": {"claimName": backup_claim}}]
    return pod


def _failure_policy(container: str) -> Dict[str, Any]:
    """Exit 75: replace the pod, no failure counted; exit 2: fail the job now; a disruption (eviction): replace."""
    return {"rules": [
        {"action": "Ignore", "onExitCodes": {"containerName": container, "operator": "In",
                                             "values": [EXIT_PREEMPTED]}},
        {"action": "FailJob", "onExitCodes": {"containerName": container, "operator": "In", "values": [EXIT_CONFIG]}},
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]}


def _job_spec(pod: Dict[str, Any], container: str, count: int, labels: Optional[Dict[str, str]] = None
              ) -> Dict[str, Any]:
    template: Dict[str, Any] = {"spec": pod}
    if labels:
        template = {"metadata": {"labels": labels}, "spec": pod}
    return {"completionMode": "Indexed", "completions": count, "parallelism": count, "backoffLimit": 3,
            "podFailurePolicy": _failure_policy(container), "template": template}


def _common(name: str) -> Dict[str, str]:
    # a ConfigError ends the pod with exit 2 (not Python's 1), which the podFailurePolicy fails the job on
    return {JOB_ID_ENV: name, TIMEOUT_ENV: f"{DEFAULT_TIMEOUT_S:g}", LAUNCHED_ENV: "1"}


def _indexed_job(name: str, image: str, command: Sequence[str], workers: int, port: int,
                 claim: Optional[str], meta: Dict[str, Any]) -> List[Dict[str, Any]]:
    literal = {TASKS_ENV: f"worker={workers}", PORT_ENV: str(port), SUBDOMAIN_ENV: name, **_common(name)}
    pod = _pod_spec(CONTAINER, image, command, _env(literal, {JOB_NAME_ENV: JOB_NAME_LABEL}), port, claim)
    pod["subdomain"] = name
    service = {"apiVersion": "v1", "kind": "Service", "metadata": dict(meta),
               "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                        "selector": {JOB_NAME_LABEL: name}, "ports": [{"name": "tfaccel", "port": port}]}}
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": dict(meta),
           "spec": _job_spec(pod, CONTAINER, workers)}
    return [service, job]


def _jobset_spec(name: str, roles: Dict[str, int], image: str, command: Sequence[str], port: int,
                 claim: Optional[str]) -> Dict[str, Any]:
    literal = {TASKS_ENV: ",".join(f"{role}={n}x1" for role, n in roles.items()), PORT_ENV: str(port),
               **_common(name)}
    replicated = []
    for role, count in roles.items():
        cmd = SERVER_COMMAND if "chief" in roles and role != "chief" else command
        pod = _pod_spec(CONTAINER, image, cmd, _env(literal, JOBSET_LABELS), port, claim)
        replicated.append({"name": role, "replicas": count, "template": {"spec": _job_spec(pod, CONTAINER, 1)}})
    spec: Dict[str, Any] = {
        "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
        # a child Job that failed on exit 2 fails the JobSet at once; any other failure restarts it (up to 3 times)
        "failurePolicy": {"maxRestarts": 3, "rules": [{"name": "config-error", "action": "FailJobSet",
                                                       "onJobFailureReasons": ["PodFailurePolicy"]}]},
        "replicatedJobs": replicated}
    if "chief" in roles:  # servers never end by themselves: the job is done when the chief is
        spec["successPolicy"] = {"operator": "All", "targetReplicatedJobs": ["chief"]}
    return spec


def _trainjob(name: str, image: str, command: Sequence[str], workers: int, port: int, claim: Optional[str],
              meta: Dict[str, Any]) -> List[Dict[str, Any]]:
    labels = {**JOBSET_LABELS, TRAINER_STEP_ENV: TRAINER_STEP_LABEL}
    pod = _pod_spec(TRAINER_CONTAINER, image, command, _env({PORT_ENV: str(port), **_common(name)}, labels),
                    port, claim)
    job = _job_spec(pod, TRAINER_CONTAINER, 1, labels={TRAINER_STEP_LABEL: "trainer"})
    runtime_meta = {**meta, "name": RUNTIME_NAME}
    runtime = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainingRuntime", "metadata": runtime_meta,
               "spec": {"mlPolicy": {"numNodes": 1},  # plainML: no torch/mpi/jax policy, no env of its own
                        "template": {"spec": {
                            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
                            "replicatedJobs": [{"name": "node", "replicas": 1, "template": {
                                "metadata": {"labels": {TRAINER_STEP_LABEL: "trainer"}}, "spec": job}}]}}}}
    trainjob = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": dict(meta),
                "spec": {"runtimeRef": {"name": RUNTIME_NAME, "apiGroup": "trainer.kubeflow.org",
                                        "kind": "TrainingRuntime"},
                         "trainer": {"image": image, "command": [str(c) for c in command], "numNodes": workers,
                                     # beside numNodes, so that the two are changed together
                                     "env": [{"name": TASKS_ENV, "value": f"node=1x{workers}"}]}}}
    return [runtime, trainjob]


def k8s_manifest(kind: str, *, name: str, image: str, command: Sequence[str], workers: int, ps: int = 0,
                 backup_claim: Optional[str] = None, port: int = DEFAULT_PORT,
                 namespace: Optional[str] = None) -> List[Dict[str, Any]]:
    """The Kubernetes objects that run ``command`` on ``workers`` pods (and ``ps`` parameter servers: JobSet only).

    Args:
        kind: ``"indexed-job"``, ``"jobset"`` or ``"trainjob"``.
        name: the Job / JobSet / TrainJob name (and the Service's).
        image: the container image.
        command: what every training pod runs, e.g. ``["python", "train.py"]``.
        workers: training pods. With ``ps``: workers besides the chief, which serve like the ps.
        ps: parameter servers (JobSet only). Defaults to 0.
        backup_claim: a PersistentVolumeClaim mounted at ``/backup`` in every pod. Defaults to none.
        port: the port of every task. Defaults to 2222.
        namespace: the namespace. Defaults to none (kubectl's current one).

    Returns:
        The objects, in the order ``kubectl apply`` should create them.

    Raises:
        ClusterConfigError: an argument is invalid (the message names it).

    Example:
        >>> docs = k8s_manifest("jobset", name="mnist", image="tf:2.21", command=["python", "t.py"], workers=2)
        >>> docs[0]["kind"], docs[0]["spec"]["replicatedJobs"][0]["replicas"]
        ('JobSet', 2)
    """
    _check(kind, name, image, workers, ps, port)
    if not command:
        raise ClusterConfigError("command: give the pods' command after --, e.g. -- python train.py")
    meta: Dict[str, Any] = {"name": name, **({"namespace": namespace} if namespace else {})}
    if kind == "indexed-job":
        return _indexed_job(name, image, command, workers, port, backup_claim, meta)
    if kind == "trainjob":
        return _trainjob(name, image, command, workers, port, backup_claim, meta)
    roles = {"chief": 1, "worker": workers, "ps": ps} if ps else {"worker": workers}
    return [{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": meta,
             "spec": _jobset_spec(name, roles, image, command, port, backup_claim)}]


def k8s_manifest_yaml(kind: str, **options: Any) -> str:
    """:func:`k8s_manifest` as YAML documents separated by ``---`` (``kubectl apply -f -`` reads it)."""
    docs = k8s_manifest(kind, **options)
    return "---\n".join(yaml.safe_dump(doc, sort_keys=False, default_flow_style=False) for doc in docs)
