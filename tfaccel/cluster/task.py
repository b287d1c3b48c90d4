"""This process's place in a cluster: a ``TaskInfo`` (its spec, role and index)."""

import dataclasses
from typing import Any, Dict, Optional, Tuple

from tfaccel.cluster.described import EnvCluster, Fact
from tfaccel.cluster.spec import ClusterSpec, env_cluster_task

__all__ = ["TaskInfo"]


@dataclasses.dataclass(frozen=True)
class TaskInfo:
    """This process's place in a cluster.

    Attributes:
        spec: the whole cluster.
        task_type: ``"chief"``, ``"worker"``, ``"ps"`` or ``"evaluator"``.
        task_index: the index within the role.
        environment: TF_CONFIG ``environment`` (``"cloud"`` under Kubeflow TFJob), or None.
        source: where the cluster came from: ``"TF_CONFIG"``, ``"SLURM"``, ``"Indexed Job"``, ``"JobSet"``,
            ``"TrainJob"``, ``"Vertex AI"`` or ``"SageMaker"`` (``tfaccel.cluster.sources.SOURCES``).
        facts: what the source read, and from which variable or label.
    """

    spec: ClusterSpec
    task_type: str
    task_index: int
    environment: Optional[str] = None
    source: str = "TF_CONFIG"
    facts: Tuple[Fact, ...] = dataclasses.field(default=(), compare=False)  # provenance, not identity

    def __post_init__(self) -> None:
        self.spec.check_task((self.task_type, self.task_index))

    @classmethod
    def from_env_cluster(cls, found: EnvCluster) -> "TaskInfo":
        """Validates a cluster read from the environment into this process's task.

        Args:
            found: what ``tfaccel.cluster.described`` read from the environment.

        Returns:
            The task, its ``source`` and ``facts`` those of ``found``.

        Raises:
            ClusterConfigError: the cluster is invalid, or a TF_CONFIG names no task or one not in the cluster.
        """
        spec, task = env_cluster_task(found)
        return cls(spec, task[0], task[1], environment=spec.environment, source=found.origin,
                   facts=tuple(found.facts))

    @property
    def name(self) -> str:
        """``"worker:1"``."""
        return f"{self.task_type}:{self.task_index}"

    @property
    def is_chief(self) -> bool:
        """The chief, or worker 0 when the cluster has no chief."""
        if self.task_type == "chief":
            return True
        return self.task_type == "worker" and self.task_index == 0 and "chief" not in self.spec.roles

    @property
    def num_tasks(self) -> int:
        """Number of tasks in the cluster, every role counted."""
        return self.spec.num_tasks

    @property
    def address(self) -> str:
        """This task's ``"host:port"``."""
        return self.spec.roles[self.task_type][self.task_index]

    def describe_source(self) -> str:
        """``"JobSet (jobset x from TFACCEL_JOBSET_NAME (label ...); ...)"``: where this task came from."""
        if not self.facts:
            return self.source
        return f"{self.source} ({'; '.join(f'{f.what} {f.value} from {f.origin}' for f in self.facts)})"

    def tf_config(self) -> Dict[str, Any]:
        """The TF_CONFIG dict of this task."""
        return self.spec.tf_config((self.task_type, self.task_index), environment=self.environment)
