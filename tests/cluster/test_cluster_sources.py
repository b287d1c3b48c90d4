"""The cluster sources beside TF_CONFIG and SLURM: Kubernetes (Indexed Job, JobSet, Trainer v2 TrainJob), Vertex AI,
SageMaker; their order and conflicts; the bounded DNS wait; `tfaccel tf-config --explain`; the Plan naming them."""

import io
import json
import socket
from contextlib import redirect_stderr, redirect_stdout

import pytest

from tfaccel.cli.main import main
from tfaccel.cluster import ClusterConfigError, TaskInfo, task_from_env
from tfaccel.cluster.cloud import read_sagemaker, read_vertex
from tfaccel.cluster.kubernetes import parse_tasks, wait_resolvable
from tfaccel.cluster.sources import SOURCES, read_env
from tfaccel.devices import DeviceInfo
from tfaccel.strategies.auto import choose_strategy

JOBSET = {"TFACCEL_JOBSET_NAME": "mnist", "TFACCEL_REPLICATED_JOB": "worker", "TFACCEL_JOB_INDEX": "1",
          "JOB_COMPLETION_INDEX": "0", "TFACCEL_K8S_TASKS": "worker=2x1", "TFACCEL_GLOBAL_REPLICAS": "2",
          "TFACCEL_REPLICATED_JOB_REPLICAS": "2", "TFACCEL_RESTART_ATTEMPT": "0", "TFACCEL_JOB_GLOBAL_INDEX": "1"}
INDEXED = {"TFACCEL_K8S_JOB_NAME": "train", "JOB_COMPLETION_INDEX": "2", "TFACCEL_K8S_TASKS": "worker=3",
           "TFACCEL_K8S_SUBDOMAIN": "train-svc", "TFACCEL_K8S_PORT": "3000"}
TRAINJOB = {"TFACCEL_JOBSET_NAME": "tj", "TFACCEL_REPLICATED_JOB": "node", "TFACCEL_JOB_INDEX": "0",
            "JOB_COMPLETION_INDEX": "3", "TFACCEL_K8S_TASKS": "node=1x4", "TFACCEL_TRAINER_STEP": "trainer"}
# Vertex AI's documented CLUSTER_SPEC (https://cloud.google.com/vertex-ai/docs/training/distributed-training)
VERTEX_SPEC = {"cluster": {"workerpool0": ["cmle-training-workerpool0-ab-0:2222"],
                           "workerpool1": ["cmle-training-workerpool1-ab-0:2222", "cmle-training-workerpool1-ab-1:2222"],
                           "workerpool2": ["cmle-training-workerpool2-ab-0:2222"]},
               "environment": "cloud", "task": {"type": "workerpool1", "index": 1, "trial": "7"},
               "job": {"worker_pool_specs": [{"replica_count": 1}]}}
VERTEX_TF_CONFIG = {"cluster": {"chief": VERTEX_SPEC["cluster"]["workerpool0"],
                                "worker": VERTEX_SPEC["cluster"]["workerpool1"],
                                "ps": VERTEX_SPEC["cluster"]["workerpool2"]},
                    "environment": "cloud", "task": {"type": "worker", "index": 1, "trial": "7"},
                    "job": {"worker_pool_specs": [{"replica_count": 1}]}}
# SageMaker's documented variables (aws/sagemaker-training-toolkit ENVIRONMENT_VARIABLES.md) and its MWMS TF_CONFIG
SAGEMAKER = {"SM_HOSTS": '["algo-1","algo-2","algo-3"]', "SM_CURRENT_HOST": "algo-2", "SM_NUM_GPUS": "1",
             "SM_NUM_CPUS": "8"}
SAGEMAKER_TF_CONFIG = {"cluster": {"worker": ["algo-1:8890", "algo-2:8890", "algo-3:8890"]}, "environment": "cloud",
                       "task": {"index": 1, "type": "worker"}}


def facts(found):
    return {f.what: f.value for f in found.facts}


# ------------------------------------------------------------------------ Kubernetes
def test_jobset_pod_becomes_its_task_with_the_facts_and_their_origin():
    found = read_env(JOBSET, resolve=False)
    assert found.origin == "JobSet" and found.task == ("worker", 1)
    assert found.document == {"worker": ["mnist-worker-0-0.mnist:2222", "mnist-worker-1-0.mnist:2222"]}
    origins = {f.what: f.origin for f in found.facts}
    assert origins["jobset"] == "TFACCEL_JOBSET_NAME (label jobset.sigs.k8s.io/jobset-name)"
    assert origins["pod index"] == "JOB_COMPLETION_INDEX (set by the Job controller)"


