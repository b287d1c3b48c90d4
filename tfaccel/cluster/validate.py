"""Validation of a cluster description: role names, task names, the ``{role: [address, ...]}`` mapping and
the ``task`` part of a TF_CONFIG document. Everything here checks and normalises; nothing builds a spec.

This module never imports TensorFlow.
"""

import difflib
from typing import Any, Dict, Mapping, Sequence, Tuple, Union

from tfaccel.cluster.address import EXAMPLE, canonical_address, check_address
from tfaccel.cluster.errors import NOTHING, fail
from tfaccel.cluster.limits import MAX_DIGITS, show, shorten
from tfaccel.log import get_logger

__all__ = ["ROLES", "LEGACY_ROLES", "SINGLE_TASK_ROLES", "TF_CONFIG_KEYS", "TASK_KEYS", "STRATEGY_HINTS",
           "TaskLike", "parse_task", "unknown_role_hint", "validate_cluster", "validate_task_doc"]

# One source of truth for role names, in the order TF_CONFIG documents and listings use.
ROLES: Tuple[str, ...] = ("chief", "worker", "ps", "evaluator")
LEGACY_ROLES: Dict[str, str] = {"master": "chief"}  # TF 1.x name of the chief
SINGLE_TASK_ROLES: Tuple[str, ...] = ("chief", "evaluator")  # TF allows at most one task of these
TF_CONFIG_KEYS: Tuple[str, ...] = ("cluster", "task", "environment", "rpc_layer")
TASK_KEYS: Tuple[str, ...] = ("type", "index")
STRATEGY_HINTS: Tuple[str, ...] = ("local", "multi_worker", "parameter_server")

TaskLike = Union[str, Tuple[str, int], Sequence[Any]]


def _warn(message: str) -> None:
    get_logger().warning(message)


def parse_task(task: TaskLike, *, source: str = "", field: str = "task") -> Tuple[str, int]:
    """Parses ``"worker:1"``, ``("worker", 1)`` or ``"chief"`` (index 0) into ``(type, index)``.

    Only the syntax is checked here; :meth:`ClusterSpec.check_task` checks it against a cluster.

    Args:
        task: the task.
        source: what error messages name first (e.g. ``"cluster file x.yaml"``). Defaults to nothing.
        field: the name of the task in error messages. Defaults to ``"task"``.

    Returns:
        ``(task_type, task_index)`` with ``master`` mapped to ``chief``.

    Raises:
        ClusterConfigError: the task is not of one of these forms.

    Example:
        >>> parse_task("worker:1"), parse_task(("ps", 0)), parse_task("chief")
        (('worker', 1), ('ps', 0), ('chief', 0))
    """
    if isinstance(task, str):
        role, sep, index_text = task.partition(":")
        if not sep:
            index_text = "0"
        if not index_text.isdigit() or not index_text.isascii() or len(index_text) > MAX_DIGITS:
            fail(source, field, task, "must be \"role:index\" with a non-negative index, e.g. \"worker:1\"")
        index: Any = int(index_text)
    elif isinstance(task, (tuple, list)) and len(task) == 2:
        role, index = task[0], task[1]
        if not isinstance(role, str):
            fail(source, field, task, "task type must be a string, e.g. (\"worker\", 1)")
        if isinstance(index, bool) or not isinstance(index, int):
            fail(source, field, task, "task index must be an int, e.g. (\"worker\", 1)")
    else:
        return fail(source, field, task, "must be \"role:index\" (e.g. \"worker:1\") or a (role, index) pair")
    if role in LEGACY_ROLES:
        _warn(f"{source + ': ' if source else ''}{field} {show(task)}: {role!r} is the legacy name of "
              f"{LEGACY_ROLES[role]!r}; use {LEGACY_ROLES[role]!r}")
        role = LEGACY_ROLES[role]
    if role not in ROLES:
        fail(source, field, task, unknown_role_hint(role))
    if index < 0:
        fail(source, field, task, "task index must be >= 0")
    return role, index


def unknown_role_hint(role: Any) -> str:
    """What an error says about a role that is not one of ``ROLES``: the valid ones, and the likely fix."""
    msg = f"unknown role; valid roles are {', '.join(ROLES)}"
    if isinstance(role, str) and role.lower() in ROLES + tuple(LEGACY_ROLES):
        msg += f" (roles are lowercase: write {role.lower()!r})"
    elif isinstance(role, str):
        close = difflib.get_close_matches(role.lower(), ROLES, n=1, cutoff=0.6)
        if close:
            msg += f"; did you mean {close[0]!r}?"
    return msg


