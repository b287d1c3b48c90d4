"""ClusterSpec, TaskInfo, the TF_CONFIG reader and TFJob manifests: every message path checked."""

import json
import logging
from typing import Iterator, List

import pytest

import tfaccel
from tfaccel.cluster import (ClusterConfigError, ClusterSpec, TaskInfo, parse_task, task_from_env,
                             task_from_tf_config, tfjob_manifest, tfjob_yaml)
from tfaccel.errors import ConfigError

TWO = {"worker": ["10.0.0.2:2222", "10.0.0.3:2222"]}
PS = {"chief": ["c:1"], "worker": ["w0:1", "w1:1"], "ps": ["p0:1"]}


@pytest.fixture
def warnings_seen() -> Iterator[List[str]]:
    """Messages of warnings logged on tfaccel's logger (it does not propagate to the root logger)."""
    seen: List[str] = []

    class _Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                seen.append(record.getMessage())

    logger = tfaccel.get_logger()
    handler = _Catch()
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(min(level, logging.WARNING) or logging.WARNING)  # another test may have quietened it
    try:
        yield seen
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _error(data: object) -> str:
    with pytest.raises(ClusterConfigError) as info:
        ClusterSpec.from_dict(data)
    return str(info.value)


def test_error_type_is_a_value_error() -> None:
    assert issubclass(ClusterConfigError, ConfigError)
    assert issubclass(ClusterConfigError, ValueError)


def test_public_names_are_lazy_exports() -> None:
    assert tfaccel.ClusterSpec is ClusterSpec
    assert tfaccel.TaskInfo is TaskInfo
    assert "ClusterSpec" in tfaccel.__all__


