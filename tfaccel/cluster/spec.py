"""Cluster descriptions: a validated, frozen ``ClusterSpec`` and the exact TF_CONFIG of each of its tasks.

A cluster description is a mapping whose keys are roles (``chief``, ``worker``, ``ps``, ``evaluator``),
each a list of ``"host:port"`` strings -- the ``cluster`` part of TF_CONFIG. A whole TF_CONFIG document
(``{"cluster": {...}, "task": {...}}``) is accepted too. Everything is checked when the spec is built
(:mod:`tfaccel.cluster.validate`, text read by :mod:`tfaccel.cluster.text`), so a spec that exists is valid,
and :meth:`ClusterSpec.export` (the only writer of ``TF_CONFIG`` in tfaccel) never writes a half-valid value.
A process's own place in a cluster is a :class:`tfaccel.cluster.task.TaskInfo`.

This module never imports TensorFlow: ``tfaccel tf-config`` must stay fast.
"""

import dataclasses
import json
import os
from typing import Any, Dict, List, Mapping, MutableMapping, Optional, Sequence, Tuple, Union

from tfaccel.cluster.described import EnvCluster
from tfaccel.cluster.sources import read_env
from tfaccel.cluster.errors import ClusterConfigError, fail
from tfaccel.cluster.text import read_cluster_file
from tfaccel.cluster.validate import (ROLES, TF_CONFIG_KEYS, TaskLike, parse_task, validate_cluster,
                                      validate_task_doc)
from tfaccel.log import get_logger

__all__ = ["ClusterSpec", "env_cluster_task"]


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
                fail(self.source, None, cluster, "cluster must be ((role, (address, ...)), ...); build specs "
                     "with ClusterSpec.from_dict / from_file / from_hosts")
        normalised = validate_cluster(cluster, self.source)
        object.__setattr__(self, "cluster", normalised)
        if self.task is not None:
            object.__setattr__(self, "task", self.check_task(self.task))
        for name in ("environment", "rpc_layer"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                fail(self.source, name, value, "must be a non-empty string")

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
                    fail(source, None, key, f"unknown key; valid keys of a TF_CONFIG document are "
                         f"{', '.join(TF_CONFIG_KEYS)}")
            cluster = validate_cluster(data["cluster"], source, prefix="cluster.")
            task = validate_task_doc(data["task"], source) if "task" in data else None
            spec = cls(cluster, source=source, environment=data.get("environment"), rpc_layer=data.get("rpc_layer"))
            if task is not None:
                object.__setattr__(spec, "task", spec.check_task(task, field="task"))
            return spec
        if isinstance(data, Mapping) and ("task" in data or "environment" in data):
            fail(source, None, sorted(k for k in data if isinstance(k, str)),
                 "a TF_CONFIG document needs a \"cluster\" key; a cluster description lists only roles "
                 f"({', '.join(ROLES)})")
        return cls(validate_cluster(data, source), source=source)

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
        document, source = read_cluster_file(path)
        return cls.from_dict(document, source=source)

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
        """The cluster of this process (``tfaccel.cluster.sources.read_env``: TF_CONFIG, Kubernetes, cloud trainers,
        SLURM); None when none is set.

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
        return None if found is None else env_cluster_task(found)[0]

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
            fail(self.source, label, f"{role}:{index}", f"the cluster has no {role!r} role; its roles are "
                 f"{', '.join(roles)}; valid tasks: {self._task_names()}")
        if index >= len(roles[role]):
            fail(self.source, label, f"{role}:{index}", f"task index out of range: the cluster has "
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
                    fail(self.source, key, value, "must be a non-empty string")
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



def env_cluster_task(found: EnvCluster) -> Tuple[ClusterSpec, Tuple[str, int]]:
    """Validates a cluster read from TF_CONFIG or SLURM, and the task it names for this process.

    Args:
        found: what ``tfaccel.cluster.described`` read from the environment.

    Returns:
        ``(spec, (task_type, task_index))``.

    Raises:
        ClusterConfigError: the cluster is invalid, or a TF_CONFIG names no task or one not in the cluster.
    """
    spec = ClusterSpec.from_dict(found.document, source=found.source)
    task = found.task if found.task is not None else spec.task
    if task is None:
        raise ClusterConfigError(f"{found.source}: \"task\" is missing; add e.g. \"task\": {{\"type\": "
                                 f"\"{spec.tasks()[0][0]}\", \"index\": 0}} (valid tasks: "
                                 f"{', '.join(f'{r}:{i}' for r, i in spec.tasks()[:8])})")
    return spec, spec.check_task(task)