def test_jobset_roles_are_replicated_jobs_in_role_order_and_pods_by_job_then_pod_index():
    env = dict(JOBSET, TFACCEL_K8S_TASKS="ps=2x1,worker=1x2,chief=1x1", TFACCEL_REPLICATED_JOB="worker",
               TFACCEL_JOB_INDEX="0", JOB_COMPLETION_INDEX="1", TFACCEL_GLOBAL_REPLICAS="4",
               TFACCEL_REPLICATED_JOB_REPLICAS="1")
    found = read_env(env, resolve=False)
    assert list(found.document) == ["chief", "worker", "ps"]
    assert found.document["worker"] == ["mnist-worker-0-0.mnist:2222", "mnist-worker-0-1.mnist:2222"]
    assert found.task == ("worker", 1)


def test_trainjob_nodes_are_workers():
    found = read_env(TRAINJOB, resolve=False)
    assert found.origin == "TrainJob" and found.task == ("worker", 3)
    assert found.document["worker"][3] == "tj-node-0-3.tj:2222"
    assert facts(found)["trainer step"] == "trainer"


def test_indexed_job_hosts_and_its_service_subdomain():
    found = read_env(INDEXED, resolve=False)
    assert found.origin == "Indexed Job" and found.task == ("worker", 2)
    assert found.document["worker"] == ["train-0.train-svc:3000", "train-1.train-svc:3000", "train-2.train-svc:3000"]
    chief = read_env(dict(INDEXED, TFACCEL_K8S_TASKS="chief=1,worker=2", JOB_COMPLETION_INDEX="0"), resolve=False)
    assert chief.task == ("chief", 0) and chief.document["worker"][0].startswith("train-1.")


@pytest.mark.parametrize("env,message", [
    (dict(JOBSET, TFACCEL_K8S_TASKS="worker=2y1"), r"TFACCEL_K8S_TASKS \"worker=2y1\": part \"worker=2y1\" is not "
                                                   r"NAME=COUNT\[xPODS\]; expected e.g. 'worker=2x1,ps=1x1'"),
    (dict(JOBSET, TFACCEL_K8S_TASKS="worker=2x1,worker=1"), "'worker' given twice"),
    (dict(JOBSET, TFACCEL_K8S_TASKS="learner=2x1", TFACCEL_REPLICATED_JOB="learner"),
     "names 'learner', not a role; name each replicated job after its role: chief, worker, ps, evaluator"),
    (dict(JOBSET, TFACCEL_JOB_INDEX="one"), r"TFACCEL_JOB_INDEX \"one\": must be a whole number"),
    (dict(JOBSET, TFACCEL_JOB_INDEX="5"), r"this pod \(replicated job 'worker', job index 5, pod index 0\) is not"),
    (dict(JOBSET, TFACCEL_REPLICATED_JOB="ps"), r"TFACCEL_REPLICATED_JOB \"ps\" .* is not in TFACCEL_K8S_TASKS"),
    (dict(JOBSET, TFACCEL_REPLICATED_JOB_REPLICAS="3"), r"TFACCEL_REPLICATED_JOB_REPLICAS=3 .* says 2"),
    (dict(JOBSET, TFACCEL_K8S_PORT="http"), r"TFACCEL_K8S_PORT \"http\": must be a port 1-65535"),
    (dict(INDEXED, JOB_COMPLETION_INDEX="3"), r"Indexed Job 'train': JOB_COMPLETION_INDEX=3 is outside its 3 tasks"),
    (dict(INDEXED, TFACCEL_K8S_TASKS="worker=2x1"), r"part \"worker=2x1\" is not NAME=COUNT;"),
])
def test_malformed_kubernetes_variables_are_named(env, message):
    with pytest.raises(ClusterConfigError, match=message):
        read_env(env, resolve=False)


def test_a_jobset_pod_is_read_by_the_jobset_reader_alone():
    """A JobSet's pods are an Indexed Job's pods too (JOB_COMPLETION_INDEX, job-name label): one reader reads them."""
    assert read_env({**INDEXED, **JOBSET}, resolve=False).origin == "JobSet"


