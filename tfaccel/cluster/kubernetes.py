"""The cluster of a Kubernetes pod: an Indexed Job, a JobSet, or a Kubeflow Trainer v2 TrainJob (plainML runtime).

None of them sets a TF_CONFIG (Kubeflow's TFJob does: it is read as a TF_CONFIG, see ``tfaccel.cluster.described``),
and Kubernetes puts only ``JOB_COMPLETION_INDEX`` and ``HOSTNAME`` into a container's environment. The rest comes
from the pod's labels and annotations through the downward API (``fieldRef: metadata.labels['...']``) into the
variables named below, and from two literal variables the manifest carries: the shape of the job
(``TFACCEL_K8S_TASKS``) and the port. ``tfaccel k8s manifest`` writes all of them (tfaccel.cluster.k8s_manifest).

Host names are the ones Kubernetes gives the pods (stable across pod re-creation, unlike pod IPs):

* Indexed Job + headless Service: ``<job>-<index>.<subdomain>`` (the pod's ``subdomain`` is the Service's name);
  ``TFACCEL_K8S_TASKS`` ``"chief=1,ps=1,worker=2"`` gives the roles to the indices in that order.
* JobSet: ``<jobset>-<replicatedJob>-<jobIndex>-<podIndex>.<subdomain>`` (subdomain defaults to the JobSet's
  name); each replicated job is a role (chief, worker, ps, evaluator); ``TFACCEL_K8S_TASKS`` ``"worker=2x1,ps=1x1"``
  gives each replicated job's ``replicas x parallelism``; a role's tasks are numbered by (job index, pod index).
* TrainJob: a JobSet named after the TrainJob with one replicated job ``node`` (``parallelism`` = ``numNodes``):
  ``<trainjob>-node-0-<i>.<trainjob>``, all workers. Recognised by the pod label
  ``trainer.kubeflow.org/trainjob-ancestor-step``.

Names appear in DNS late (JobSet publishes not-ready addresses, but a pod still waits for the DNS server to see the
others): :func:`wait_resolvable` retries within a bound and names the host that never resolved.
"""

import os
import re
import socket
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from tfaccel.cluster.described import EnvCluster, Fact
from tfaccel.cluster.errors import ClusterConfigError
from tfaccel.cluster.limits import show

__all__ = ["TASKS_ENV", "PORT_ENV", "SUBDOMAIN_ENV", "DNS_TIMEOUT_ENV", "INDEX_ENV", "JOB_NAME_ENV", "JOBSET_ENV",
           "JOBSET_LABELS", "TRAINER_STEP_ENV", "TRAINER_STEP_LABEL", "DEFAULT_PORT", "KINDS", "read_indexed_job",
           "read_jobset", "wait_resolvable", "parse_tasks"]

TASKS_ENV = "TFACCEL_K8S_TASKS"
PORT_ENV = "TFACCEL_K8S_PORT"
SUBDOMAIN_ENV = "TFACCEL_K8S_SUBDOMAIN"
DNS_TIMEOUT_ENV = "TFACCEL_K8S_DNS_TIMEOUT"
INDEX_ENV = "JOB_COMPLETION_INDEX"  # set by the Job controller in every pod of an Indexed Job (JobSet's too)
JOB_NAME_ENV = "TFACCEL_K8S_JOB_NAME"  # downward API: metadata.labels['batch.kubernetes.io/job-name']
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
# variable -> the JobSet label (or annotation) it carries (jobset api/jobset/v1alpha2/jobset_types.go)
JOBSET_LABELS: Dict[str, str] = {
    "TFACCEL_JOBSET_NAME": "jobset.sigs.k8s.io/jobset-name",
    "TFACCEL_REPLICATED_JOB": "jobset.sigs.k8s.io/replicatedjob-name",
    "TFACCEL_REPLICATED_JOB_REPLICAS": "jobset.sigs.k8s.io/replicatedjob-replicas",
    "TFACCEL_JOB_INDEX": "jobset.sigs.k8s.io/job-index",
    "TFACCEL_JOB_GLOBAL_INDEX": "jobset.sigs.k8s.io/job-global-index",
    "TFACCEL_GLOBAL_REPLICAS": "jobset.sigs.k8s.io/global-replicas",
    "TFACCEL_RESTART_ATTEMPT": "jobset.sigs.k8s.io/restart-attempt",
}
JOBSET_ENV = "TFACCEL_JOBSET_NAME"
TRAINER_STEP_ENV = "TFACCEL_TRAINER_STEP"
TRAINER_STEP_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
DEFAULT_PORT = 2222
DEFAULT_DNS_TIMEOUT_S = 180.0
KINDS = ("indexed-job", "jobset", "trainjob")
ROLE_ORDER = ("chief", "worker", "ps", "evaluator")
_TRAINER_NODE = "node"  # Trainer v2's replicated job: every node a worker
_SHAPE_RE = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)=(\d{1,5})(?:x(\d{1,5}))?$")


