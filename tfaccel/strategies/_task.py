"""This process's cluster task (through ``tfaccel.cluster``) and how strategies number its tasks."""

from typing import Any, Dict, Mapping, Optional, Tuple

from tfaccel.cluster import task_from_env


def current_task(environ: Optional[Mapping[str, str]] = None) -> Optional[Any]:
    """Returns ``tfaccel.cluster.task_from_env(environ)`` (a ``TaskInfo``), or None outside a cluster."""
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
