"""`tfaccel k8s manifest`: every object validates against the Kubernetes API's models (the `kubernetes` client's
model classes, offline) and JobSet's / Trainer v2's CRD schemas (pinned in data/k8s_crd_schemas.json, its source
named there); the pods it makes read their cluster without a TF_CONFIG; the docs show its output."""

import io
import json
import os
import re
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import kubernetes.client as kc
import pytest
import yaml

from k8s_pods import failure_action, pods_of
from tfaccel.cli.main import main
from tfaccel.cluster import ClusterConfigError, TaskInfo
from tfaccel.cluster.k8s_manifest import BACKUP_MOUNT, GRACE_PERIOD_S, k8s_manifest
from tfaccel.cluster.sources import read_env
from tfaccel.errors import EXIT_PREEMPTED
from tfaccel.resilience.preemption import DEFAULT_TIMEOUT_S

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SCHEMAS = json.loads((HERE / "data" / "k8s_crd_schemas.json").read_text())
CASES = [("indexed-job", 2, 0), ("indexed-job", 4, 0), ("jobset", 2, 0), ("jobset", 4, 0), ("jobset", 2, 1),
         ("trainjob", 2, 0), ("trainjob", 3, 0)]


def manifest(kind, workers, ps, **extra):
    return k8s_manifest(kind, name="mnist", image="tensorflow/tensorflow:2.21.0", command=["python", "train.py"],
                        workers=workers, ps=ps, **{"backup_claim": "ckpt", **extra})


# ------------------------------------------------------------------------ validation against the API's own types
def strict(type_name, value, path):
    """Every key a field of the Kubernetes model (``openapi_types``/``attribute_map``), recursively."""
    if type_name[:5] in ("list[", "List["):
        assert isinstance(value, list), path
        for i, item in enumerate(value):
            strict(type_name[5:-1], item, f"{path}[{i}]")
    elif type_name[:5] in ("dict(", "Dict["):  # the client's older and newer (37.x) spellings
        assert isinstance(value, dict), path
        for key, item in value.items():
            strict(type_name[type_name.index(",") + 1:-1].strip(), item, f"{path}.{key}")
    elif type_name in ("str", "int", "bool", "float"):
        assert isinstance(value, {"str": str, "int": int, "bool": bool, "float": (int, float)}[type_name]), \
            (path, value)
    elif type_name != "object":
        cls = getattr(kc, type_name)
        fields = {json_name: attr for attr, json_name in cls.attribute_map.items()}
        assert isinstance(value, dict), path
        for key, item in value.items():
            assert key in fields, f"{path}.{key}: not a field of {type_name}"
            strict(cls.openapi_types[fields[key]], item, f"{path}.{key}")


def api_object(type_name, value):
    """Strict keys, then the client's own model (kubernetes>=37: pydantic; a missing required field is refused)."""
    strict(type_name, value, type_name)
    return getattr(kc, type_name).from_dict(value)