def parse_tasks(raw: str, *, pods: bool) -> List[Tuple[str, int, int]]:
    """Reads ``TFACCEL_K8S_TASKS``: ``"chief=1,worker=2"`` (Indexed Job) or ``"worker=2x1,ps=1x1"`` (JobSet).

    Args:
        raw: the variable's value.
        pods: True for a JobSet (``NAMExREPLICAS`` with ``xPODS``; a missing ``xPODS`` means 1).

    Returns:
        ``[(name, replicas, pods per replica), ...]`` in the order given.

    Raises:
        ClusterConfigError: the value is malformed, names a part twice or a count of 0.
    """
    example = "worker=2x1,ps=1x1" if pods else "chief=1,ps=1,worker=2"
    parts: List[Tuple[str, int, int]] = []
    for item in (raw or "").split(","):
        match = _SHAPE_RE.match(item.strip())
        if not match or (match.group(4) and not pods):
            raise ClusterConfigError(f"{TASKS_ENV} {show(raw)}: part {show(item)} is not NAME=COUNT"
                                     f"{'[xPODS]' if pods else ''}; expected e.g. {example!r} (tfaccel k8s manifest "
                                     "writes it)")
        name, count, per = match.group(1), int(match.group(3)), int(match.group(4) or 1)
        if count < 1 or per < 1 or any(p[0] == name for p in parts):
            raise ClusterConfigError(f"{TASKS_ENV} {show(raw)}: {name!r} given twice or with a count of 0; "
                                     f"expected e.g. {example!r}")
        parts.append((name, count, per))
    return parts


def _int(env: Mapping[str, str], name: str, what: str) -> int:
    raw = env.get(name, "")
    if not raw.strip().isdigit():
        raise ClusterConfigError(f"{name} {show(raw)}: must be a whole number ({what}); the pod's manifest sets it "
                                 "(tfaccel k8s manifest writes it)")
    return int(raw)


def _port(env: Mapping[str, str]) -> int:
    raw = env.get(PORT_ENV, "").strip()
    port = int(raw) if raw.isdigit() else (DEFAULT_PORT if not raw else -1)
    if not 1 <= port <= 65535:
        raise ClusterConfigError(f"{PORT_ENV} {show(raw)}: must be a port 1-65535; defaults to {DEFAULT_PORT}")
    return port


def _role(name: str, source: str) -> str:
    if name == _TRAINER_NODE:
        return "worker"
    if name not in ROLE_ORDER:
        raise ClusterConfigError(f"{source}: {TASKS_ENV} names {name!r}, not a role; name each replicated job after "
                                 f"its role: {', '.join(ROLE_ORDER)} (Trainer v2's {_TRAINER_NODE!r}: workers)")
    return name


