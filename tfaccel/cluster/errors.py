"""The error every cluster reader raises, and its one message format, in a module of its own so that each
reader can raise it without importing the others (the TF_CONFIG and SLURM readers sit below ``ClusterSpec``,
which reads through them)."""

from typing import Any, NoReturn, Optional

from tfaccel.cluster.limits import show
from tfaccel.errors import ConfigError

__all__ = ["ClusterConfigError", "NOTHING", "cluster_error", "fail"]

NOTHING = object()  # "no value received": the message names the field but shows no value


class ClusterConfigError(ConfigError):
    """A cluster description, TF_CONFIG or SLURM environment is invalid (also a ``ValueError``)."""


def cluster_error(source: str, field: Optional[str], received: Any, problem: str) -> ClusterConfigError:
    """Builds the standard message: ``<source>: <field> <received>: <problem>`` (the value shown short).

    Example:
        >>> str(cluster_error("cluster file c.yaml", "worker[1]", "a:0", "port must be 1-65535"))
        'cluster file c.yaml: worker[1] "a:0": port must be 1-65535'
    """
    parts = []
    if field:
        parts.append(field)
    if received is not NOTHING:
        parts.append(show(received))
    head = ": ".join(p for p in (source, " ".join(parts)) if p)
    return ClusterConfigError(f"{head}: {problem}")


def fail(source: str, field: Optional[str], received: Any, problem: str) -> NoReturn:
    """Raises :func:`cluster_error`'s error (its arguments and message are the same)."""
    raise cluster_error(source, field, received, problem)
