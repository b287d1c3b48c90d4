"""Reading a cluster from SLURM's environment (inside ``srun``).

SLURM gives every task of a job step its global rank (``SLURM_PROCID``), the step's nodes in compressed
form (``SLURM_STEP_NODELIST=node[01-03,07]``) and how many tasks run on each node
(``SLURM_STEP_TASKS_PER_NODE=2(x3),1``). With the default *block* distribution, ranks fill node 0 first,
then node 1, and so on; with ``--distribution=cyclic`` (``SLURM_DISTRIBUTION=cyclic``) they are dealt round-robin over
the nodes. The ``k``-th task of a node (in rank order) listens on ``port + k``. Nodes keep the host list's order
(``node[9-10]`` is node9 then node10, not text order).

Roles: with no parameter servers every rank is a worker (worker 0 acts as chief). With ``ps=P``, rank 0 is
the chief (the ParameterServerStrategy coordinator), ranks 1..P are ps and the rest are workers.

This module reads and checks the variables only; ``tfaccel.cluster.slurm_task`` validates the roles it finds
into a ``TaskInfo``.
"""

import collections
import itertools
import os
import re
from typing import Dict, List, Mapping, Optional, Tuple

from tfaccel.cluster.errors import ClusterConfigError
from tfaccel.cluster.limits import MAX_BYTES, MAX_DIGITS, show, shorten
from tfaccel.log import get_logger

__all__ = ["expand_nodelist", "parse_tasks_per_node", "slurm_cluster", "in_job_step", "DEFAULT_SLURM_PORT",
           "SLURM_PORT_ENV", "SLURM_PS_ENV"]

DEFAULT_SLURM_PORT = 8888
SLURM_PORT_ENV = "TFACCEL_SLURM_PORT"
SLURM_PS_ENV = "TFACCEL_SLURM_PS"
NODELIST_VARS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
TASKS_PER_NODE_VARS = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
STEP_VARS = ("SLURM_STEP_NODELIST", "SLURM_STEP_ID", "SLURM_STEPID")  # set by srun, not in the batch script
_warned_not_in_step = False

MAX_NODES = 100_000  # hosts a node list may name, counted before it is expanded
_RANGE_RE = re.compile(r"^([0-9]{1,%d})(?:-([0-9]{1,%d}))?$" % (MAX_DIGITS, MAX_DIGITS))
_TPN_RE = re.compile(r"^([0-9]{1,%d})(?:\(x([0-9]{1,%d})\))?$" % (MAX_DIGITS, MAX_DIGITS))


def _fail(var: str, value: str, problem: str) -> ClusterConfigError:
    return ClusterConfigError(f"SLURM: {var} {show(value)}: {problem}")


def _split_top_level(text: str, var: str) -> List[str]:
    """Splits on commas that are not inside brackets."""
    if "[" not in text and "]" not in text:
        return text.split(",")
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise _fail(var, text, "nested brackets are not a valid host list")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise _fail(var, text, "']' without a matching '['")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise _fail(var, text, "'[' without a matching ']'")
    parts.append(text[start:])
    return parts


def _range_values(body: str, var: str, whole: str) -> List[str]:
    """The values of one bracket group's body, ``01-03,07`` -> ``01 02 03 07`` (zero padding kept)."""
    values: List[str] = []
    for item in body.split(","):
        match = _RANGE_RE.match(item)
        if not match:
            raise _fail(var, whole, f"bad range {shorten(item, 40)!r} in [{shorten(body, 80)}]; expected e.g. "
                        "[01-03,07]")
        lo_text, hi_text = match.group(1), match.group(2)
        lo, hi = int(lo_text), int(hi_text if hi_text is not None else lo_text)
        if hi < lo:
            raise _fail(var, whole, f"range {item!r} runs backwards; write it low-high")
        if len(values) + hi - lo + 1 > MAX_NODES:
            raise _fail(var, whole, f"range {item!r} is implausibly large: more than {MAX_NODES:,} hosts")
        width = len(lo_text)
        values.extend(str(n).zfill(width) for n in range(lo, hi + 1))
    return values


def _expand_one(name: str, var: str, whole: str, budget: int) -> List[str]:
    """Expands one host expression, possibly with several bracket groups (``rack[1-2]-n[01-02]``).

    The number of hosts (the product of the groups' sizes) is checked against ``budget`` before any is built.
    """
    if not name:
        raise _fail(var, whole, "empty host name (check for stray commas)")
    if "[" not in name:
        if budget < 1:
            raise _fail(var, whole, f"names more than {MAX_NODES:,} hosts")
        return [name]
    pieces: List[List[str]] = []
    rest = name
    while "[" in rest:
        open_at = rest.index("[")
        close_at = rest.index("]", open_at)
        pieces.append([rest[:open_at]])
        pieces.append(_range_values(rest[open_at + 1:close_at], var, whole))
        rest = rest[close_at + 1:]
    pieces.append([rest])
    total = 1
    for piece in pieces:
        total *= len(piece)
        if total > budget:
            raise _fail(var, whole, f"names more than {MAX_NODES:,} hosts")
    return ["".join(parts) for parts in itertools.product(*pieces)]