def crd_check(schema, value, path):
    """The pinned CRD schema: types, required fields, enums, no unknown keys."""
    kind = schema.get("type")
    if schema.get("x-kubernetes-int-or-string"):
        assert isinstance(value, (int, str)), path
        return
    expected = {"object": dict, "array": list, "string": str, "integer": int, "boolean": bool}.get(kind)
    if expected:
        assert isinstance(value, expected) and not (expected is int and isinstance(value, bool)), (path, value)
    if "enum" in schema:
        assert value in schema["enum"], (path, value, schema["enum"])
    if isinstance(value, dict):
        for key in schema.get("required", []):
            assert key in value, f"{path}: required {key!r} missing"
        if "properties" in schema:
            for key, item in value.items():
                assert key in schema["properties"], f"{path}.{key}: not a field of the CRD"
                crd_check(schema["properties"][key], item, f"{path}.{key}")
        elif "additionalProperties" in schema:
            for key, item in value.items():
                crd_check(schema["additionalProperties"], item, f"{path}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            crd_check(schema["items"], item, f"{path}[{i}]")


@pytest.mark.parametrize("kind,workers,ps", CASES)
def test_every_object_validates(kind, workers, ps):
    docs = manifest(kind, workers, ps)
    for doc in docs:
        if doc["kind"] in ("Service", "Job"):
            obj = api_object(f"V1{doc['kind']}", doc)
            assert obj.kind == doc["kind"] and obj.metadata.name == "mnist"
            continue
        source = SCHEMAS["source"][doc["kind"]]
        assert doc["apiVersion"] == source["apiVersion"], source
        crd_check(SCHEMAS["schemas"][doc["kind"]], doc, doc["kind"])
        jobset_spec = doc["spec"]["template"]["spec"] if doc["kind"] == "TrainingRuntime" else doc["spec"]
        for rj in jobset_spec.get("replicatedJobs", []):  # the embedded batch/v1 JobTemplateSpec, by the API's types
            api_object("V1JobTemplateSpec", rj["template"])
        for env in (doc["spec"].get("trainer") or {}).get("env", []):
            api_object("V1EnvVar", env)


def test_an_unknown_field_is_caught_by_both_checks():
    docs = manifest("jobset", 2, 0)
    docs[0]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["terminationGracePeriod"] = 40
    with pytest.raises(AssertionError, match="terminationGracePeriod: not a field of V1PodSpec"):
        api_object("V1JobTemplateSpec", docs[0]["spec"]["replicatedJobs"][0]["template"])
    docs[0]["spec"]["network"]["publishNotReady"] = True
    with pytest.raises(AssertionError, match="publishNotReady: not a field of the CRD"):
        crd_check(SCHEMAS["schemas"]["JobSet"], docs[0], "JobSet")


# ------------------------------------------------------------------------ what the pods get
@pytest.mark.parametrize("kind,workers,ps", CASES)
def test_the_pods_read_one_cluster_without_tf_config(kind, workers, ps):
    pods = pods_of(manifest(kind, workers, ps))
    assert len(pods) == workers + (ps + 1 if ps else 0)
    tasks, specs = set(), set()
    for pod in pods:
        assert "TF_CONFIG" not in pod.env
        found = read_env(pod.env, resolve=False)
        info = TaskInfo.from_env_cluster(found)
        expected = {"indexed-job": "Indexed Job", "jobset": "JobSet", "trainjob": "TrainJob"}[kind]
        assert info.source == expected
        assert info.address == f"{pod.fqdn}:2222"  # the name Kubernetes gives this very pod
        tasks.add(info.name)
        specs.add(json.dumps(info.spec.roles))
        # the pod's own failure policy: exit 75 replaced without a failure counted, exit 2 fails the job at once
        container = pod.spec["containers"][0]["name"]
        assert failure_action(pod.failure_policy, container, EXIT_PREEMPTED) == "Ignore"
        assert failure_action(pod.failure_policy, container, 2) == "FailJob"
        assert failure_action(pod.failure_policy, container, 1) is None
        assert pod.spec["terminationGracePeriodSeconds"] == GRACE_PERIOD_S > DEFAULT_TIMEOUT_S
        assert float(pod.env["TFACCEL_PREEMPTION_TIMEOUT"]) == DEFAULT_TIMEOUT_S
        assert pod.spec["volumes"] == [{"name": "backup", "persistentVolumeClaim": {"claimName": "ckpt"}}]
        assert pod.spec["containers"][0]["volumeMounts"][0]["mountPath"] == BACKUP_MOUNT
        assert pod.env["TFACCEL_JOB_ID"] == "mnist"
        assert pod.env["TFACCEL_EXIT_ON_CONFIG_ERROR"] == "1"  # a ConfigError exits 2: the policy's FailJob
    assert len(tasks) == len(pods) and len(specs) == 1  # every pod one task, all of them one cluster
    if ps:
        chief = [p for p in pods if p.labels.get("jobset.sigs.k8s.io/replicatedjob-name") == "chief"]
        servers = [p for p in pods if p not in chief]
        assert [p.command for p in chief] == [["python", "train.py"]]
        assert all(p.command == ["python", "-m", "tfaccel.launch.server"] for p in servers)


def test_jobset_restart_attempt_and_labels_reach_the_facts():
    pod = pods_of(manifest("jobset", 2, 0), restart=3)[1]
    info = TaskInfo.from_env_cluster(read_env(pod.env, resolve=False))
    facts = {f.what: (f.value, f.origin) for f in info.facts}
    assert facts["restart-attempt"] == ("3", "TFACCEL_RESTART_ATTEMPT (label jobset.sigs.k8s.io/restart-attempt)")
    assert facts["job-index"][0] == "1" and facts["jobset"][0] == "mnist"


def test_no_backup_volume_means_none_mounted_and_the_namespace_is_kept():
    for doc in manifest("jobset", 2, 0, backup_claim=None, namespace="ml"):
        assert doc["metadata"]["namespace"] == "ml"
    pod = pods_of(manifest("jobset", 2, 0, backup_claim=None))[0]
    assert "volumes" not in pod.spec and "volumeMounts" not in pod.spec["containers"][0]


# ------------------------------------------------------------------------ the CLI
def cli(*args):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            rc = main(list(args))
        except SystemExit as exc:
            rc = exc.code
    return rc, out.getvalue(), err.getvalue()


def test_cli_prints_the_manifest_as_yaml_documents():
    rc, out, err = cli("k8s", "manifest", "--kind", "jobset", "--workers", "2", "--ps", "1", "--image", "img",
                       "--name", "mnist", "--backup-volume", "ckpt", "--", "python", "train.py", "--epochs", "3")
    assert rc == 0, err
    docs = list(yaml.safe_load_all(out))
    assert docs == k8s_manifest("jobset", name="mnist", image="img", command=["python", "train.py", "--epochs", "3"],
                                workers=2, ps=1, backup_claim="ckpt")


@pytest.mark.parametrize("args,message", [
    (["--kind", "trainjob", "--ps", "1"], "--ps 1 with --kind trainjob: .* use --kind jobset"),
    (["--kind", "indexed-job", "--ps", "2"], "--ps 2 with --kind indexed-job"),
    (["--kind", "jobset", "--name", "Mnist_1"], "--name 'Mnist_1': must be a DNS label"),
    (["--kind", "jobset", "--workers", "0"], "--workers 0 / --ps 0: need 1-1024 workers"),
    (["--kind", "jobset", "--image", "a b"], "--image 'a b': must be a container image reference"),
    (["--kind", "jobset", "--port", "70000"], "--port 70000: must be 1-65535"),
    (["--kind", "cronjob"], "invalid choice: 'cronjob'"),
])
def test_cli_errors_name_the_flag(args, message):
    base = {"--workers": "2", "--image": "img"}
    for i in range(0, len(args), 2):
        base[args[i]] = args[i + 1]
    rc, out, err = cli("k8s", "manifest", *[x for kv in base.items() for x in kv], "--", "python", "t.py")
    assert rc == 2 and out == "" and re.search(message, err), err
    assert "Traceback" not in err


def test_cli_without_a_command_or_action():
    rc, _, err = cli("k8s", "manifest", "--kind", "jobset", "--workers", "2", "--image", "img")
    assert rc == 2 and "give the pods' command after --" in err
    rc, _, err = cli("k8s")
    assert rc == 2 and "manifest" in err


def test_the_verb_does_not_import_tensorflow():
    code = ("import sys; from tfaccel.cli.main import main; main(['k8s', 'manifest', '--kind', 'trainjob', "
            "'--workers', '2', '--image', 'i', '--', 'python', 't.py']); assert 'tensorflow' not in sys.modules")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=str(ROOT))
    assert out.returncode == 0 and "kind: TrainJob" in out.stdout, out.stderr


