"""Fixtures of the Ray tests: one real two-node Ray cluster on 127.0.0.1 for the module that asks for it."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `import ray_util`

import ray_util  # noqa: E402


@pytest.fixture(scope="module")
def ray_cluster():
    """`ray start --head` (1 CPU) and a second node joined to it (1 CPU), both on 127.0.0.1; every process of
    the cluster is stopped afterwards and none may survive."""
    cluster = ray_util.RayCluster(head_cpus=1, extra_nodes=1, node_cpus=1)
    try:
        yield cluster
    finally:
        forced = cluster.stop()
        assert not ray_util.marked_pids(cluster.mark), "Ray processes survived the cluster's stop"
        assert not forced, f"processes of the Ray cluster had to be SIGKILLed after `ray start` was stopped: {forced}"