def expand_nodelist(nodelist: str, *, var: str = "SLURM_JOB_NODELIST") -> List[str]:
    """Expands SLURM's compressed host list.

    Args:
        nodelist: e.g. ``"node[01-03,07]"``, ``"a[1-2],b3"`` or ``"rack[1-2]-n[1-2]"``.
        var: the variable name used in error messages. Defaults to ``"SLURM_JOB_NODELIST"``.

    Returns:
        The host names in order, zero padding kept (``node01``, ``node02``, ...).

    Raises:
        ClusterConfigError: the list is malformed or names a host twice.

    Example:
        >>> expand_nodelist("node[01-03,07]")
        ['node01', 'node02', 'node03', 'node07']
        >>> expand_nodelist("a[1-2],b3")
        ['a1', 'a2', 'b3']
    """
    text = nodelist.strip()
    if len(text) > MAX_BYTES:
        raise _fail(var, nodelist, f"is {len(text):,} characters long, more than {MAX_BYTES:,}")
    if not text:
        raise _fail(var, nodelist, "is empty; run inside an allocation (salloc / sbatch) and srun")
    if any(ch.isspace() for ch in text):
        raise _fail(var, nodelist, "contains whitespace")
    hosts: List[str] = []
    for part in _split_top_level(text, var):
        hosts.extend(_expand_one(part, var, nodelist, MAX_NODES - len(hosts)))
    dupes = sorted(h for h, n in collections.Counter(h.lower() for h in hosts).items() if n > 1)
    if dupes:
        shown = ", ".join(dupes[:5]) + (f" and {len(dupes) - 5} more" if len(dupes) > 5 else "")
        raise _fail(var, nodelist, f"names host(s) {shown} twice")
    return hosts


def parse_tasks_per_node(value: str, num_nodes: int, *, var: str = "SLURM_TASKS_PER_NODE") -> List[int]:
    """Parses ``"2(x3),1"`` (or a single ``"2"`` for every node) into one count per node.

    Args:
        value: SLURM's tasks-per-node string.
        num_nodes: the number of nodes in the node list.
        var: the variable name used in error messages. Defaults to ``"SLURM_TASKS_PER_NODE"``.

    Returns:
        One task count per node.

    Raises:
        ClusterConfigError: the string is malformed or does not match the number of nodes.

    Example:
        >>> parse_tasks_per_node("2(x3),1", 4)
        [2, 2, 2, 1]
    """
    if len(value) > MAX_BYTES:
        raise _fail(var, value, f"is {len(value):,} characters long, more than {MAX_BYTES:,}")
    items: List[Tuple[int, int]] = []
    for item in value.strip().split(","):
        match = _TPN_RE.match(item)
        if not match:
            raise _fail(var, value, f"bad item {shorten(item, 40)!r}; expected counts like 2(x3),1")
        items.append((int(match.group(1)), int(match.group(2) or 1)))
    declared = sum(repeat for _, repeat in items)  # checked before any list of that length is built
    if declared != num_nodes and not (declared == 1 and num_nodes > 1):
        raise _fail(var, value, f"gives {declared} node count(s) but the node list has {num_nodes} node(s)")
    counts = [count for count, repeat in items for _ in range(repeat)]
    if len(counts) == 1 and num_nodes > 1:
        counts = counts * num_nodes
    if any(c < 1 for c in counts):
        raise _fail(var, value, "every node needs at least 1 task")
    return counts


def _int_var(environ: Mapping[str, str], var: str, *, minimum: int = 0) -> Optional[int]:
    raw = environ.get(var)
    if raw is None or raw == "":
        return None
    text = raw.strip()
    if not text.isdigit() or not text.isascii() or len(text) > MAX_DIGITS:
        raise _fail(var, raw, f"must be an integer >= {minimum} (at most {MAX_DIGITS} digits)")
    value = int(raw)
    if value < minimum:
        raise _fail(var, raw, f"must be an integer >= {minimum}")
    return value