def test_basic_queries() -> None:
    spec = ClusterSpec.from_dict(PS)
    assert spec.roles == {"chief": ("c:1",), "worker": ("w0:1", "w1:1"), "ps": ("p0:1",)}
    assert spec.tasks() == [("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0)]
    assert spec.num_workers == 3
    assert spec.num_tasks == 4
    assert spec.address("worker:1") == "w1:1"
    assert spec.address(("ps", 0)) == "p0:1"
    assert spec.address("chief") == "c:1"
    spec.roles["worker"] = ()  # a fresh dict: the spec cannot be changed through it
    assert spec.roles["worker"] == ("w0:1", "w1:1")
    with pytest.raises(Exception):
        spec.cluster = ()  # type: ignore[misc]


def test_roles_are_put_in_canonical_order_and_specs_compare_by_cluster() -> None:
    a = ClusterSpec.from_dict({"ps": ["p:1"], "worker": ["w:1"], "chief": ["c:1"]})
    b = ClusterSpec.from_dict({"chief": ["c:1"], "worker": ["w:1"], "ps": ["p:1"]})
    assert a == b and hash(a) == hash(b)
    assert list(a.roles) == ["chief", "worker", "ps"]


@pytest.mark.parametrize("data, hint", [
    ({"worker": ["a:1"]}, "local"),
    ({"chief": ["a:1"]}, "local"),
    ({"worker": ["a:1"], "evaluator": ["e:1"]}, "local"),
    (TWO, "multi_worker"),
    ({"chief": ["a:1"], "worker": ["b:1"]}, "multi_worker"),
    (PS, "parameter_server"),
])
def test_strategy_hint(data: dict, hint: str) -> None:
    assert ClusterSpec.from_dict(data).strategy_hint == hint


def test_tf_config_is_exact() -> None:
    spec = ClusterSpec.from_dict(TWO)
    assert spec.tf_config("worker:1") == {"cluster": TWO, "task": {"type": "worker", "index": 1}}
    assert spec.tf_config(("worker", 0))["task"] == {"type": "worker", "index": 0}
    assert spec.tf_config("worker:0", environment="cloud", rpc_layer="grpc")["environment"] == "cloud"
    with pytest.raises(ClusterConfigError, match=r'environment 5: must be a non-empty string'):
        spec.tf_config("worker:0", environment=5)  # type: ignore[arg-type]


def test_from_hosts_model_garden_style() -> None:
    spec = ClusterSpec.from_hosts(workers="h1:2222,h2:2222", ps=["h3:2222"], chief="h0:2222", evaluator="e:2222")
    assert spec.roles == {"chief": ("h0:2222",), "worker": ("h1:2222", "h2:2222"), "ps": ("h3:2222",),
                          "evaluator": ("e:2222",)}
    assert ClusterSpec.from_hosts(workers=["a:1"]).roles == {"worker": ("a:1",)}
    with pytest.raises(ClusterConfigError, match=r"^cluster hosts: the cluster is empty"):
        ClusterSpec.from_hosts(workers="")
    with pytest.raises(ClusterConfigError, match=r'^cluster hosts: worker\[1\] "h1:2222": duplicate address'):
        ClusterSpec.from_hosts(workers=["h1:2222", "h1:2222"])


@pytest.mark.parametrize("data, expected", [
    ({"worker": ["localhost:2222", "localhost:99999"]}, 'worker[1] "localhost:99999": port must be 1-65535'),
    ({"worker": ["localhost:0"]}, 'worker[0] "localhost:0": port must be 1-65535'),
    ({"worker": ["localhost"]}, 'worker[0] "localhost": port is missing'),
    ({"worker": ["localhost:"]}, 'worker[0] "localhost:": port is missing'),
    ({"worker": ["localhost:http"]}, "port must be a number 1-65535, got 'http'"),
    ({"worker": ["localhost:02222"]}, "port has leading zeros; write localhost:2222"),
    ({"worker": [":2222"]}, 'worker[0] ":2222": host is empty'),
    ({"worker": [" a:1"]}, "contains whitespace"),
    ({"worker": ["grpc://a:1"]}, "must not carry a protocol"),
    ({"worker": ["::1:2222"]}, "an IPv6 host must be written in brackets"),
    ({"worker": ["[zz]:2222"]}, "host in brackets must be an IPv6 address"),
    ({"worker": ["a/b:1"]}, "host must be a hostname or IP address"),
    ({"worker": [False]}, "worker[0] False: must be a \"host:port\" string, got bool (YAML reads off/on"),
    ({"worker": [2222]}, "worker[0] 2222: must be a \"host:port\" string, got int"),
    ({"worker": [None]}, "worker[0] None: must be a \"host:port\" string, got NoneType; quote it"),
    ({"worker": "a:1"}, 'worker "a:1": must be a list of "host:port" strings'),
    ({"worker": {"0": "a:1"}}, "worker {'0': 'a:1'}: must be a list"),
    ({"worker": []}, "worker []: is an empty list"),
    ({}, "the cluster is empty"),
    (None, "the cluster is empty"),
    (["a:1"], "must be a mapping of role -> list"),
    ({"workers": ["a:1"]}, "role \"workers\": unknown role; valid roles are chief, worker, ps, evaluator; "
                           "did you mean 'worker'?"),
    ({"Worker": ["a:1"]}, "roles are lowercase: write 'worker'"),
    ({1: ["a:1"]}, "role 1: unknown role"),
    ({"chief": ["a:1", "b:1"], "worker": ["c:1"]}, "chief ['a:1', 'b:1']: at most one chief is allowed, got 2"),
    ({"worker": ["w:1"], "evaluator": ["a:1", "b:1"]}, "at most one evaluator is allowed"),
    ({"chief": ["a:1"], "worker": ["a:1"]}, 'worker[0] "a:1": duplicate address, already used by chief[0]'),
    ({"chief": ["a:1"], "ps": ["b:1"]}, "ps ['b:1']: parameter servers need at least one worker"),
    ({"evaluator": ["a:1"]}, "needs at least one chief or worker"),
    ({"master": ["a:1"], "chief": ["b:1"], "worker": ["c:1"]}, "master: both 'master' and 'chief' are given"),
    ({"task": {"type": "worker"}}, "a TF_CONFIG document needs a \"cluster\" key"),
])
def test_validation_messages(data: object, expected: str) -> None:
    message = _error(data)
    assert message.startswith("cluster description: ")
    assert expected in message


def test_master_is_legacy_chief_with_warning(warnings_seen: List[str]) -> None:
    spec = ClusterSpec.from_dict({"master": ["a:1"], "worker": ["b:1"]})
    assert spec.roles == {"chief": ("a:1",), "worker": ("b:1",)}
    assert any("role 'master' is the legacy name of 'chief'; rename it to 'chief'" in w for w in warnings_seen)
    warnings_seen.clear()
    assert spec.check_task("master:0") == ("chief", 0)
    assert any("'master' is the legacy name of 'chief'; use 'chief'" in w for w in warnings_seen)


def test_master_task_type_in_tf_config_warns(warnings_seen: List[str]) -> None:
    info = task_from_tf_config(json.dumps({"cluster": {"master": ["a:1"], "worker": ["b:1"]},
                                           "task": {"type": "master", "index": 0}}))
    assert info is not None and info.name == "chief:0" and info.is_chief
    assert any("task.type 'master' is the legacy name of 'chief'" in w for w in warnings_seen)


@pytest.mark.parametrize("task, expected", [
    ("ps:0", "task \"ps:0\": the cluster has no 'ps' role; its roles are worker; valid tasks: worker:0, worker:1"),
    ("worker:2", 'task "worker:2": task index out of range: the cluster has 2 worker task(s), so the index '
                 "must be 0-1"),
    ("worker:-1", 'task "worker:-1": must be "role:index" with a non-negative index'),
    ("worker:x", 'must be "role:index"'),
    ("boss:0", 'task "boss:0": unknown role'),
    (("worker", "1"), "task index must be an int"),
    (("worker", True), "task index must be an int"),
    ((1, 1), "task type must be a string"),
    (("worker", -1), "task index must be >= 0"),
    (3, "must be \"role:index\" (e.g. \"worker:1\") or a (role, index) pair"),
])
def test_bad_tasks(task: object, expected: str) -> None:
    spec = ClusterSpec.from_dict(TWO)
    with pytest.raises(ClusterConfigError) as info:
        spec.tf_config(task)  # type: ignore[arg-type]
    assert str(info.value).startswith("cluster description: ")
    assert expected in str(info.value)


def test_parse_task_without_a_cluster() -> None:
    assert parse_task("worker:1") == ("worker", 1)
    assert parse_task(["ps", 2]) == ("ps", 2)
    with pytest.raises(ClusterConfigError, match=r'^task "x:1": unknown role'):
        parse_task("x:1")


def test_export_writes_only_tf_config() -> None:
    spec = ClusterSpec.from_dict(TWO)
    env = {"OTHER": "1"}
    doc = spec.export("worker:1", env)
    assert set(env) == {"OTHER", "TF_CONFIG"}
    assert json.loads(env["TF_CONFIG"]) == doc == spec.tf_config("worker:1")
    spec.export("worker:0", env)  # overwriting is allowed; the new value wins
    assert json.loads(env["TF_CONFIG"])["task"]["index"] == 0


def test_export_writes_nothing_when_invalid(monkeypatch: pytest.MonkeyPatch, clean_tf_config: None) -> None:
    spec = ClusterSpec.from_dict(TWO)
    env = {"TF_CONFIG": "before"}
    for bad in ("worker:2", "ps:0", "nope", ("worker", "0")):
        with pytest.raises(ClusterConfigError):
            spec.export(bad, env)  # type: ignore[arg-type]
        assert env == {"TF_CONFIG": "before"}
    with pytest.raises(ClusterConfigError):
        spec.export("worker:0", env, environment="")
    assert env == {"TF_CONFIG": "before"}
    import os

    with pytest.raises(ClusterConfigError):
        spec.export("worker:9")
    assert "TF_CONFIG" not in os.environ
    spec.export("worker:1")  # default target: os.environ (monkeypatch in clean_tf_config restores it)
    assert json.loads(os.environ["TF_CONFIG"])["task"] == {"type": "worker", "index": 1}
    monkeypatch.delenv("TF_CONFIG")


def test_task_info_properties() -> None:
    spec = ClusterSpec.from_dict(PS)
    chief = TaskInfo(spec, "chief", 0)
    assert chief.name == "chief:0" and chief.is_chief and chief.num_tasks == 4 and chief.address == "c:1"
    assert not TaskInfo(spec, "worker", 0).is_chief  # there is a chief
    two = ClusterSpec.from_dict(TWO)
    assert TaskInfo(two, "worker", 0).is_chief and not TaskInfo(two, "worker", 1).is_chief
    assert TaskInfo(two, "worker", 1, environment="cloud").tf_config()["environment"] == "cloud"
    with pytest.raises(ClusterConfigError, match="task index out of range"):
        TaskInfo(two, "worker", 5)


def test_task_from_env_tf_config_and_nothing(clean_tf_config: None) -> None:
    assert task_from_env({}) is None
    assert task_from_env({"TF_CONFIG": ""}) is None
    assert task_from_env({"TF_CONFIG": "{}"}) is None
    assert task_from_env() is None  # os.environ, cleaned by the fixture
    assert ClusterSpec.from_env({}) is None
    raw = json.dumps({"cluster": TWO, "task": {"type": "worker", "index": 1}})
    info = task_from_env({"TF_CONFIG": raw})
    assert info is not None
    assert (info.task_type, info.task_index, info.source, info.environment) == ("worker", 1, "TF_CONFIG", None)
    assert ClusterSpec.from_env({"TF_CONFIG": raw}) == ClusterSpec.from_dict(TWO)


def test_tf_config_wins_over_slurm() -> None:
    raw = json.dumps({"cluster": TWO, "task": {"type": "worker", "index": 1}})
    env = {"TF_CONFIG": raw, "SLURM_PROCID": "0", "SLURM_JOB_NODELIST": "n[1-3]"}
    info = task_from_env(env)
    assert info is not None and info.source == "TF_CONFIG" and info.name == "worker:1"


def test_kubeflow_tfjob_tf_config() -> None:
    raw = json.dumps({"cluster": {"chief": ["j-chief-0.ns.svc:2222"],
                                  "worker": ["j-worker-0.ns.svc:2222", "j-worker-1.ns.svc:2222"],
                                  "evaluator": ["j-evaluator-0.ns.svc:2222"]},
                      "task": {"type": "evaluator", "index": 0}, "environment": "cloud"})
    info = task_from_env({"TF_CONFIG": raw})
    assert info is not None
    assert info.environment == "cloud" and info.task_type == "evaluator" and not info.is_chief
    assert info.spec.num_workers == 3 and info.spec.strategy_hint == "multi_worker"
    assert info.tf_config() == json.loads(raw)


@pytest.mark.parametrize("raw, expected", [
    ("{not json", "TF_CONFIG: not valid JSON"),
    ("[1, 2]", "TF_CONFIG: must be a JSON object"),
    ('{"task": {"type": "worker", "index": 0}}', 'TF_CONFIG: "cluster" is missing'),
    ('{"cluster": {"worker": ["a:1"]}}', 'TF_CONFIG: "task" is missing; add e.g. "task": {"type": "worker"'),
    ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 1}}',
     'TF_CONFIG: task "worker:1": task index out of range'),
    ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": "0"}}',
     'TF_CONFIG: task.index "0": must be a non-negative integer'),
    ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": -1}}', "task.index -1: must be >= 0"),
    ('{"cluster": {"worker": ["a:1"]}, "task": {"type": 3}}', "task.type 3: must be a string"),
    ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker"}}',
     'TF_CONFIG: task {\'type\': \'worker\'}: "index" is missing, e.g. {"type": "worker", "index": 0}'),
    ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "Worker"}}', 'task.type "Worker": unknown role'),
    ('{"cluster": {"worker": ["a:1"]}, "task": {"index": 0}}', 'task {\'index\': 0}: "type" is missing'),
    ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "idx": 0}}', 'task.idx "idx": unknown key'),
    ('{"cluster": {"worker": ["a:1"]}, "task": "worker:0"}', "task \"worker:0\": must be a mapping"),
    ('{"cluster": {"worker": ["a:99999"]}, "task": {"type": "worker"}}',
     'TF_CONFIG: cluster.worker[0] "a:99999": port must be 1-65535'),
    ('{"cluster": {}, "task": {"type": "worker"}}', "TF_CONFIG: cluster: the cluster is empty"),
    ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker"}, "extra": 1}',
     'TF_CONFIG: "extra": unknown key; valid keys of a TF_CONFIG document are cluster, task, environment'),
    ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}, "environment": ""}',
     'TF_CONFIG: environment "": must be a non-empty string'),
])
def test_malformed_tf_config(raw: str, expected: str) -> None:
    env = {"TF_CONFIG": raw}
    with pytest.raises(ClusterConfigError) as info:
        task_from_env(env)
    assert expected in str(info.value)
    assert env == {"TF_CONFIG": raw}