def test_parse_tasks_reads_both_shapes():
    assert parse_tasks("chief=1,worker=3", pods=False) == [("chief", 1, 1), ("worker", 3, 1)]
    assert parse_tasks("node=1x4", pods=True) == [("node", 1, 4)]


# ------------------------------------------------------------------------ DNS
def test_names_are_retried_until_they_resolve_then_remembered():
    found = read_env(dict(JOBSET, TFACCEL_JOBSET_NAME="late"), resolve=False)
    calls, now = [], [0.0]

    def resolve(host):
        calls.append(host)
        if len(calls) < 4:
            raise socket.gaierror(-2, "Name or service not known")
        return "10.0.0.%d" % len(calls)

    got = wait_resolvable(found, environ={}, resolve=resolve, sleep=lambda s: now.__setitem__(0, now[0] + s),
                          clock=lambda: now[0])
    assert got == {"late-worker-0-0.late": "10.0.0.4", "late-worker-1-0.late": "10.0.0.5"}
    assert now[0] == pytest.approx(0.1 + 0.2 + 0.4)  # back-off between the tries
    assert wait_resolvable(found, environ={}, resolve=lambda h: 1 / 0) == got  # resolved once per process


def test_a_host_that_never_resolves_is_named_within_the_bound():
    found = read_env(dict(JOBSET, TFACCEL_JOBSET_NAME="never"), resolve=False)
    now = [0.0]

    def resolve(host):
        if host.startswith("never-worker-1"):
            raise socket.gaierror(-2, "Name or service not known")
        return "10.0.0.1"

    with pytest.raises(ClusterConfigError, match=r"JobSet: host 'never-worker-1-0.never' did not resolve within 20 s "
                                                 r"\(\d+ tries; last error: .*Name or service not known\).*headless "
                                                 r"Service.*TFACCEL_K8S_DNS_TIMEOUT"):
        wait_resolvable(found, environ={"TFACCEL_K8S_DNS_TIMEOUT": "20"}, resolve=resolve,
                        sleep=lambda s: now.__setitem__(0, now[0] + s), clock=lambda: now[0])
    assert now[0] <= 20
    with pytest.raises(ClusterConfigError, match=r"TFACCEL_K8S_DNS_TIMEOUT \"soon\": must be seconds > 0"):
        wait_resolvable(found, environ={"TFACCEL_K8S_DNS_TIMEOUT": "soon"})


def test_task_from_env_waits_for_dns_and_lists_the_addresses():
    env = dict(INDEXED, TFACCEL_K8S_SUBDOMAIN="", TFACCEL_K8S_JOB_NAME="localhost", TFACCEL_K8S_TASKS="worker=1",
               JOB_COMPLETION_INDEX="0", TFACCEL_K8S_DNS_TIMEOUT="0.2")
    with pytest.raises(ClusterConfigError, match=r"host 'localhost-0.localhost' did not resolve within 0.2 s"):
        task_from_env(env)


# ------------------------------------------------------------------------ cloud trainers
def test_vertex_cluster_spec_pools_become_roles():
    found = read_vertex({"CLUSTER_SPEC": json.dumps(VERTEX_SPEC)})
    assert found.document["cluster"] == VERTEX_TF_CONFIG["cluster"]
    assert found.document["task"] == {"type": "worker", "index": 1}
    assert facts(found)["trial"] == "7" and facts(found)["task"] == "workerpool1:1 -> worker:1"
    info = task_from_env({"CLUSTER_SPEC": json.dumps(VERTEX_SPEC)})
    assert info.source == "Vertex AI" and info.name == "worker:1"


def test_vertex_tf_config_with_its_own_keys_agrees_with_cluster_spec():
    env = {"CLUSTER_SPEC": json.dumps(VERTEX_SPEC), "TF_CONFIG": json.dumps(VERTEX_TF_CONFIG)}
    info = task_from_env(env)
    assert info.source == "TF_CONFIG" and info.name == "worker:1" and info.environment == "cloud"
    assert {"agrees with": "Vertex AI"}.items() <= {f.what: f.value for f in info.facts}.items()
    with pytest.raises(ClusterConfigError, match="unknown key"):  # Vertex's "job" key is read only beside CLUSTER_SPEC
        task_from_env({"TF_CONFIG": json.dumps(VERTEX_TF_CONFIG)})


