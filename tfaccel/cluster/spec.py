"""Cluster descriptions: a validated, frozen ``ClusterSpec`` and the exact TF_CONFIG of each of its tasks.

A cluster description is a mapping whose keys are roles (``chief``, ``worker``, ``ps``, ``evaluator``),
each a list of ``"host:port"`` strings -- the ``cluster`` part of TF_CONFIG. A whole TF_CONFIG document
(``{"cluster": {...}, "task": {...}}``) is accepted too. Everything is checked when the spec is built, so
a spec that exists is valid, and :meth:`ClusterSpec.export` (the only writer of ``TF_CONFIG`` in tfaccel)
never writes a half-valid value.

This module never imports TensorFlow: ``tfaccel tf-config`` must stay fast.
"""

import dataclasses
import difflib
import ipaddress
import json
import os
import re
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, MutableMapping, NoReturn, Optional, Sequence, Tuple, Union

from tfaccel.cluster.described import EnvCluster, read_env
from tfaccel.cluster.errors import ClusterConfigError
from tfaccel.cluster.limits import MAX_BYTES, MAX_DIGITS, loads_json, nesting_problem, read_bounded, show, shorten
from tfaccel.log import get_logger

__all__ = ["ClusterSpec", "TaskInfo", "ROLES", "TaskLike", "parse_task", "canonical_address",
           "MAX_YAML_VALUES"]

# One source of truth for role names, in the order TF_CONFIG documents and listings use.
ROLES: Tuple[str, ...] = ("chief", "worker", "ps", "evaluator")
LEGACY_ROLES: Dict[str, str] = {"master": "chief"}  # TF 1.x name of the chief
SINGLE_TASK_ROLES: Tuple[str, ...] = ("chief", "evaluator")  # TF allows at most one task of these
TF_CONFIG_KEYS: Tuple[str, ...] = ("cluster", "task", "environment", "rpc_layer")
TASK_KEYS: Tuple[str, ...] = ("type", "index")
STRATEGY_HINTS: Tuple[str, ...] = ("local", "multi_worker", "parameter_server")

TaskLike = Union[str, Tuple[str, int], Sequence[Any]]

_HOST_RE = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.\-]*[A-Za-z0-9_])?$")
_EXAMPLE = '"10.0.0.2:2222"'
MAX_YAML_VALUES = 60_000  # a YAML cluster file of 30,000 hosts, one a line, reads in ~0.5 s; JSON has no such bound


def _err(source: str, field: Optional[str], received: Any, problem: str) -> ClusterConfigError:
    """Builds the standard message: ``<source>: <field> <received>: <problem>``."""
    parts = []
    if field:
        parts.append(field)
    if received is not _NOTHING:
        parts.append(show(received))
    head = ": ".join(p for p in (source, " ".join(parts)) if p)
    return ClusterConfigError(f"{head}: {problem}")


_NOTHING = object()


def _warn(message: str) -> None:
    get_logger().warning(message)


# ----------------------------------------------------------------------------------------------------------
# Addresses
# ----------------------------------------------------------------------------------------------------------

def split_address(address: str) -> Tuple[str, int]:
    """Splits a validated ``"host:port"`` (IPv6 hosts in brackets: ``"[::1]:2222"``) into host and port."""
    host, _, port = address.rpartition(":")
    return host, int(port)