def test_from_file_yaml_json_and_tf_config_document(tmp_path) -> None:
    yml = tmp_path / "c.yaml"
    yml.write_text("worker:\n  - 'a:1'\n  - \"b:1\"\n")
    assert ClusterSpec.from_file(yml).roles == {"worker": ("a:1", "b:1")}
    js = tmp_path / "c.json"
    js.write_text(json.dumps({"cluster": TWO, "task": {"type": "worker", "index": 1}, "rpc_layer": "grpc"}))
    spec = ClusterSpec.from_file(str(js))
    assert spec.task == ("worker", 1) and spec.rpc_layer == "grpc" and spec.source == f"cluster file {js}"
    assert spec.tf_config("worker:0")["rpc_layer"] == "grpc"


@pytest.mark.parametrize("name, text, expected", [
    ("missing.yaml", None, "no such file; check the path"),
    ("bad.yaml", "worker: [a:1\n", "not valid YAML"),
    ("bad.json", '{"worker": ["a:1",]}', "not valid JSON: Expecting value at line 1"),
    ("dupe.json", '{"worker": ["a:1"], "worker": ["b:1"]}', "worker: key given twice; keep one"),
    ("dupe.yaml", "worker: ['a:1']\nworker: ['b:1']\n", "worker (line 2): key given twice; keep one"),
    ("listkey.yaml", "? [a]\n: b\n", "not a valid cluster description"),
    ("binary.yaml", b"\xff\xfe\x00", "cannot read it"),
    ("python.yaml", "worker: !!python/object:os.system ['a:1']\n", "not valid YAML"),
])
def test_from_file_errors_name_the_file(tmp_path, name: str, text: object, expected: str) -> None:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    elif text is not None:
        path.write_text(text)
    with pytest.raises(ClusterConfigError) as info:
        ClusterSpec.from_file(path)
    message = str(info.value)
    assert message.startswith(f"cluster file {path}: "), message
    assert expected in message
    assert "\n" not in message


