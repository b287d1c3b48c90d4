"""This process's cluster task, through ``tfaccel.cluster`` (with a minimal stand-in until that lands)."""

import dataclasses
import json
import os
from typing import Any, Dict, Mapping, Optional, Tuple

from tfaccel.errors import ConfigError


def current_task(environ: Optional[Mapping[str, str]] = None) -> Optional[Any]:
    """Returns ``tfaccel.cluster.task_from_env(environ)`` (a ``TaskInfo``), or None outside a cluster."""
    try:
        from tfaccel.cluster import task_from_env
    except ImportError:
        return _fallback_task(os.environ if environ is None else environ)
    return task_from_env(environ)


def training_roles(task: Any) -> Dict[str, Tuple[str, ...]]:
    """The roles of the task's cluster that take part in training (the evaluator runs on its own)."""
    return {role: tuple(addrs) for role, addrs in task.spec.roles.items() if role != "evaluator" and addrs}


def worker_position(task: Any) -> Tuple[int, int]:
    """(number of chief + worker tasks, this task's position among them, chief first), as MWMS numbers them."""
    roles = training_roles(task)
    chiefs = len(roles.get("chief", ()))
    total = chiefs + len(roles.get("worker", ()))
    if task.task_type == "chief":
        return total, task.task_index
    return total, chiefs + task.task_index


@dataclasses.dataclass(frozen=True)
class _Spec:
    roles: Dict[str, Tuple[str, ...]]


@dataclasses.dataclass(frozen=True)
class _Task:
    spec: _Spec
    task_type: str
    task_index: int
    environment: Optional[str] = None
    source: str = "TF_CONFIG"

    @property
    def name(self) -> str:
        return f"{self.task_type}:{self.task_index}"

    @property
    def is_chief(self) -> bool:
        if self.task_type == "chief":
            return True
        return self.task_type == "worker" and self.task_index == 0 and "chief" not in self.spec.roles

    @property
    def num_tasks(self) -> int:
        return sum(len(v) for v in self.spec.roles.values())


def _fallback_task(environ: Mapping[str, str]) -> Optional[Any]:
    # Temporary: only used while tfaccel.cluster is not importable; it validates nothing beyond the shape.
    raw = environ.get("TF_CONFIG")
    if not raw:
        return None
    try:
        doc = json.loads(raw)
        cluster = {str(k): tuple(v) for k, v in (doc.get("cluster") or {}).items()}
        task = doc.get("task") or {}
        if not cluster:
            return None
        return _Task(_Spec(cluster), str(task["type"]), int(task.get("index", 0)), doc.get("environment"))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ConfigError(f"TF_CONFIG: cannot read it ({exc}); received {raw[:200]!r}") from exc