def _check_address(source: str, field: str, value: Any) -> str:
    if not isinstance(value, str):
        kind = type(value).__name__
        hint = (" (YAML reads off/on/yes/no as booleans and bare numbers as numbers)"
                if isinstance(value, (bool, int, float)) else "")
        return _raise(source, field, value, f"must be a \"host:port\" string, got {kind}{hint}; quote it, "
                      f"e.g. {_EXAMPLE}")
    if value != value.strip() or any(ch.isspace() for ch in value):
        _raise(source, field, value, f"contains whitespace; write it as \"host:port\", e.g. {_EXAMPLE}")
    if "://" in value:
        _raise(source, field, value, f"must not carry a protocol; write only \"host:port\", e.g. {_EXAMPLE}")
    if ":" not in value:
        _raise(source, field, value, f"port is missing; write it as \"host:port\", e.g. {_EXAMPLE}")
    host, _, port = value.rpartition(":")
    if not port:
        _raise(source, field, value, f"port is missing; write it as \"host:port\", e.g. {_EXAMPLE}")
    if not port.isdigit() or not port.isascii():
        _raise(source, field, value, f"port must be a number 1-65535, got {shorten(port, 40)!r}; e.g. {_EXAMPLE}")
    if len(port) > MAX_DIGITS or not 1 <= int(port) <= 65535:
        _raise(source, field, value, "port must be 1-65535")
    if str(int(port)) != port:
        _raise(source, field, value, f"port has leading zeros; write {host}:{int(port)}")
    if not host:
        _raise(source, field, value, f"host is empty; write it as \"host:port\", e.g. {_EXAMPLE}")
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            _raise(source, field, value, "host in brackets must be an IPv6 address, e.g. \"[::1]:2222\"")
    elif ":" in host:
        _raise(source, field, value, "an IPv6 host must be written in brackets, e.g. \"[::1]:2222\"")
    elif len(host) > 253:
        _raise(source, field, value, f"host is {len(host)} characters long; a host name has at most 253")
    elif not _HOST_RE.match(host) or ".." in host:
        _raise(source, field, value, "host must be a hostname or IP address (letters, digits, '.', '-', '_')")
    return value


def _raise(source: str, field: Optional[str], received: Any, problem: str) -> NoReturn:
    raise _err(source, field, received, problem)


# ----------------------------------------------------------------------------------------------------------
# Tasks
# ----------------------------------------------------------------------------------------------------------

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
            _raise(source, field, task, "must be \"role:index\" with a non-negative index, e.g. \"worker:1\"")
        index: Any = int(index_text)
    elif isinstance(task, (tuple, list)) and len(task) == 2:
        role, index = task[0], task[1]
        if not isinstance(role, str):
            _raise(source, field, task, "task type must be a string, e.g. (\"worker\", 1)")
        if isinstance(index, bool) or not isinstance(index, int):
            _raise(source, field, task, "task index must be an int, e.g. (\"worker\", 1)")
    else:
        return _raise(source, field, task, "must be \"role:index\" (e.g. \"worker:1\") or a (role, index) pair")
    if role in LEGACY_ROLES:
        _warn(f"{source + ': ' if source else ''}{field} {show(task)}: {role!r} is the legacy name of "
              f"{LEGACY_ROLES[role]!r}; use {LEGACY_ROLES[role]!r}")
        role = LEGACY_ROLES[role]
    if role not in ROLES:
        _raise(source, field, task, _unknown_role_hint(role))
    if index < 0:
        _raise(source, field, task, "task index must be >= 0")
    return role, index


def _unknown_role_hint(role: Any) -> str:
    msg = f"unknown role; valid roles are {', '.join(ROLES)}"
    if isinstance(role, str) and role.lower() in ROLES + tuple(LEGACY_ROLES):
        msg += f" (roles are lowercase: write {role.lower()!r})"
    elif isinstance(role, str):
        close = difflib.get_close_matches(role.lower(), ROLES, n=1, cutoff=0.6)
        if close:
            msg += f"; did you mean {close[0]!r}?"
    return msg


# ----------------------------------------------------------------------------------------------------------
# Validation of a cluster mapping
# ----------------------------------------------------------------------------------------------------------