def validate_cluster(cluster: Any, source: str, prefix: str = "") -> Tuple[Tuple[str, Tuple[str, ...]], ...]:
    """Validates a ``{role: [address, ...]}`` mapping and returns it normalised, roles in ``ROLES`` order."""
    where = prefix.rstrip(".") or None
    if cluster is None or (isinstance(cluster, Mapping) and not cluster):
        fail(source, where, NOTHING, "the cluster is empty; list at least one role, e.g. "
             f"worker: [{EXAMPLE}]")
    if not isinstance(cluster, Mapping):
        fail(source, where, cluster, "must be a mapping of role -> list of \"host:port\", e.g. "
             f"{{\"worker\": [{EXAMPLE}]}}")
    roles: Dict[str, Tuple[str, ...]] = {}
    for key, value in cluster.items():
        if not isinstance(key, str):
            fail(source, f"{prefix}role", key, unknown_role_hint(key))
        role = key
        if key in LEGACY_ROLES:
            role = LEGACY_ROLES[key]
            if role in cluster:
                fail(source, f"{prefix}{key}", NOTHING, f"both {key!r} and {role!r} are given; "
                     f"{key!r} is the legacy name of {role!r}: keep only {role!r}")
            _warn(f"{source}: role {key!r} is the legacy name of {role!r}; rename it to {role!r}")
        elif key not in ROLES:
            fail(source, f"{prefix}role", key, unknown_role_hint(key))
        field = f"{prefix}{key}"
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            fail(source, field, value, f"must be a list of \"host:port\" strings, e.g. [{EXAMPLE}]")
        if len(value) == 0:
            fail(source, field, value, "is an empty list; list at least one \"host:port\" or remove the role")
        addresses = tuple(check_address(source, f"{field}[{i}]", item) for i, item in enumerate(value))
        if role in SINGLE_TASK_ROLES and len(addresses) > 1:
            fail(source, field, list(addresses), f"at most one {role} is allowed, got {len(addresses)}; "
                 f"make the others workers")
        roles[role] = addresses
    _check_unique(roles, source, prefix)
    if "ps" in roles and "worker" not in roles:
        fail(source, f"{prefix}ps", list(roles["ps"]), "parameter servers need at least one worker; "
             f"add worker: [{EXAMPLE}]")
    if "chief" not in roles and "worker" not in roles:
        fail(source, where, {r: list(a) for r, a in roles.items()},
             f"needs at least one chief or worker; add worker: [{EXAMPLE}]")
    return tuple((role, roles[role]) for role in ROLES if role in roles)


def _check_unique(roles: Mapping[str, Tuple[str, ...]], source: str, prefix: str) -> None:
    """No two tasks at the same address, however it is written (one pass: a dict of canonical forms)."""
    seen: Dict[str, Tuple[str, str]] = {}
    for role in ROLES:
        for index, address in enumerate(roles.get(role, ())):
            name = f"{prefix}{role}[{index}]"
            key = canonical_address(address)
            if key in seen:
                other, written = seen[key]
                same = "" if written == address else f" ({show(written)}: the same host and port)"
                fail(source, name, address, f"duplicate address, already used by {other}{same}; "
                     "every task needs its own host:port")
            seen[key] = (name, address)


def validate_task_doc(task: Any, source: str) -> Tuple[str, int]:
    """Checks the ``task`` part of a TF_CONFIG document (``{"type": ..., "index": ...}``) and returns
    ``(type, index)``, ``master`` read as ``chief``; an error names ``source`` and the field."""
    if not isinstance(task, Mapping):
        fail(source, "task", task, "must be a mapping like {\"type\": \"worker\", \"index\": 0}")
    for key in task:
        if key not in TASK_KEYS:
            fail(source, f"task.{shorten(key, 80)}" if isinstance(key, str) else "task", key,
                 f"unknown key; valid keys are {', '.join(TASK_KEYS)}")
    if "type" not in task:
        fail(source, "task", dict(task), "\"type\" is missing, e.g. {\"type\": \"worker\", \"index\": 0}")
    task_type = task["type"]
    if not isinstance(task_type, str):
        fail(source, "task.type", task_type, f"must be a string, one of {', '.join(ROLES)}")
    if task_type in LEGACY_ROLES:
        _warn(f"{source}: task.type {task_type!r} is the legacy name of {LEGACY_ROLES[task_type]!r}; "
              f"use {LEGACY_ROLES[task_type]!r}")
        task_type = LEGACY_ROLES[task_type]
    if task_type not in ROLES:
        fail(source, "task.type", task_type, unknown_role_hint(task_type))
    if "index" not in task:
        # TensorFlow's resolver reports task_id None then, and strategies fail later with obscure errors.
        fail(source, "task", dict(task), "\"index\" is missing, e.g. {\"type\": \"worker\", \"index\": 0}")
    index = task["index"]
    if isinstance(index, bool) or not isinstance(index, int):
        fail(source, "task.index", index, "must be a non-negative integer, e.g. 0")
    if index < 0:
        fail(source, "task.index", index, "must be >= 0")
    return task_type, index