def in_job_step(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether this process is a task of a SLURM job step (started by ``srun``), not a batch script or a shell.

    Args:
        environ: the environment to read. Defaults to ``os.environ``.

    Returns:
        True when ``SLURM_PROCID`` and one of ``SLURM_STEP_NODELIST`` / ``SLURM_STEP_ID`` / ``SLURM_STEPID`` are set.

    Example:
        >>> in_job_step({"SLURM_PROCID": "0", "SLURM_STEP_ID": "0"}), in_job_step({"SLURM_PROCID": "0"})
        (True, False)
    """
    env = os.environ if environ is None else environ
    return "SLURM_PROCID" in env and any(env.get(v) for v in STEP_VARS)


def _warn_not_in_step(num_nodes: int) -> None:
    global _warned_not_in_step
    if _warned_not_in_step:
        return
    _warned_not_in_step = True
    get_logger().warning(
        "SLURM: SLURM_PROCID is set but SLURM_STEP_NODELIST / SLURM_STEP_ID are not: this process is the batch "
        "script (or an salloc shell), not a task of a job step, so it runs as a single process; start one task "
        f"per worker with srun to use the {num_nodes} node(s) of the allocation")


def slurm_cluster(environ: Optional[Mapping[str, str]] = None, *, port: Optional[int] = None,
                  ps: Optional[int] = None) -> Optional[Tuple[Dict[str, List[str]], Tuple[str, int]]]:
    """The roles SLURM's variables describe and this task's place in them; None outside ``srun``.

    Args:
        environ: the environment to read. Defaults to ``os.environ``.
        port: first port on every node; task ``k`` of a node uses ``port + k``. Defaults to
            ``$TFACCEL_SLURM_PORT``, else 8888.
        ps: number of parameter servers (rank 0 becomes the chief, ranks 1..ps the ps). Defaults to
            ``$TFACCEL_SLURM_PS``, else 0 (all workers).

    Returns:
        ``({role: ["host:port", ...]}, (task type, task index))``, or None when ``SLURM_PROCID`` or a node list
        is missing, or when this process is not a task of a job step (the batch script itself: no
        ``SLURM_STEP_NODELIST`` or ``SLURM_STEP_ID``; a warning says so once).

    Raises:
        ClusterConfigError: a SLURM variable is malformed or inconsistent, or the port / ps count is invalid.

    Example:
        >>> env = {"SLURM_PROCID": "1", "SLURM_STEP_NODELIST": "node[1-2]", "SLURM_STEP_TASKS_PER_NODE": "1(x2)"}
        >>> slurm_cluster(env, port=2222)
        ({'worker': ['node1:2222', 'node2:2222']}, ('worker', 1))
    """
    env = os.environ if environ is None else environ
    nodelist_var = next((v for v in NODELIST_VARS if env.get(v)), None)
    if "SLURM_PROCID" not in env or nodelist_var is None:
        return None
    rank = _int_var(env, "SLURM_PROCID")
    assert rank is not None
    nodes = expand_nodelist(env[nodelist_var], var=nodelist_var)
    if not any(env.get(v) for v in STEP_VARS):
        # An sbatch script / salloc shell also has SLURM_PROCID=0 and the job's node list, but it is not one
        # of the job's tasks: treating it as worker 0 would make it wait forever for workers nobody started.
        _warn_not_in_step(len(nodes))
        return None
    counts = _task_counts(env, nodes, nodelist_var)
    total = sum(counts)
    if rank >= total:
        raise _fail("SLURM_PROCID", str(rank), f"task rank out of range: the step has {total} task(s), 0-{total - 1}")
    port = _port(env, port, counts)
    ps = _ps_count(env, ps, total)

    distribution = _distribution(env)
    rank_node = _rank_nodes(nodes, counts, distribution)
    seen: Dict[str, int] = collections.Counter()
    addresses: List[str] = []
    for node in rank_node:  # task k of a node (in rank order) listens on port + k
        addresses.append(f"{node}:{port + seen[node]}")
        seen[node] += 1
    node_name = env.get("SLURMD_NODENAME")
    if node_name and node_name != rank_node[rank]:
        raise _fail("SLURMD_NODENAME", node_name, f"rank {rank} should run on {rank_node[rank]} under the {distribution} "
                    f"distribution (SLURM_DISTRIBUTION {show(env.get('SLURM_DISTRIBUTION', ''))}) that tfaccel read; "
                    "run srun with --distribution=block or cyclic")
    return _roles(addresses, ps, rank)


def _distribution(env: Mapping[str, str]) -> str:
    """How srun placed ranks on nodes: ``"block"`` (its default; SLURM_DISTRIBUTION unset) or ``"cyclic"``.

    ``SLURM_DISTRIBUTION`` is ``node_level[:socket_level[:core_level]]`` (``cyclic``, ``block:cyclic``, ...); only the
    node level decides which node a rank runs on. ``plane=N`` and ``arbitrary`` place ranks in ways the variables do
    not say, so they are refused.
    """
    raw = env.get("SLURM_DISTRIBUTION", "")
    node_level = raw.strip().split(":", 1)[0].split(",", 1)[0].lower()
    if node_level in ("", "block", "*"):
        return "block"
    if node_level in ("cyclic", "fcyclic"):
        return "cyclic"
    raise _fail("SLURM_DISTRIBUTION", raw, "tfaccel can place ranks under the block (srun's default) and cyclic "
                "distributions only; run srun with --distribution=block or --distribution=cyclic")


def _rank_nodes(nodes: List[str], counts: List[int], distribution: str) -> List[str]:
    """The node of every rank: block fills node 0 first; cyclic deals ranks round-robin over the nodes with room."""
    if distribution == "block":
        return [node for node, count in zip(nodes, counts) for _ in range(count)]
    left, out = list(counts), []
    while any(left):
        for i, node in enumerate(nodes):
            if left[i]:
                out.append(node)
                left[i] -= 1
    return out


def _task_counts(env: Mapping[str, str], nodes: List[str], nodelist_var: str) -> List[int]:
    """Tasks on each node of the step: tasks per node, trimmed to the step's task count when it is smaller."""
    tpn_var = next((v for v in TASKS_PER_NODE_VARS if env.get(v)), None)
    if tpn_var is not None:
        counts = parse_tasks_per_node(env[tpn_var], len(nodes), var=tpn_var)
    elif env.get("SLURM_NTASKS_PER_NODE"):
        per_node = _int_var(env, "SLURM_NTASKS_PER_NODE", minimum=1)
        counts = [int(per_node or 1)] * len(nodes)
    else:
        counts = [1] * len(nodes)

    ntasks = _int_var(env, "SLURM_STEP_NUM_TASKS", minimum=1) or _int_var(env, "SLURM_NTASKS", minimum=1)
    total = sum(counts)
    if min(total, ntasks or total) > MAX_NODES:
        per_node_var = tpn_var or "SLURM_NTASKS_PER_NODE"
        raise _fail(per_node_var, env.get(per_node_var, ""), f"makes {total:,} tasks on {len(nodes)} "
                    f"node(s), more than the {MAX_NODES:,} a cluster may have")
    if ntasks is not None and ntasks > total:
        raise _fail("SLURM_NTASKS", str(ntasks), f"is more than the {total} task slot(s) of {nodelist_var} "
                    f"and tasks per node {counts}")
    if ntasks is not None and ntasks < total:
        counts = _trim(counts, ntasks)
    return counts


def _port(env: Mapping[str, str], port: Optional[int], counts: List[int]) -> int:
    """The first port on each node: ``port``, else ``$TFACCEL_SLURM_PORT``, else 8888; every task's port valid."""
    if port is None:
        port = _int_var(env, SLURM_PORT_ENV, minimum=1)
        port_source = SLURM_PORT_ENV
    else:
        port_source = "port"
    if port is None:
        port = DEFAULT_SLURM_PORT
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ClusterConfigError(f"SLURM: {port_source} {port!r}: port must be 1-65535")
    if port + max(counts) - 1 > 65535:
        raise ClusterConfigError(f"SLURM: {port_source} {port!r}: port + tasks per node - 1 = "
                                 f"{port + max(counts) - 1} is above 65535; choose a lower port")
    return port


def _ps_count(env: Mapping[str, str], ps: Optional[int], total: int) -> int:
    """The number of parameter servers: ``ps``, else ``$TFACCEL_SLURM_PS``, else 0; checked against the step."""
    if ps is None:
        ps = _int_var(env, SLURM_PS_ENV) or 0
        ps_source = SLURM_PS_ENV
    else:
        ps_source = "ps"
    if isinstance(ps, bool) or not isinstance(ps, int) or ps < 0:
        raise ClusterConfigError(f"SLURM: {ps_source} {ps!r}: must be an integer >= 0")
    if ps and total < ps + 2:
        raise ClusterConfigError(f"SLURM: {ps_source} {ps!r}: parameter-server training needs a chief, {ps} ps "
                                 f"and at least one worker, i.e. {ps + 2} task(s), but the step has {total}; "
                                 "ask srun for more tasks or lower the ps count")
    return ps


def _roles(addresses: List[str], ps: int, rank: int) -> Tuple[Dict[str, List[str]], Tuple[str, int]]:
    """Roles by rank: all workers, or with ``ps`` servers rank 0 the chief, ranks 1..ps the ps, then workers."""
    if not ps:
        return {"worker": addresses}, ("worker", rank)
    roles = {"chief": addresses[:1], "ps": addresses[1:1 + ps], "worker": addresses[1 + ps:]}
    task: Tuple[str, int] = ("chief", 0) if rank == 0 else (("ps", rank - 1) if rank <= ps
                                                             else ("worker", rank - 1 - ps))
    return roles, task


def _trim(counts: List[int], ntasks: int) -> List[int]:
    out: List[int] = []
    left = ntasks
    for count in counts:
        if left <= 0:
            break
        out.append(min(count, left))
        left -= out[-1]
    return out