def _validate_cluster(cluster: Any, source: str, prefix: str = "") -> Tuple[Tuple[str, Tuple[str, ...]], ...]:
    """Validates a ``{role: [address, ...]}`` mapping and returns it normalised, roles in ``ROLES`` order."""
    where = prefix.rstrip(".") or None
    if cluster is None or (isinstance(cluster, Mapping) and not cluster):
        _raise(source, where, _NOTHING, "the cluster is empty; list at least one role, e.g. "
               f"worker: [{_EXAMPLE}]")
    if not isinstance(cluster, Mapping):
        _raise(source, where, cluster, "must be a mapping of role -> list of \"host:port\", e.g. "
               f"{{\"worker\": [{_EXAMPLE}]}}")
    roles: Dict[str, Tuple[str, ...]] = {}
    for key, value in cluster.items():
        if not isinstance(key, str):
            _raise(source, f"{prefix}role", key, _unknown_role_hint(key))
        role = key
        if key in LEGACY_ROLES:
            role = LEGACY_ROLES[key]
            if role in cluster:
                _raise(source, f"{prefix}{key}", _NOTHING, f"both {key!r} and {role!r} are given; "
                       f"{key!r} is the legacy name of {role!r}: keep only {role!r}")
            _warn(f"{source}: role {key!r} is the legacy name of {role!r}; rename it to {role!r}")
        elif key not in ROLES:
            _raise(source, f"{prefix}role", key, _unknown_role_hint(key))
        field = f"{prefix}{key}"
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            _raise(source, field, value, f"must be a list of \"host:port\" strings, e.g. [{_EXAMPLE}]")
        if len(value) == 0:
            _raise(source, field, value, "is an empty list; list at least one \"host:port\" or remove the role")
        addresses = tuple(_check_address(source, f"{field}[{i}]", item) for i, item in enumerate(value))
        if role in SINGLE_TASK_ROLES and len(addresses) > 1:
            _raise(source, field, list(addresses), f"at most one {role} is allowed, got {len(addresses)}; "
                   f"make the others workers")
        roles[role] = addresses
    _check_unique(roles, source, prefix)
    if "ps" in roles and "worker" not in roles:
        _raise(source, f"{prefix}ps", list(roles["ps"]), "parameter servers need at least one worker; "
               f"add worker: [{_EXAMPLE}]")
    if "chief" not in roles and "worker" not in roles:
        _raise(source, where, {r: list(a) for r, a in roles.items()},
               f"needs at least one chief or worker; add worker: [{_EXAMPLE}]")
    return tuple((role, roles[role]) for role in ROLES if role in roles)


def canonical_address(address: str) -> str:
    """The form two equivalent addresses share: host names lowercased, ``localhost`` = ``127.0.0.1``, IPv6
    compressed (``[0:0::1]`` = ``[::1]``, an IPv4-mapped one as its IPv4 address). ``address`` is valid.

    Example:
        >>> canonical_address("LocalHost:2222"), canonical_address("[0:0::1]:2222")
        ('127.0.0.1:2222', '[::1]:2222')
    """
    host, port = split_address(address)
    if host.startswith("["):
        ip = ipaddress.IPv6Address(host[1:-1])
        host = str(ip.ipv4_mapped) if ip.ipv4_mapped is not None else f"[{ip.compressed}]"
    else:
        host = host.lower()
        if host == "localhost":
            host = "127.0.0.1"
    return f"{host}:{port}"


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
                _raise(source, name, address, f"duplicate address, already used by {other}{same}; "
                       "every task needs its own host:port")
            seen[key] = (name, address)


def _validate_task_doc(task: Any, source: str) -> Tuple[str, int]:
    if not isinstance(task, Mapping):
        _raise(source, "task", task, "must be a mapping like {\"type\": \"worker\", \"index\": 0}")
    for key in task:
        if key not in TASK_KEYS:
            _raise(source, f"task.{shorten(key, 80)}" if isinstance(key, str) else "task", key,
                   f"unknown key; valid keys are {', '.join(TASK_KEYS)}")
    if "type" not in task:
        _raise(source, "task", dict(task), "\"type\" is missing, e.g. {\"type\": \"worker\", \"index\": 0}")
    task_type = task["type"]
    if not isinstance(task_type, str):
        _raise(source, "task.type", task_type, f"must be a string, one of {', '.join(ROLES)}")
    if task_type in LEGACY_ROLES:
        _warn(f"{source}: task.type {task_type!r} is the legacy name of {LEGACY_ROLES[task_type]!r}; "
              f"use {LEGACY_ROLES[task_type]!r}")
        task_type = LEGACY_ROLES[task_type]
    if task_type not in ROLES:
        _raise(source, "task.type", task_type, _unknown_role_hint(task_type))
    if "index" not in task:
        # TensorFlow's resolver reports task_id None then, and strategies fail later with obscure errors.
        _raise(source, "task", dict(task), "\"index\" is missing, e.g. {\"type\": \"worker\", \"index\": 0}")
    index = task["index"]
    if isinstance(index, bool) or not isinstance(index, int):
        _raise(source, "task.index", index, "must be a non-negative integer, e.g. 0")
    if index < 0:
        _raise(source, "task.index", index, "must be >= 0")
    return task_type, index


