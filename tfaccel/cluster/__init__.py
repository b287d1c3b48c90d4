"""Cluster descriptions <-> TF_CONFIG, readers for TF_CONFIG / SLURM / Kubernetes, TFJob export.

Example:
    >>> from tfaccel.cluster import ClusterSpec
    >>> spec = ClusterSpec.from_hosts(workers=["10.0.0.2:2222", "10.0.0.3:2222"])
    >>> spec.tasks()
    [('worker', 0), ('worker', 1)]

Importing this package does not import TensorFlow.
"""

from tfaccel.cluster.env import slurm_task, task_from_env, task_from_tf_config
from tfaccel.cluster.errors import ClusterConfigError
from tfaccel.cluster.slurm import expand_nodelist, parse_tasks_per_node
from tfaccel.cluster.spec import ClusterSpec
from tfaccel.cluster.task import TaskInfo
from tfaccel.cluster.validate import ROLES, parse_task
from tfaccel.cluster.tfjob import tfjob_manifest, tfjob_yaml

__all__ = ["ClusterSpec", "TaskInfo", "ClusterConfigError", "ROLES", "task_from_env", "task_from_tf_config",
           "slurm_task", "expand_nodelist", "parse_tasks_per_node", "parse_task", "tfjob_manifest", "tfjob_yaml"]