def read_indexed_job(environ: Optional[Mapping[str, str]] = None) -> Optional[EnvCluster]:
    """This pod's cluster from an Indexed Job behind a headless Service; None unless ``TFACCEL_K8S_JOB_NAME`` is set.

    Raises:
        ClusterConfigError: a variable is missing or malformed, or the index is outside the job's tasks.
    """
    env = os.environ if environ is None else environ
    job = env.get(JOB_NAME_ENV, "").strip()
    if not job or env.get(JOBSET_ENV, "").strip():
        return None
    source = "Indexed Job"
    index = _int(env, INDEX_ENV, "the pod's completion index, set by the Job controller")
    subdomain = env.get(SUBDOMAIN_ENV, "").strip() or job
    port = _port(env)
    cluster: Dict[str, List[str]] = {}
    task: Optional[Tuple[str, int]] = None
    position = 0
    for name, count, _ in parse_tasks(env.get(TASKS_ENV, ""), pods=False):
        role = _role(name, source)
        for i in range(count):
            cluster.setdefault(role, []).append(f"{job}-{position}.{subdomain}:{port}")
            if position == index:
                task = (role, len(cluster[role]) - 1)
            position += 1
    if task is None:
        raise ClusterConfigError(f"{source} {job!r}: {INDEX_ENV}={index} is outside its {position} tasks "
                                 f"({TASKS_ENV}={env.get(TASKS_ENV)!r}); the Job's completions must equal that count")
    facts = (Fact("job", job, f"{JOB_NAME_ENV} (label {JOB_NAME_LABEL})"),
             Fact("index", str(index), f"{INDEX_ENV} (set by the Job controller)"),
             Fact("tasks", env.get(TASKS_ENV, ""), f"{TASKS_ENV} (the manifest)"),
             Fact("subdomain", subdomain, f"{SUBDOMAIN_ENV}" if env.get(SUBDOMAIN_ENV) else "the job's name"),
             Fact("port", str(port), PORT_ENV if env.get(PORT_ENV) else "default"))
    return EnvCluster(_ordered(cluster), task, source, source, facts)


def read_jobset(environ: Optional[Mapping[str, str]] = None) -> Optional[EnvCluster]:
    """This pod's cluster from a JobSet (or a TrainJob's JobSet); None unless ``TFACCEL_JOBSET_NAME`` is set.

    Raises:
        ClusterConfigError: a variable is missing or malformed, or the labels contradict ``TFACCEL_K8S_TASKS``.
    """
    env = os.environ if environ is None else environ
    jobset = env.get(JOBSET_ENV, "").strip()
    if not jobset:
        return None
    source = "TrainJob" if env.get(TRAINER_STEP_ENV, "").strip() else "JobSet"
    mine = env.get("TFACCEL_REPLICATED_JOB", "").strip()
    job_index = _int(env, "TFACCEL_JOB_INDEX", f"label {JOBSET_LABELS['TFACCEL_JOB_INDEX']}")
    pod_index = _int(env, INDEX_ENV, "the pod's completion index, set by the Job controller")
    subdomain = env.get(SUBDOMAIN_ENV, "").strip() or jobset
    port = _port(env)
    shape = parse_tasks(env.get(TASKS_ENV, ""), pods=True)
    cluster: Dict[str, List[str]] = {}
    task: Optional[Tuple[str, int]] = None
    for name, replicas, per in shape:
        role = _role(name, source)
        for j in range(replicas):
            for p in range(per):
                cluster.setdefault(role, []).append(f"{jobset}-{name}-{j}-{p}.{subdomain}:{port}")
                if (name, j, p) == (mine, job_index, pod_index):
                    task = (role, len(cluster[role]) - 1)
    _check_labels(env, source, shape, mine)
    if task is None:
        raise ClusterConfigError(f"{source} {jobset!r}: this pod (replicated job {mine!r}, job index {job_index}, pod "
                                 f"index {pod_index}) is not among {TASKS_ENV}={env.get(TASKS_ENV)!r}; the manifest's "
                                 "replicas/parallelism must match it")
    facts = [Fact("jobset" if source == "JobSet" else "trainjob", jobset,
                  f"TFACCEL_JOBSET_NAME (label {JOBSET_LABELS[JOBSET_ENV]})")]
    facts += [Fact(JOBSET_LABELS[var].split("/")[1], env[var], f"{var} (label {JOBSET_LABELS[var]})")
              for var in JOBSET_LABELS if var != JOBSET_ENV and env.get(var, "").strip()]
    facts += [Fact("pod index", str(pod_index), f"{INDEX_ENV} (set by the Job controller)"),
              Fact("tasks", env.get(TASKS_ENV, ""), f"{TASKS_ENV} (the manifest)"),
              Fact("subdomain", subdomain, SUBDOMAIN_ENV if env.get(SUBDOMAIN_ENV) else "the JobSet's name"),
              Fact("port", str(port), PORT_ENV if env.get(PORT_ENV) else "default")]
    if source == "TrainJob":
        facts.append(Fact("trainer step", env[TRAINER_STEP_ENV], f"{TRAINER_STEP_ENV} (label {TRAINER_STEP_LABEL})"))
    return EnvCluster(_ordered(cluster), task, source, source, tuple(facts))


