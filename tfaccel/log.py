"""tfaccel's logger: speaks on the chief only by default, and can prefix lines with the task.

Library code never prints; it logs through :func:`get_logger`. Whether this process is the chief is
read from TF_CONFIG / a Kubernetes pod's / Horovod's / SLURM's environment when the logger is set up (it never writes
the environment).
"""

import json
import logging
import os
import sys
from typing import Any, Optional, Tuple

_LOGGER_NAME = "tfaccel"
PREFIXED_BY_LAUNCHER_ENV = "TFACCEL_OUTPUT_PREFIXED"
_configured = False
_MAX_TF_CONFIG = 1024 * 1024  # tfaccel.cluster's limit too; this module imports nothing of tfaccel
_SLURM_STEP_VARS = ("SLURM_STEP_NODELIST", "SLURM_STEP_ID", "SLURM_STEPID")  # set by srun, not in a batch script
_K8S_TASKS = "TFACCEL_K8S_TASKS"  # tfaccel.cluster.kubernetes.TASKS_ENV: the shape a Kubernetes manifest carries


def _task_from_environment() -> Tuple[Optional[str], Optional[int]]:
    """(task_type, task_index) of this process from TF_CONFIG, the Horovod/MPI rank or the SLURM rank (inside srun),
    else (None, None)."""
    raw = os.environ.get("TF_CONFIG")
    if raw:
        try:
            task = _loads_bounded(raw).get("task") or {}
            if "type" in task:
                return str(task["type"])[:40], int(task.get("index", 0))
        except (ValueError, AttributeError, TypeError, OverflowError, RecursionError):
            return None, None  # a malformed TF_CONFIG is reported by the cluster module, not here
    pod = _k8s_task()
    if pod[0] is not None:
        return pod
    rank_vars = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
    if any(os.environ.get(v) for v in _SLURM_STEP_VARS):  # a task of a SLURM job step: rank 0 is worker 0 or the chief
        rank_vars += ("SLURM_PROCID",)
    for var in rank_vars:
        if var in os.environ:
            try:
                return "rank", int(os.environ[var])
            except ValueError:
                return None, None
    return None, None


def _k8s_task() -> Tuple[Optional[str], Optional[int]]:
    """(role, index) of a pod of tfaccel's Kubernetes manifests, from the variables and in the order
    tfaccel.cluster.kubernetes reads them (``TFACCEL_K8S_TASKS``, the JobSet labels, ``JOB_COMPLETION_INDEX``);
    (None, None) elsewhere or when they are malformed (the cluster module says why)."""
    env = os.environ
    pod, parts = env.get("JOB_COMPLETION_INDEX", ""), [p.split("=", 1) for p in env.get(_K8S_TASKS, "").split(",")]
    if not pod.isdigit() or any(len(p) != 2 for p in parts):
        return None, None
    if env.get("TFACCEL_JOBSET_NAME"):  # role = replicated job (Trainer v2's "node": workers); jobs, then pods
        mine, job = env.get("TFACCEL_REPLICATED_JOB", ""), env.get("TFACCEL_JOB_INDEX", "")
        for name, size in parts:
            per = size.split("x", 1)[1] if "x" in size else "1"
            if name == mine and job.isdigit() and per.isdigit():
                return ("worker" if name == "node" else name), int(job) * int(per) + int(pod)
    elif env.get("TFACCEL_K8S_JOB_NAME"):  # an Indexed Job: the roles take the indices in the order given
        index = int(pod)
        for name, size in parts:
            if not size.isdigit():
                break
            if index < int(size):
                return name, index
            index -= int(size)
    return None, None


def _loads_bounded(raw: str) -> Any:
    """TF_CONFIG's JSON; ValueError when it is larger than a TF_CONFIG can be (the cluster module says why)."""
    if len(raw) > _MAX_TF_CONFIG:
        raise ValueError("TF_CONFIG too large")
    return json.loads(raw)


def is_chief() -> bool:
    """Whether this process is the job's chief: no cluster, task ``chief``, ``worker 0`` of a cluster without a
    chief, or Horovod/MPI rank 0, or SLURM rank 0 inside ``srun``. Read from the environment (TF_CONFIG,
    ``HOROVOD_RANK``, ``SLURM_PROCID``, ...); builds nothing.

    Every worker runs the whole script, so a plain ``print`` appears once per worker; print (or save, or plot) on
    the chief only with it. tfaccel's own logger (:func:`get_logger`) speaks on the chief only already.

    Returns:
        True on the chief (and outside any cluster).

    Example:
        >>> import tfaccel
        >>> if tfaccel.is_chief():
        ...     print("once per job")
        once per job
    """
    task_type, index = _task_from_environment()
    if task_type is None:
        return True
    if task_type in ("chief", "master"):
        return True
    if task_type == "rank":
        return index == 0
    if task_type == "worker" and index == 0:
        try:
            cluster = _loads_bounded(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})
        except (ValueError, AttributeError, RecursionError):
            return False
        in_pod = any(part.split("=", 1)[0] == "chief" for part in os.environ.get(_K8S_TASKS, "").split(","))
        return "chief" not in cluster and "master" not in cluster and not in_pod
    return False


class _ChiefOnlyFilter(logging.Filter):
    def __init__(self, chief: bool) -> None:
        super().__init__()
        self._chief = chief

    def filter(self, record: logging.LogRecord) -> bool:
        return self._chief or record.levelno >= logging.WARNING or getattr(record, "all_tasks", False)


def configure_logging(*, level: int = logging.INFO, all_tasks: bool = False, prefix: Optional[bool] = None) -> logging.Logger:
    """Sets up tfaccel's logger.

    Args:
        level: logging level. Defaults to INFO.
        all_tasks: log INFO from every task, not only the chief. Warnings always show. Defaults to False.
        prefix: prefix each line with ``[worker 1]``. Defaults to True when this process is part of a cluster,
            unless ``tfaccel launch`` started it (``TFACCEL_OUTPUT_PREFIXED=1``: the launcher prefixes lines).

    Returns:
        The ``tfaccel`` logger.
    """
    global _configured
    logger = logging.getLogger(_LOGGER_NAME)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    task_type, index = _task_from_environment()
    if prefix is None:
        prefix = task_type is not None and os.environ.get(PREFIXED_BY_LAUNCHER_ENV) != "1"
    tag = f"[{task_type} {index}] " if prefix and task_type is not None else ""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"{tag}tfaccel %(levelname)s: %(message)s"))
    handler.addFilter(_ChiefOnlyFilter(all_tasks or is_chief()))
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    _configured = True
    return logger


def get_logger() -> logging.Logger:
    """Returns the ``tfaccel`` logger, configuring it with defaults the first time."""
    if not _configured:
        return configure_logging()
    return logging.getLogger(_LOGGER_NAME)