@pytest.mark.parametrize("spec,message", [
    ("{", r"Vertex AI: CLUSTER_SPEC is not valid JSON"),
    ('{"cluster": {"workerpool9": ["a:1"]}, "task": {"type": "workerpool0", "index": 0}}',
     r"CLUSTER_SPEC cluster \"workerpool9\": not a Vertex AI worker pool; valid: workerpool0, workerpool1, "
     r"workerpool2, workerpool3"),
    ('{"cluster": {"workerpool0": ["a:1"]}}', r"CLUSTER_SPEC must be an object with \"cluster\" and \"task\""),
    ('{"cluster": {"workerpool0": ["a:1"]}, "task": {"type": "chief", "index": 0}}',
     r"CLUSTER_SPEC task.type \"chief\": valid: workerpool0"),
])
def test_vertex_errors(spec, message):
    with pytest.raises(ClusterConfigError, match=message):
        read_vertex({"CLUSTER_SPEC": spec})


def test_sagemaker_hosts_become_mwms_workers_and_its_tf_config_agrees():
    found = read_sagemaker(SAGEMAKER)
    assert found.document == SAGEMAKER_TF_CONFIG["cluster"] and found.task == ("worker", 1)
    assert facts(found)["num gpus"] == "1" and facts(found)["num cpus"] == "8"
    info = task_from_env(SAGEMAKER)
    assert info.source == "SageMaker" and info.spec.roles == {"worker": tuple(SAGEMAKER_TF_CONFIG["cluster"]["worker"])}
    with_tf = task_from_env(dict(SAGEMAKER, TF_CONFIG=json.dumps(SAGEMAKER_TF_CONFIG)))
    assert with_tf.source == "TF_CONFIG" and with_tf.tf_config() == info.tf_config() | {"environment": "cloud"}
    # SageMaker's parameter-server TF_CONFIG (master + workers + ps on the same hosts) is TF_CONFIG's to describe
    ps = {"cluster": {"master": ["algo-1:2222"], "worker": ["algo-2:2222"], "ps": ["algo-1:2223", "algo-2:2223"]},
          "environment": "cloud", "task": {"index": 0, "type": "worker"}}
    assert task_from_env(dict(SAGEMAKER, TF_CONFIG=json.dumps(ps))).name == "worker:0"


@pytest.mark.parametrize("env,message", [
    (dict(SAGEMAKER, SM_HOSTS="algo-1"), r"SageMaker: SM_HOSTS is not valid JSON"),
    (dict(SAGEMAKER, SM_HOSTS="[]"), r"SM_HOSTS must be a JSON list of host names"),
    (dict(SAGEMAKER, SM_CURRENT_HOST="algo-9"), r"SM_CURRENT_HOST \"algo-9\" is not in SM_HOSTS"),
    (dict(SAGEMAKER, TF_CONFIG=json.dumps({"cluster": {"worker": ["other:1", "algo-2:1"]},
                                           "task": {"type": "worker", "index": 1}})),
     r"TF_CONFIG and SageMaker .* TF_CONFIG names hosts \['other'\] that are not in SM_HOSTS"),
])
def test_sagemaker_errors(env, message):
    with pytest.raises(ClusterConfigError, match=message):
        task_from_env(env)