# ----------------------------------------------------------------------------------------------------------
# ClusterSpec
# ----------------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    """A validated cluster: which ``host:port`` plays which role.

    Build it with :meth:`from_file`, :meth:`from_dict`, :meth:`from_hosts` or :meth:`from_env`; direct
    construction takes the normalised ``cluster`` tuple and validates it as well.

    Attributes:
        cluster: ``((role, (address, ...)), ...)`` in ``ROLES`` order (use :attr:`roles` for a dict).
        source: where it came from, used in error messages (e.g. ``"cluster file tf_config/x.yaml"``).
        task: the task named by a whole TF_CONFIG document, if one was given.
        environment: the TF_CONFIG ``environment`` of such a document (e.g. ``"cloud"``), if any.
        rpc_layer: the TF_CONFIG ``rpc_layer`` of such a document (e.g. ``"grpc"``), if any.

    Example:
        >>> spec = ClusterSpec.from_hosts(workers=["10.0.0.2:2222", "10.0.0.3:2222"])
        >>> spec.tf_config("worker:1")["task"]
        {'type': 'worker', 'index': 1}
        >>> spec.strategy_hint
        'multi_worker'
    """

    cluster: Tuple[Tuple[str, Tuple[str, ...]], ...]
    source: str = dataclasses.field(default="cluster description", compare=False)
    task: Optional[Tuple[str, int]] = dataclasses.field(default=None, compare=False)
    environment: Optional[str] = dataclasses.field(default=None, compare=False)
    rpc_layer: Optional[str] = dataclasses.field(default=None, compare=False)

    def __post_init__(self) -> None:
        cluster: Any = self.cluster
        if isinstance(cluster, tuple):
            try:
                cluster = {role: list(addrs) for role, addrs in cluster}
            except (TypeError, ValueError):
                _raise(self.source, None, cluster, "cluster must be ((role, (address, ...)), ...); build specs "
                       "with ClusterSpec.from_dict / from_file / from_hosts")
        normalised = _validate_cluster(cluster, self.source)
        object.__setattr__(self, "cluster", normalised)
        if self.task is not None:
            object.__setattr__(self, "task", self.check_task(self.task))
        for name in ("environment", "rpc_layer"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                _raise(self.source, name, value, "must be a non-empty string")

    # -- constructors ------------------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "cluster description") -> "ClusterSpec":
        """Builds a spec from a cluster mapping or a whole TF_CONFIG document.

        Args:
            data: ``{"worker": ["h:p", ...], ...}`` or ``{"cluster": {...}, "task": {...}, ...}``.
            source: what error messages name first. Defaults to ``"cluster description"``.

        Returns:
            The validated spec (with :attr:`task` set when a TF_CONFIG document names one).

        Raises:
            ClusterConfigError: anything is invalid; the message names the field and the value received.

        Example:
            >>> ClusterSpec.from_dict({"worker": ["localhost:2222"]}).tasks()
            [('worker', 0)]
        """
        if isinstance(data, Mapping) and "cluster" in data:
            for key in data:
                if key not in TF_CONFIG_KEYS:
                    _raise(source, None, key, f"unknown key; valid keys of a TF_CONFIG document are "
                           f"{', '.join(TF_CONFIG_KEYS)}")
            cluster = _validate_cluster(data["cluster"], source, prefix="cluster.")
            task = _validate_task_doc(data["task"], source) if "task" in data else None
            spec = cls(cluster, source=source, environment=data.get("environment"), rpc_layer=data.get("rpc_layer"))
            if task is not None:
                object.__setattr__(spec, "task", spec.check_task(task, field="task"))
            return spec
        if isinstance(data, Mapping) and ("task" in data or "environment" in data):
            _raise(source, None, sorted(k for k in data if isinstance(k, str)),
                   "a TF_CONFIG document needs a \"cluster\" key; a cluster description lists only roles "
                   f"({', '.join(ROLES)})")
        return cls(_validate_cluster(data, source), source=source)

    @classmethod
    def from_file(cls, path: Union[str, "os.PathLike[str]"]) -> "ClusterSpec":
        """Reads a cluster description (YAML or JSON; a whole TF_CONFIG document is accepted too).

        YAML is read with ``yaml.safe_load``; duplicate keys are an error. Files ending ``.json`` are read
        as JSON, everything else as YAML (which also reads JSON).

        Args:
            path: the file.

        Returns:
            The validated spec.

        Raises:
            ClusterConfigError: the file cannot be read or parsed, or the description is invalid; the
                message starts with ``cluster file <path>:``.

        Example:
            >>> spec = ClusterSpec.from_file("tf_config/two_workers.yaml")  # doctest: +SKIP
        """
        source = f"cluster file {shorten(os.fspath(path))}"
        try:
            data, size = read_bounded(os.fspath(path))
            if data is None:
                return _raise(source, None, _NOTHING, f"larger than {MAX_BYTES:,} bytes (the limit for a cluster "
                              "description); is it the right file?")
            text = data.decode("utf-8")
        except FileNotFoundError:
            return _raise(source, None, _NOTHING, "no such file; check the path")
        except (OSError, UnicodeDecodeError) as exc:
            return _raise(source, None, _NOTHING, f"cannot read it ({shorten(str(exc))})")
        return cls.from_dict(_parse_text(text, source, json_only=str(path).endswith(".json")), source=source)

    @classmethod
    def from_hosts(cls, *, workers: Sequence[str] = (), ps: Sequence[str] = (), chief: Optional[str] = None,
                   evaluator: Optional[str] = None) -> "ClusterSpec":
        """Builds a spec from host lists (the TF Model Garden ``worker_hosts`` / ``ps_hosts`` style).

        Args:
            workers: worker addresses, a list or one comma-separated string.
            ps: parameter-server addresses, a list or one comma-separated string. Defaults to none.
            chief: the chief's address. Defaults to none (worker 0 acts as chief).
            evaluator: the side-car evaluator's address. Defaults to none.

        Returns:
            The validated spec.

        Raises:
            ClusterConfigError: an address is invalid, duplicated, or the roles do not make a cluster.

        Example:
            >>> ClusterSpec.from_hosts(workers="h1:2222,h2:2222", ps=["h3:2222"]).strategy_hint
            'parameter_server'
        """
        cluster: Dict[str, Any] = {}
        if chief is not None:
            cluster["chief"] = [chief]
        for role, hosts in (("worker", workers), ("ps", ps)):
            if isinstance(hosts, str):
                hosts = [h for h in hosts.split(",") if h != ""] if hosts else []
            if hosts:
                cluster[role] = list(hosts)
        if evaluator is not None:
            cluster["evaluator"] = [evaluator]
        return cls.from_dict(cluster, source="cluster hosts")

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None, *, port: Optional[int] = None,
                 ps: Optional[int] = None) -> Optional["ClusterSpec"]:
        """The cluster of this process: from TF_CONFIG, else from SLURM; None when neither is set.

        Args:
            environ: the environment to read. Defaults to ``os.environ``.
            port: SLURM only: first port on each node. Defaults to ``$TFACCEL_SLURM_PORT``, else 8888.
            ps: SLURM only: number of parameter servers. Defaults to ``$TFACCEL_SLURM_PS``, else 0.

        Returns:
            The spec, or None when this process is not part of a described cluster.

        Raises:
            ClusterConfigError: TF_CONFIG or the SLURM variables are set but invalid.
        """
        found = read_env(environ, port=port, ps=ps)
        return None if found is None else TaskInfo.from_env_cluster(found).spec

    # -- queries -----------------------------------------------------------------------------------------

    @property
    def roles(self) -> Dict[str, Tuple[str, ...]]:
        """``{role: (address, ...)}`` in ``ROLES`` order (a fresh dict; the spec itself is immutable)."""
        return dict(self.cluster)

    def tasks(self) -> List[Tuple[str, int]]:
        """Every task as ``(type, index)``, chief first, then workers, ps, evaluator."""
        return [(role, i) for role, addrs in self.cluster for i in range(len(addrs))]

    @property
    def num_tasks(self) -> int:
        """Number of tasks of every role."""
        return sum(len(addrs) for _, addrs in self.cluster)

    @property
    def num_workers(self) -> int:
        """Number of tasks that train: workers plus the chief."""
        roles = self.roles
        return len(roles.get("worker", ())) + len(roles.get("chief", ()))

    @property
    def strategy_hint(self) -> str:
        """``"parameter_server"`` with ps tasks, ``"local"`` with one training task, else ``"multi_worker"``."""
        if "ps" in self.roles:
            return "parameter_server"
        return "local" if self.num_workers == 1 else "multi_worker"

    def check_task(self, task: TaskLike, *, field: Optional[str] = None) -> Tuple[str, int]:
        """Parses ``task`` and checks that this cluster has it.

        Args:
            task: ``"worker:1"``, ``("worker", 1)`` or ``"chief"``.
            field: the name to use in an error message. Defaults to ``"task"``.

        Returns:
            ``(type, index)``.

        Raises:
            ClusterConfigError: the task is malformed, its role is not in the cluster or its index is out of range.
        """
        label = field or "task"
        role, index = parse_task(task, source=self.source, field=label)
        roles = self.roles
        if role not in roles:
            _raise(self.source, label, f"{role}:{index}", f"the cluster has no {role!r} role; its roles are "
                   f"{', '.join(roles)}; valid tasks: {self._task_names()}")
        if index >= len(roles[role]):
            _raise(self.source, label, f"{role}:{index}", f"task index out of range: the cluster has "
                   f"{len(roles[role])} {role} task(s), so the index must be 0-{len(roles[role]) - 1}; valid "
                   f"tasks: {self._task_names()}")
        return role, index

    def _task_names(self) -> str:
        names = [f"{r}:{i}" for r, i in self.tasks()]
        return ", ".join(names if len(names) <= 8 else names[:8] + ["..."])

    def address(self, task: TaskLike) -> str:
        """The ``"host:port"`` of a task given as ``"worker:1"`` or ``("worker", 1)``."""
        role, index = self.check_task(task)
        return self.roles[role][index]

    def tf_config(self, task: TaskLike, *, environment: Optional[str] = None,
                  rpc_layer: Optional[str] = None) -> Dict[str, Any]:
        """The exact TF_CONFIG dict for one task.

        Args:
            task: ``"worker:1"`` or ``("worker", 1)``.
            environment: TF_CONFIG ``environment`` (e.g. ``"cloud"``). Defaults to the spec's, usually none.
            rpc_layer: TF_CONFIG ``rpc_layer`` (e.g. ``"grpc"``). Defaults to the spec's, usually none.

        Returns:
            ``{"cluster": {role: [address, ...]}, "task": {"type": ..., "index": ...}}`` (plus
            ``environment`` / ``rpc_layer`` when set).

        Raises:
            ClusterConfigError: the task is not in this cluster.

        Example:
            >>> ClusterSpec.from_hosts(workers=["a:1", "b:1"]).tf_config("worker:0")
            {'cluster': {'worker': ['a:1', 'b:1']}, 'task': {'type': 'worker', 'index': 0}}
        """
        role, index = self.check_task(task)
        doc: Dict[str, Any] = {"cluster": {r: list(a) for r, a in self.cluster},
                               "task": {"type": role, "index": index}}
        environment = environment if environment is not None else self.environment
        rpc_layer = rpc_layer if rpc_layer is not None else self.rpc_layer
        for key, value in (("environment", environment), ("rpc_layer", rpc_layer)):
            if value is not None:
                if not isinstance(value, str) or not value:
                    _raise(self.source, key, value, "must be a non-empty string")
                doc[key] = value
        return doc

    def export(self, task: TaskLike, environ: Optional[MutableMapping[str, str]] = None, *,
               environment: Optional[str] = None, rpc_layer: Optional[str] = None) -> Dict[str, Any]:
        """Writes ``TF_CONFIG`` for one task -- the only place tfaccel writes it.

        Everything is validated before anything is written, so an invalid task leaves ``environ``
        untouched. Set it before creating any ``tf.distribute`` strategy: TensorFlow reads TF_CONFIG when
        the strategy is constructed (tensorflow#31154).

        Args:
            task: ``"worker:1"`` or ``("worker", 1)``.
            environ: the mapping to write into. Defaults to ``os.environ``.
            environment: TF_CONFIG ``environment``. Defaults to the spec's.
            rpc_layer: TF_CONFIG ``rpc_layer``. Defaults to the spec's.

        Returns:
            The TF_CONFIG dict that was written.

        Raises:
            ClusterConfigError: the task is not in this cluster (nothing is written).

        Example:
            >>> env = {}
            >>> _ = ClusterSpec.from_hosts(workers=["a:1", "b:1"]).export("worker:1", env)
            >>> sorted(env)
            ['TF_CONFIG']
        """
        doc = self.tf_config(task, environment=environment, rpc_layer=rpc_layer)
        value = json.dumps(doc, separators=(",", ":"))
        target = os.environ if environ is None else environ
        previous = target.get("TF_CONFIG")
        if previous is not None and previous != value:
            get_logger().debug("TF_CONFIG replaced (was %s)", previous[:200])
        target["TF_CONFIG"] = value
        return doc

    def describe(self) -> str:
        """A one-line human summary, e.g. ``2 tasks: worker:0 a:1, worker:1 b:1; strategy hint multi_worker``."""
        items = [f"{r}:{i} {self.roles[r][i]}" for r, i in self.tasks()]
        return f"{self.num_tasks} task(s): {', '.join(items)}; strategy hint {self.strategy_hint}"


# ----------------------------------------------------------------------------------------------------------
# TaskInfo
# ----------------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TaskInfo:
    """This process's place in a cluster.

    Attributes:
        spec: the whole cluster.
        task_type: ``"chief"``, ``"worker"``, ``"ps"`` or ``"evaluator"``.
        task_index: the index within the role.
        environment: TF_CONFIG ``environment`` (``"cloud"`` under Kubeflow TFJob), or None.
        source: ``"TF_CONFIG"`` or ``"SLURM"``.
    """

    spec: ClusterSpec
    task_type: str
    task_index: int
    environment: Optional[str] = None
    source: str = "TF_CONFIG"

    def __post_init__(self) -> None:
        self.spec.check_task((self.task_type, self.task_index))

    @classmethod
    def from_env_cluster(cls, found: EnvCluster) -> "TaskInfo":
        """Validates a cluster read from TF_CONFIG or SLURM into this process's task.

        Args:
            found: what ``tfaccel.cluster.described`` read from the environment.

        Returns:
            The task, its ``source`` ``"TF_CONFIG"`` or ``"SLURM"``.

        Raises:
            ClusterConfigError: the cluster is invalid, or a TF_CONFIG names no task or one not in the cluster.
        """
        spec = ClusterSpec.from_dict(found.document, source=found.source)
        task = found.task if found.task is not None else spec.task
        if task is None:
            raise ClusterConfigError(f"{found.source}: \"task\" is missing; add e.g. \"task\": {{\"type\": "
                                     f"\"{spec.tasks()[0][0]}\", \"index\": 0}} (valid tasks: "
                                     f"{', '.join(f'{r}:{i}' for r, i in spec.tasks()[:8])})")
        return cls(spec, task[0], task[1], environment=spec.environment, source=found.origin)

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

    def tf_config(self) -> Dict[str, Any]:
        """The TF_CONFIG dict of this task."""
        return self.spec.tf_config((self.task_type, self.task_index), environment=self.environment)


# ----------------------------------------------------------------------------------------------------------
# Parsing text
# ----------------------------------------------------------------------------------------------------------

def _parse_text(text: str, source: str, *, json_only: bool = False) -> Any:
    """Parses JSON or YAML (``safe_load``), rejecting duplicate keys; errors name ``source`` and the line."""
    doc = _parse_json(text, source) if json_only else _parse_yaml(text, source)
    problem = nesting_problem(doc)
    if problem is not None:
        _raise(source, None, _NOTHING, f"{problem}; a cluster description is role -> list of \"host:port\"")
    return doc


def parse_json_document(text: str, source: str) -> Any:
    """Parses JSON (a cluster file or TF_CONFIG): a key given twice, nesting deeper than the limit or more values
    than the limit is an error naming ``source``, as is invalid JSON (at its line and column)."""
    return _parse_text(text, source, json_only=True)


def _duplicate_key(source: str) -> Callable[[str], None]:
    def duplicate(key: str) -> None:
        _raise(source, shorten(key, 80), _NOTHING, "key given twice; keep one")
    return duplicate


def _parse_json(text: str, source: str) -> Any:
    try:
        return loads_json(text, _duplicate_key(source))
    except ClusterConfigError:
        raise
    except json.JSONDecodeError as exc:
        return _raise(source, None, _NOTHING, f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}")
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        return _raise(source, None, _NOTHING, f"not valid JSON: {shorten(str(exc))}")
    except RecursionError:
        return _raise(source, None, _NOTHING, "nested too deeply to read; a cluster description is role -> list "
                      "of \"host:port\"")


def _parse_yaml(text: str, source: str) -> Any:
    if text.lstrip().startswith("{"):  # JSON is YAML too, and Python's JSON reader is 10-100x faster
        try:
            return loads_json(text, _duplicate_key(source))
        except ClusterConfigError:
            raise
        except (ValueError, RecursionError):
            pass  # not JSON after all: YAML says what is wrong
    bound = 2 * (text.count(",") + text.count("\n") + 1) + text.count("[") + text.count("{")
    if bound > MAX_YAML_VALUES:  # PyYAML builds ~70,000 values a second: bound the work before it starts
        _raise(source, None, _NOTHING, f"too large to read as YAML: up to {bound:,} values (from its commas and "
               f"lines), more than {MAX_YAML_VALUES:,}; write a cluster this large as JSON (a .json file)")
    import yaml

    try:
        return yaml.load(text, Loader=_strict_loader())  # a SafeLoader subclass: safe_load plus duplicate check
    except ClusterConfigError as exc:
        raise ClusterConfigError(f"{source}: {exc}") from None
    except (TypeError, ValueError) as exc:  # a list used as a mapping key, an integer of more than 4300 digits
        return _raise(source, None, _NOTHING, f"not a valid cluster description ({shorten(str(exc))})")
    except RecursionError:
        return _raise(source, None, _NOTHING, "nested too deeply to read; a cluster description is role -> list "
                      "of \"host:port\"")
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        return _raise(source, None, _NOTHING, f"not valid YAML: {shorten(problem)}{where}")


_LOADER: Any = None


def _strict_loader() -> Any:
    global _LOADER
    if _LOADER is None:
        import yaml

        # libyaml's parser when PyYAML has it: ~8x faster on a 1 MB file, and it refuses deep nesting itself.
        base = yaml.CSafeLoader if getattr(yaml, "__with_libyaml__", False) else yaml.SafeLoader

        class _StrictSafeLoader(base):  # type: ignore[valid-type,misc]
            pass

        def construct_mapping(loader: Any, node: Any, deep: bool = False) -> Dict[Any, Any]:
            loader.flatten_mapping(node)
            out: Dict[Any, Any] = {}
            for key_node, value_node in node.value:
                key = loader.construct_object(key_node, deep=deep)
                if key in out:
                    raise _err(f"{shorten(str(key), 80)} (line {key_node.start_mark.line + 1})", None, _NOTHING,
                               "key given twice; keep one")
                out[key] = loader.construct_object(value_node, deep=deep)
            return out

        _StrictSafeLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
        _LOADER = _StrictSafeLoader
    return _LOADER