# ------------------------------------------------------------------------ the docs show this command's output
def test_the_docs_manifests_are_this_commands_output():
    text = (ROOT / "docs" / "guides" / "kubernetes.md").read_text()
    blocks = re.findall(r"```yaml\n# \$ (tfaccel k8s manifest [^\n]+)\n(.*?)```", text, re.S)
    assert len(blocks) >= 3, "the Kubernetes guide shows one manifest per kind"
    kinds = set()
    for command, shown in blocks:
        args = command.split()[1:]
        rc, out, err = cli(*args)
        assert rc == 0, err
        assert shown == out, f"docs/guides/kubernetes.md: the manifest of `{command}` is not its output; paste it again"
        kinds.add(args[args.index("--kind") + 1])
    assert kinds == {"indexed-job", "jobset", "trainjob"}


def test_bad_shapes_in_a_pod_are_refused_with_the_variable_named():
    pod = pods_of(manifest("jobset", 2, 0))[0]
    env = dict(pod.env, TFACCEL_GLOBAL_REPLICAS="3")
    with pytest.raises(ClusterConfigError, match=r"TFACCEL_GLOBAL_REPLICAS=3 \(label jobset.sigs.k8s.io/global-replicas"
                                                 r"\) but TFACCEL_K8S_TASKS='worker=2x1' says 2"):
        read_env(env, resolve=False)


@pytest.mark.parametrize("kind,workers,ps", CASES)
def test_exactly_one_pod_is_the_chief_for_the_logger_and_is_chief(monkeypatch, kind, workers, ps):
    """tfaccel.is_chief() and the logger (tfaccel.log, which imports nothing of tfaccel) agree with the cluster."""
    from tfaccel.log import _task_from_environment, is_chief  # _task_from_environment: the logger's [role N] tag

    for name in list(os.environ):
        if name.startswith(("TF_CONFIG", "SLURM_", "HOROVOD_", "OMPI_", "PMI_", "TFACCEL_", "JOB_COMPLETION")):
            monkeypatch.delenv(name)
    chiefs = []
    for pod in pods_of(manifest(kind, workers, ps)):
        with monkeypatch.context() as patch:
            for name, value in pod.env.items():
                patch.setenv(name, value)
            info = TaskInfo.from_env_cluster(read_env(pod.env, resolve=False))
            assert is_chief() is info.is_chief, pod.name
            assert _task_from_environment() == (info.task_type, info.task_index), pod.name
            chiefs += [pod.name] if is_chief() else []
    assert len(chiefs) == 1, chiefs