# ------------------------------------------------------------------------ precedence
def test_a_tf_config_that_agrees_with_the_pod_wins_and_one_that_does_not_is_an_error():
    agreeing = {"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}}
    info = task_from_env(dict(JOBSET, TF_CONFIG=json.dumps(agreeing)))
    assert info.source == "TF_CONFIG" and info.address == "b:1"
    other = {"cluster": {"worker": ["a:1", "b:1", "c:1"]}, "task": {"type": "worker", "index": 1}}
    with pytest.raises(ClusterConfigError, match=r"TF_CONFIG and JobSet both describe this process's cluster and they "
                                                 r"differ \(TF_CONFIG: worker x3; this task worker:1 against JobSet: "
                                                 r"worker x2; this task worker:1\); tfaccel does not pick one"):
        task_from_env(dict(JOBSET, TF_CONFIG=json.dumps(other)))
    assert task_from_env(dict(JOBSET, TF_CONFIG="{}")) is None  # the user's explicit "no cluster"


def test_two_platforms_at_once_are_an_error():
    with pytest.raises(ClusterConfigError, match=r"JobSet and SageMaker both describe this process's cluster \(JobSet: "
                                                 r"worker x2; this task worker:1; SageMaker: worker x3; this task "
                                                 r"worker:1\); tfaccel does not pick one"):
        read_env({**JOBSET, **SAGEMAKER}, resolve=False)
    slurm = {"SLURM_PROCID": "0", "SLURM_STEP_NODELIST": "n1", "SLURM_STEP_TASKS_PER_NODE": "1", "SLURM_STEP_ID": "0"}
    with pytest.raises(ClusterConfigError, match=r"Vertex AI and SLURM both describe"):
        read_env({"CLUSTER_SPEC": json.dumps(VERTEX_SPEC), **slurm})
    assert SOURCES[0] == "TF_CONFIG" and SOURCES[-1] == "SLURM"


def test_auto_picks_multi_worker_from_a_jobset_pod_and_says_why():
    info = TaskInfo.from_env_cluster(read_env(JOBSET, resolve=False))
    name, reason = choose_strategy(devices=DeviceInfo(gpus=(), tpu_address=None, num_cpu_devices=1), task=info,
                                   environ={})
    assert (name, reason) == ("multi_worker", "JobSet describes 2 tasks (worker x2) without ps tasks")
    assert info.describe_source().startswith("JobSet (jobset mnist from TFACCEL_JOBSET_NAME (label jobset.sigs.k8s.io/"
                                             "jobset-name); replicatedjob-name worker from")


# ------------------------------------------------------------------------ tf-config --explain
def explain(monkeypatch, env):
    for name in list(__import__("os").environ):
        if name.startswith(("TF_CONFIG", "SLURM_", "SM_", "TFACCEL_K8S", "TFACCEL_JOB", "JOB_COMPLETION")) or \
                name == "CLUSTER_SPEC":
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(["tf-config", "--explain"])
    return rc, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("env,lines", [
    (dict(SAGEMAKER), ["source: SageMaker (sources, first present wins: TF_CONFIG, JobSet, TrainJob, Indexed Job, "
                       "Vertex AI, SageMaker, SLURM)", "task: worker:1 of worker x3", "address: algo-2:8890",
                       "  hosts         algo-1,algo-2,algo-3  <- SM_HOSTS",
                       'TF_CONFIG: {"cluster":{"worker":["algo-1:8890","algo-2:8890","algo-3:8890"]},"task":{"type":'
                       '"worker","index":1}}']),
    ({"CLUSTER_SPEC": json.dumps(VERTEX_SPEC)}, ["source: Vertex AI", "task: worker:1 of chief x1, worker x2, ps x1",
                                                 "  trial        7  <- CLUSTER_SPEC task.trial"]),
    ({"TF_CONFIG": json.dumps({"cluster": {"chief": ["c:1"], "worker": ["w:1"]}, "task": {"type": "chief", "index": 0},
                               "environment": "cloud"})},
     ["source: TF_CONFIG", "task: chief:0 of chief x1, worker x1 (chief)",
      "  environment  cloud  <- TF_CONFIG environment (\"cloud\": Kubeflow TFJob, SageMaker, Vertex AI)"]),
    ({"SLURM_PROCID": "1", "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
      "SLURM_STEP_ID": "0"}, ["source: SLURM", "task: worker:1 of worker x2", "  procid              1  <- SLURM_PROCID",
                              "  step_nodelist       n[1-2]  <- SLURM_STEP_NODELIST"]),
    ({}, ["no cluster: none of the sources is present, so this is a single process"]),
])
def test_explain_names_the_source_and_where_each_fact_came_from(monkeypatch, env, lines):
    rc, out, err = explain(monkeypatch, env)
    assert rc == 0, err
    for line in lines:  # the facts' columns are aligned: compare with the spaces squeezed
        assert any(" ".join(got.split()).startswith(" ".join(line.split())) for got in out.splitlines()), (line, out)


def test_explain_errors(monkeypatch):
    rc, out, err = explain(monkeypatch, dict(JOBSET, TFACCEL_K8S_TASKS="bad"))
    assert rc == 2 and "tfaccel tf-config: error: TFACCEL_K8S_TASKS \"bad\"" in err and "Traceback" not in err
    out, err2 = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err2):
        rc = main(["tf-config", "tf_config/two_workers.yaml", "--explain"])
    assert rc == 2 and "--explain: reads this process's environment, not FILE" in err2.getvalue()
