"""The error every cluster reader raises, in a module of its own so that each reader can raise it without
importing the others (the TF_CONFIG and SLURM readers sit below ``ClusterSpec``, which reads through them)."""

from tfaccel.errors import ConfigError

__all__ = ["ClusterConfigError"]


class ClusterConfigError(ConfigError):
    """A cluster description, TF_CONFIG or SLURM environment is invalid (also a ``ValueError``)."""
