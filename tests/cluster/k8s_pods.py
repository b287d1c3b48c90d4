"""The pods Kubernetes would make from a `tfaccel k8s manifest` output, with what each pod's container sees.

What the controllers do, written out from their sources so that the tests can check the manifests without a cluster
(none can run here: no container engine, no kube-apiserver):
* the Job controller (Indexed completion mode): pod ``i`` of Job ``J`` gets hostname ``J-i``, labels
  ``batch.kubernetes.io/job-name`` and ``batch.kubernetes.io/job-completion-index``, env ``JOB_COMPLETION_INDEX=i``;
* the JobSet controller (``labelAndAnnotateObject`` in pkg/controllers/jobset_controller.go): Job
  ``<jobset>-<replicatedJob>-<jobIndex>``, labels jobset-name, replicatedjob-name, replicatedjob-replicas,
  job-index, job-global-index, global-replicas, restart-attempt; subdomain = ``network.subdomain`` or the JobSet name;
* Trainer v2: a TrainJob becomes a JobSet of its name from the runtime's template, ``node`` with
  ``parallelism = completions = numNodes``, the TrainJob's ``trainer.env`` / ``image`` / ``command`` on container
  ``node``;
* the kubelet: ``env`` entries with ``value`` as given, ``valueFrom.fieldRef`` ``metadata.labels['k']`` from the
  pod's labels (the empty string when a label is missing, as the kubelet does).
"""

import copy
import dataclasses
import re
from typing import Any, Dict, List, Optional

_LABEL_REF = re.compile(r"^metadata\.labels\['([^']+)'\]$")


@dataclasses.dataclass
class Pod:
    name: str
    hostname: str
    subdomain: str
    labels: Dict[str, str]
    env: Dict[str, str]
    command: List[str]
    spec: Dict[str, Any]  # the pod template's spec (grace period, volumes, ...)
    job: str
    failure_policy: Dict[str, Any]
    backoff_limit: int

    @property
    def fqdn(self) -> str:
        return f"{self.hostname}.{self.subdomain}"


def _container_env(container: Dict[str, Any], labels: Dict[str, str]) -> Dict[str, str]:
    env: Dict[str, str] = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = str(item["value"])
        else:
            match = _LABEL_REF.match(item["valueFrom"]["fieldRef"]["fieldPath"])
            assert match, item
            env[item["name"]] = labels.get(match.group(1), "")
    return env


def _pod(job_name: str, job_spec: Dict[str, Any], index: int, subdomain: str, labels: Dict[str, str],
         trainer: Optional[Dict[str, Any]] = None) -> Pod:
    spec = copy.deepcopy(job_spec["template"]["spec"])
    labels = {**(job_spec["template"].get("metadata") or {}).get("labels", {}), **labels,
              "batch.kubernetes.io/job-name": job_name, "batch.kubernetes.io/job-completion-index": str(index)}
    container = spec["containers"][0]
    if trainer:  # Trainer v2 upserts the TrainJob's trainer fields into the runtime's `node` container
        container["image"] = trainer["image"]
        container["command"] = trainer["command"]
        names = {e["name"] for e in trainer.get("env", [])}
        container["env"] = [e for e in container.get("env", []) if e["name"] not in names] + trainer.get("env", [])
    env = {**_container_env(container, labels), "JOB_COMPLETION_INDEX": str(index),
           "HOSTNAME": f"{job_name}-{index}"}
    return Pod(name=f"{job_name}-{index}", hostname=f"{job_name}-{index}", subdomain=subdomain, labels=labels,
               env=env, command=list(container["command"]), spec=spec, job=job_name,
               failure_policy=job_spec.get("podFailurePolicy", {}), backoff_limit=job_spec.get("backoffLimit", 6))


def _jobset_pods(name: str, spec: Dict[str, Any], restart: int, trainer: Optional[Dict[str, Any]] = None
                 ) -> List[Pod]:
    subdomain = (spec.get("network") or {}).get("subdomain") or name
    total = sum(rj["replicas"] for rj in spec["replicatedJobs"])
    pods, global_index = [], 0
    for rj in spec["replicatedJobs"]:
        for j in range(rj["replicas"]):
            job_spec = copy.deepcopy(rj["template"]["spec"])
            if trainer:
                job_spec["parallelism"] = job_spec["completions"] = trainer["numNodes"]
            labels = {"jobset.sigs.k8s.io/jobset-name": name, "jobset.sigs.k8s.io/replicatedjob-name": rj["name"],
                      "jobset.sigs.k8s.io/replicatedjob-replicas": str(rj["replicas"]),
                      "jobset.sigs.k8s.io/job-index": str(j), "jobset.sigs.k8s.io/job-global-index": str(global_index),
                      "jobset.sigs.k8s.io/global-replicas": str(total),
                      "jobset.sigs.k8s.io/restart-attempt": str(restart),
                      **((rj["template"].get("metadata") or {}).get("labels") or {})}
            job_name = f"{name}-{rj['name']}-{j}"
            pods += [_pod(job_name, job_spec, p, subdomain, labels, trainer) for p in range(job_spec["completions"])]
            global_index += 1
    return pods


def pods_of(docs: List[Dict[str, Any]], *, restart: int = 0) -> List[Pod]:
    """Every pod the objects make, in creation order."""
    by_kind = {doc["kind"]: doc for doc in docs}
    if "JobSet" in by_kind:
        js = by_kind["JobSet"]
        return _jobset_pods(js["metadata"]["name"], js["spec"], restart)
    if "TrainJob" in by_kind:
        tj, runtime = by_kind["TrainJob"], by_kind["TrainingRuntime"]
        assert tj["spec"]["runtimeRef"]["name"] == runtime["metadata"]["name"]
        return _jobset_pods(tj["metadata"]["name"], runtime["spec"]["template"]["spec"], restart,
                            trainer=tj["spec"]["trainer"])
    job = by_kind["Job"]
    name = job["metadata"]["name"]
    subdomain = job["spec"]["template"]["spec"].get("subdomain", "")
    return [_pod(name, job["spec"], i, subdomain, {}) for i in range(job["spec"]["completions"])]


def failure_action(policy: Dict[str, Any], container: str, exit_code: int) -> Optional[str]:
    """What a Job's ``podFailurePolicy`` does with a pod whose container exited ``exit_code`` (first rule matching)."""
    for rule in policy.get("rules", []):
        codes = rule.get("onExitCodes")
        if codes and codes.get("containerName") in (None, container):
            hit = exit_code in codes["values"]
            if hit == (codes["operator"] == "In"):
                return rule["action"]
    return None
