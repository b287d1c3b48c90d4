"""Property tests: malformed descriptions / TF_CONFIGs always give a tfaccel ValueError and write nothing;
valid ones round-trip through TensorFlow's own TFConfigClusterResolver."""

import json
import os
from typing import Any, Dict, List, Tuple
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfaccel.cluster import ROLES, ClusterConfigError, ClusterSpec, task_from_env
from tfaccel.errors import TfaccelError

SETTINGS = dict(deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

_label = st.from_regex(r"[a-z][a-z0-9-]{0,8}[a-z0-9]", fullmatch=True)
_hostname = st.lists(_label, min_size=1, max_size=3).map(".".join)
_ipv4 = st.tuples(*[st.integers(0, 255)] * 4).map(lambda t: ".".join(map(str, t)))
_host = st.one_of(_hostname, _ipv4, st.just("localhost"), st.just("[::1]"), st.just("[fe80::2]"))
_port = st.integers(1, 65535)
_address = st.builds(lambda h, p: f"{h}:{p}", _host, _port)


@st.composite
def valid_clusters(draw: Any) -> Dict[str, List[str]]:
    """A valid cluster: optional chief, 0-4 workers (>= 1 with ps or without chief), 0-3 ps, optional evaluator."""
    chief = draw(st.booleans())
    ps = draw(st.integers(0, 3))
    workers = draw(st.integers(0 if chief and not ps else 1, 4))
    evaluator = draw(st.booleans())
    total = int(chief) + workers + ps + int(evaluator)
    addresses = iter(draw(st.lists(_address, min_size=total, max_size=total, unique=True)))
    cluster: Dict[str, List[str]] = {}
    for role, count in (("chief", int(chief)), ("worker", workers), ("ps", ps), ("evaluator", int(evaluator))):
        if count:
            cluster[role] = [next(addresses) for _ in range(count)]
    # roles in any order: the description is a mapping
    keys = draw(st.permutations(list(cluster)))
    return {k: cluster[k] for k in keys}


def _all_slots(cluster: Dict[str, List[str]]) -> List[Tuple[str, int]]:
    return [(role, i) for role, addrs in cluster.items() for i in range(len(addrs))]


_bad_value = st.one_of(st.integers(), st.booleans(), st.none(), st.floats(allow_nan=False),
                       st.lists(st.just("a:1"), max_size=2), st.dictionaries(st.just("h"), st.just("a:1")))
_bad_port_text = st.one_of(st.integers(65536, 10 ** 7).map(str), st.just("0"), st.just("-1"), st.just("22a"),
                           st.just(""), st.just("http"), st.just("1e3"), st.just("٣"))
_unknown_role = st.text(min_size=0, max_size=12).filter(lambda s: s not in ROLES and s != "master")


@st.composite
def malformed_clusters(draw: Any) -> Tuple[str, Any]:
    """(mutation name, a description that must be rejected), built by breaking one thing in a valid one."""
    cluster = {k: list(v) for k, v in draw(valid_clusters()).items()}
    slots = _all_slots(cluster)
    role, index = draw(st.sampled_from(slots))
    kind = draw(st.sampled_from(["bad_port", "missing_port", "empty_host", "duplicate", "two_chiefs",
                                 "two_evaluators", "unknown_role", "non_string", "empty_cluster", "ps_no_worker",
                                 "role_not_list", "empty_role", "whitespace", "not_a_mapping", "legacy_clash",
                                 "protocol", "bad_host"]))
    host = cluster[role][index].rpartition(":")[0]
    if kind == "bad_port":
        cluster[role][index] = f"{host}:{draw(_bad_port_text)}"
    elif kind == "missing_port":
        cluster[role][index] = draw(st.sampled_from(["node", "10.0.0.1", "[::1]"]))
    elif kind == "empty_host":
        cluster[role][index] = f":{draw(_port)}"
    elif kind == "duplicate":
        other = draw(st.sampled_from(list(cluster)))
        cluster[other] = cluster[other] + [cluster[role][index]]
    elif kind == "two_chiefs":
        cluster["chief"] = ["chief-a:1", "chief-b:1"]
    elif kind == "two_evaluators":
        cluster["evaluator"] = ["eval-a:1", "eval-b:1"]
    elif kind == "unknown_role":
        cluster[draw(_unknown_role)] = ["x-unknown:1"]
    elif kind == "non_string":
        cluster[role][index] = draw(_bad_value)
    elif kind == "empty_cluster":
        return kind, draw(st.sampled_from([{}, None]))
    elif kind == "ps_no_worker":
        cluster.pop("worker", None)
        cluster.setdefault("ps", ["ps-only:1"])
    elif kind == "role_not_list":
        cluster[role] = draw(st.one_of(st.just(cluster[role][0]), st.integers(), st.none(), st.booleans()))
    elif kind == "empty_role":
        cluster[role] = []
    elif kind == "whitespace":
        cluster[role][index] = draw(st.sampled_from([" ", "\t", "\n"])) + cluster[role][index]
    elif kind == "not_a_mapping":
        return kind, draw(st.one_of(st.lists(_address, max_size=3), st.text(max_size=10), st.integers()))
    elif kind == "legacy_clash":
        cluster["chief"] = ["c-new:1"]
        cluster["master"] = ["c-old:1"]
    elif kind == "protocol":
        cluster[role][index] = "grpc://" + cluster[role][index]
    elif kind == "bad_host":
        cluster[role][index] = draw(st.sampled_from(["a/b", "a..b", "-x", "x y", "[zz]", "a:b"])) + ":2222"
    return kind, cluster


@st.composite
def malformed_tf_configs(draw: Any) -> Tuple[str, str]:
    """(mutation name, a TF_CONFIG string that must be rejected)."""
    cluster = draw(valid_clusters())
    role, index = draw(st.sampled_from(_all_slots(cluster)))
    doc: Dict[str, Any] = {"cluster": cluster, "task": {"type": role, "index": index}}
    kind = draw(st.sampled_from(["bad_cluster", "index_out_of_range", "role_not_in_cluster", "unknown_task_type",
                                 "index_not_int", "negative_index", "task_missing", "type_missing", "index_missing",
                                 "unknown_top_key", "unknown_task_key", "not_json", "not_object", "cluster_missing",
                                 "task_not_mapping", "bad_environment"]))
    if kind == "bad_cluster":
        _, doc["cluster"] = draw(malformed_clusters())
    elif kind == "index_out_of_range":
        doc["task"]["index"] = len(cluster[role]) + draw(st.integers(0, 5))
    elif kind == "role_not_in_cluster":
        missing = [r for r in ROLES if r not in cluster]
        if not missing:
            doc["task"]["index"] = 99
        else:
            doc["task"]["type"] = draw(st.sampled_from(missing))
    elif kind == "unknown_task_type":
        doc["task"]["type"] = draw(_unknown_role)
    elif kind == "index_not_int":
        doc["task"]["index"] = draw(st.one_of(st.text(max_size=3), st.floats(), st.booleans(), st.none(),
                                              st.lists(st.integers(), max_size=2)))
    elif kind == "negative_index":
        doc["task"]["index"] = draw(st.integers(max_value=-1))
    elif kind == "task_missing":
        del doc["task"]
    elif kind == "type_missing":
        del doc["task"]["type"]
    elif kind == "index_missing":
        del doc["task"]["index"]
    elif kind == "unknown_top_key":
        doc[draw(st.text(max_size=10).filter(lambda k: k not in ("cluster", "task", "environment", "rpc_layer")))] = 1
    elif kind == "unknown_task_key":
        doc["task"][draw(st.text(max_size=8).filter(lambda k: k not in ("type", "index")))] = 0
    elif kind == "not_json":
        return kind, json.dumps(doc)[: draw(st.integers(1, 20))] + draw(st.sampled_from(["{", "'", ",", "]"]))
    elif kind == "not_object":
        return kind, json.dumps(draw(st.one_of(st.lists(st.integers(), min_size=1, max_size=3), st.integers(),
                                               st.text(min_size=1, max_size=5))))
    elif kind == "cluster_missing":
        del doc["cluster"]
    elif kind == "task_not_mapping":
        doc["task"] = f"{role}:{index}"
    elif kind == "bad_environment":
        doc["environment"] = draw(st.one_of(st.just(""), st.integers(), st.booleans(), st.lists(st.just("x"))))
    return kind, json.dumps(doc)


def test_at_least_200_malformed_descriptions_are_rejected_and_nothing_is_written() -> None:
    seen: List[str] = []
    before = os.environ.get("TF_CONFIG")

    @settings(max_examples=260, **SETTINGS)
    @given(malformed_clusters())
    def check(case: Tuple[str, Any]) -> None:
        kind, description = case
        env = {"KEEP": "1"}
        try:
            ClusterSpec.from_dict(description).export("worker:0", env)
        except ClusterConfigError as exc:
            assert isinstance(exc, ValueError) and isinstance(exc, TfaccelError)
            assert str(exc).startswith("cluster description: ") and "\n" not in str(exc).strip()
        else:
            raise AssertionError(f"{kind}: accepted {description!r}")
        assert env == {"KEEP": "1"}
        seen.append(kind)

    check()
    assert len(seen) >= 200
    assert len(set(seen)) >= 15, sorted(set(seen))
    assert os.environ.get("TF_CONFIG") == before


def test_at_least_200_malformed_tf_configs_are_rejected_and_nothing_is_written() -> None:
    seen: List[str] = []
    before = os.environ.get("TF_CONFIG")

    @settings(max_examples=260, **SETTINGS)
    @given(malformed_tf_configs())
    def check(case: Tuple[str, str]) -> None:
        kind, raw = case
        env = {"TF_CONFIG": raw}
        try:
            info = task_from_env(env)
            if info is not None:
                info.spec.export(info.name, env)
        except ClusterConfigError as exc:
            assert isinstance(exc, ValueError)
            assert str(exc).startswith("TF_CONFIG: ")
        else:
            raise AssertionError(f"{kind}: accepted {raw!r}")
        assert env == {"TF_CONFIG": raw}
        seen.append(kind)

    check()
    assert len(seen) >= 200
    assert len(set(seen)) >= 14, sorted(set(seen))
    assert os.environ.get("TF_CONFIG") == before


def test_valid_descriptions_round_trip_through_tf_config_cluster_resolver() -> None:
    import tensorflow as tf

    seen: List[int] = []

    @settings(max_examples=150, **SETTINGS)
    @given(valid_clusters(), st.data())
    def check(cluster: Dict[str, List[str]], data: Any) -> None:
        spec = ClusterSpec.from_dict(cluster)
        role, index = data.draw(st.sampled_from(spec.tasks()))
        task = data.draw(st.sampled_from([f"{role}:{index}", (role, index)]))
        env: Dict[str, str] = {}
        doc = spec.export(task, env)
        assert json.loads(env["TF_CONFIG"]) == doc
        with mock.patch.dict(os.environ, {"TF_CONFIG": env["TF_CONFIG"]}):
            resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
            assert resolver.task_type == role
            assert resolver.task_id == index
            assert resolver.cluster_spec().as_dict() == {r: list(a) for r, a in cluster.items()}
            assert resolver.cluster_spec().task_address(role, index) == cluster[role][index]
        # and back through tfaccel's own reader
        info = task_from_env(env)
        assert info is not None and info.spec == spec and (info.task_type, info.task_index) == (role, index)
        assert ClusterSpec.from_dict(doc).task == (role, index)
        seen.append(1)

    check()
    assert len(seen) >= 100