def _check_labels(env: Mapping[str, str], source: str, shape: Sequence[Tuple[str, int, int]], mine: str) -> None:
    """The JobSet's own labels (replicas of this replicated job, replicas of all) against ``TFACCEL_K8S_TASKS``."""
    sizes = {name: replicas for name, replicas, _ in shape}
    if mine not in sizes:
        raise ClusterConfigError(f"{source}: TFACCEL_REPLICATED_JOB {show(mine)} (label "
                                 f"{JOBSET_LABELS['TFACCEL_REPLICATED_JOB']}) is not in {TASKS_ENV}="
                                 f"{env.get(TASKS_ENV)!r}; valid: {', '.join(sizes)}")
    checks = (("TFACCEL_REPLICATED_JOB_REPLICAS", sizes[mine]), ("TFACCEL_GLOBAL_REPLICAS", sum(sizes.values())))
    for var, expected in checks:
        raw = env.get(var, "").strip()
        if raw and raw != str(expected):
            raise ClusterConfigError(f"{source}: {var}={raw} (label {JOBSET_LABELS[var]}) but {TASKS_ENV}="
                                     f"{env.get(TASKS_ENV)!r} says {expected}; regenerate the manifest so both agree")


def _ordered(cluster: Dict[str, List[str]]) -> Dict[str, List[str]]:
    return {role: cluster[role] for role in ROLE_ORDER if role in cluster}


_RESOLVED: Dict[str, str] = {}  # host -> first address, for this process (names are stable; pods' IPs are not)


def wait_resolvable(found: EnvCluster, *, environ: Optional[Mapping[str, str]] = None,
                    resolve: Callable[[str], str] = lambda host: socket.getaddrinfo(host, None)[0][4][0],
                    sleep: Callable[[float], None] = time.sleep,
                    clock: Callable[[], float] = time.monotonic) -> Dict[str, str]:
    """Waits until every host of the cluster resolves, retrying with back-off up to ``TFACCEL_K8S_DNS_TIMEOUT``.

    Args:
        found: the cluster read from a pod's environment.
        environ: for the timeout. Defaults to ``os.environ``.
        resolve: host -> address. Defaults to ``socket.getaddrinfo``.

    Returns:
        ``{host: address}``.

    Raises:
        ClusterConfigError: a host did not resolve in time (the message names it and the last error).
    """
    env = os.environ if environ is None else environ
    raw = env.get(DNS_TIMEOUT_ENV, "").strip()
    try:
        limit = float(raw) if raw else DEFAULT_DNS_TIMEOUT_S
    except ValueError:
        limit = -1.0
    if not limit > 0:
        raise ClusterConfigError(f"{DNS_TIMEOUT_ENV} {show(raw)}: must be seconds > 0; defaults to "
                                 f"{DEFAULT_DNS_TIMEOUT_S:g}")
    hosts = [address.rsplit(":", 1)[0] for addresses in found.document.values() for address in addresses]
    deadline, delay, tries = clock() + limit, 0.1, 0
    for host in hosts:
        while host not in _RESOLVED:
            tries += 1
            try:
                _RESOLVED[host] = resolve(host)
            except OSError as exc:
                if clock() + delay > deadline:
                    raise ClusterConfigError(
                        f"{found.source}: host {host!r} did not resolve within {limit:g} s ({tries} tries; last "
                        f"error: {exc}); check that the headless Service exists and selects the pods, and that the "
                        f"pod is running; raise {DNS_TIMEOUT_ENV} if DNS is slow here") from None
                sleep(delay)
                delay = min(delay * 2, 5.0)
    return {host: _RESOLVED[host] for host in hosts}
