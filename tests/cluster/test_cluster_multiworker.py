"""Real processes: TF_CONFIGs written by ClusterSpec.export start a 2-worker MultiWorkerMirroredStrategy."""

import json

import harness
import pytest

from tfaccel.cluster import ClusterSpec

# Each child exports its own TF_CONFIG from the description (the only writer), then builds the strategy
# (which reads TF_CONFIG at construction, tensorflow#31154) and runs one all-reduce across both workers.
CHILD = r"""
import json, os, sys
assert "TF_CONFIG" not in os.environ, "the harness must not set TF_CONFIG here"
from tfaccel.cluster import ClusterSpec, task_from_env
spec = ClusterSpec.from_dict(json.loads(os.environ["TEST_CLUSTER"]))
spec.export(os.environ["TEST_TASK"])
info = task_from_env()
import tensorflow as tf
strategy = tf.distribute.MultiWorkerMirroredStrategy()
resolver = strategy.cluster_resolver
value = strategy.run(lambda: tf.constant(float(info.task_index + 1)))
total = strategy.reduce("SUM", value, axis=None)
print(json.dumps({"task": info.name, "is_chief": info.is_chief, "replicas": strategy.num_replicas_in_sync,
                  "resolver_task": [resolver.task_type, resolver.task_id],
                  "cluster": resolver.cluster_spec().as_dict(), "sum": float(total.numpy())}))
sys.stdout.flush()
"""


@pytest.mark.slow
def test_two_workers_start_from_exported_tf_configs(clean_tf_config: None) -> None:
    spec = ClusterSpec.from_dict(harness.loopback_cluster(2))
    tasks = [(role, index, None) for role, index in spec.tasks()]
    per_task = {f"{r}:{i}": {"TEST_TASK": f"{r}:{i}"} for r, i in spec.tasks()}
    results = harness.run_tasks(CHILD, tasks=tasks, timeout=150,
                                env={"TEST_CLUSTER": json.dumps({r: list(a) for r, a in spec.roles.items()})},
                                per_task_env=per_task)
    harness.assert_all_ok(results)
    reports = [harness.last_json_line(r.stdout) for r in results]
    assert [r["task"] for r in reports] == ["worker:0", "worker:1"]
    assert [r["is_chief"] for r in reports] == [True, False]
    for index, report in enumerate(reports):
        assert report["replicas"] == 2
        assert report["resolver_task"] == ["worker", index]
        assert report["cluster"] == {"worker": list(spec.roles["worker"])}
        assert report["sum"] == 3.0  # 1 + 2: the all-reduce really crossed both processes


@pytest.mark.slow
def test_harness_tasks_built_from_spec_tf_config(clean_tf_config: None) -> None:
    """The other way in: the launcher-style path passes spec.tf_config(task) as the child's TF_CONFIG."""
    spec = ClusterSpec.from_dict(harness.loopback_cluster(2))
    tasks = [(r, i, json.dumps(spec.tf_config((r, i)))) for r, i in spec.tasks()]
    program = ("import json, tensorflow as tf\n"
               "s = tf.distribute.MultiWorkerMirroredStrategy()\n"
               "print(json.dumps({'replicas': s.num_replicas_in_sync}))\n")
    results = harness.run_tasks(program, tasks=tasks, timeout=150)
    harness.assert_all_ok(results)
    assert [harness.last_json_line(r.stdout)["replicas"] for r in results] == [2, 2]