def test_direct_construction_is_validated_too() -> None:
    spec = ClusterSpec((("worker", ("a:1",)),))
    assert spec.roles == {"worker": ("a:1",)}
    with pytest.raises(ClusterConfigError, match="port must be 1-65535"):
        ClusterSpec((("worker", ("a:0",)),))
    with pytest.raises(ClusterConfigError, match=r"cluster must be \(\(role"):
        ClusterSpec((1, 2))  # type: ignore[arg-type]


def test_tfjob_manifest() -> None:
    spec = ClusterSpec.from_dict({"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"], "ps": ["p:3333"],
                                  "evaluator": ["e:2222"]})
    manifest = tfjob_manifest(spec, name="mnist", image="tf:2.21", command=["python", "train.py"], namespace="ml")
    assert manifest["apiVersion"] == "kubeflow.org/v1" and manifest["kind"] == "TFJob"
    assert manifest["metadata"] == {"name": "mnist", "namespace": "ml"}
    replicas = manifest["spec"]["tfReplicaSpecs"]
    assert list(replicas) == ["Chief", "Worker", "PS", "Evaluator"]
    assert {k: v["replicas"] for k, v in replicas.items()} == {"Chief": 1, "Worker": 2, "PS": 1, "Evaluator": 1}
    assert all(v["restartPolicy"] == "OnFailure" for v in replicas.values())
    container = replicas["PS"]["template"]["spec"]["containers"][0]
    assert container == {"name": "tensorflow", "image": "tf:2.21", "command": ["python", "train.py"],
                         "ports": [{"containerPort": 3333, "name": "tfjob-port"}],
                         "env": [{"name": "TFACCEL_JOB_ID", "value": "mnist"}]}  # one job id for every replica
    no_cmd = tfjob_manifest(spec, name="x", image="i")
    assert "command" not in no_cmd["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    import yaml

    assert yaml.safe_load(tfjob_yaml(spec, name="mnist", image="tf:2.21")) == tfjob_manifest(
        spec, name="mnist", image="tf:2.21")


@pytest.mark.parametrize("kwargs, expected", [
    ({"name": "Bad_Name", "image": "i"}, "tfjob name 'Bad_Name': must be a DNS-1123 label"),
    ({"name": "a" * 64, "image": "i"}, "must be a DNS-1123 label"),
    ({"name": "ok", "image": ""}, "tfjob image '': must be a container image reference"),
    ({"name": "ok", "image": "a b"}, "without spaces"),
    ({"name": "ok", "image": "i", "restart_policy": "Sometimes"},
     "tfjob restart_policy 'Sometimes': valid values are OnFailure, Never, Always, ExitCode"),
])
def test_tfjob_manifest_errors(kwargs: dict, expected: str) -> None:
    with pytest.raises(ClusterConfigError) as info:
        tfjob_manifest(ClusterSpec.from_dict(TWO), **kwargs)
    assert expected in str(info.value)


def test_describe() -> None:
    assert ClusterSpec.from_dict(TWO).describe() == ("2 task(s): worker:0 10.0.0.2:2222, worker:1 10.0.0.3:2222; "
                                                     "strategy hint multi_worker")
