"""One identity per training job, shared by every task of the job and kept across its restarts: ``TFACCEL_JOB_ID``.

Backups and the evaluator's progress file record the job that wrote them (:mod:`tfaccel.resilience.backup_guard`), so
that two jobs given one directory are told apart and a restarted job resumes its own backups. Every launcher
exports one id per launch to every task it starts (chief, workers, ps, evaluator, Horovod ranks, Ray workers) and
keeps it across its restarts. Where the id comes from, the first that applies:

1. the launch's own ``job_id`` (``tfaccel launch --job-id ID``);
2. ``TFACCEL_JOB_ID`` already in the environment (set by the user or a scheduler);
3. ``SLURM_JOB_ID``, as ``slurm-<id>``: the same on every node of an allocation, and after a requeue;
4. the launcher's own: a new id per launch (a local cluster, horovodrun, Ray), or for one host's task of a
   cluster file an id derived from the cluster (``cluster-<hash>``), the same on every host without any
   coordination -- and the same for every run of that file: give ``--job-id`` to tell runs apart.

Training code without a launcher reads 2 and 3 as well (:func:`environment_job_id`). A Kubeflow TFJob made by
``tfaccel tf-config --tfjob`` sets ``TFACCEL_JOB_ID`` to the TFJob's name in every replica.

This module imports neither TensorFlow nor anything of tfaccel's training code: launchers use it.
"""

import hashlib
import json
import os
import re
import time
import uuid
from typing import Any, Callable, Mapping, Optional

from tfaccel.errors import ConfigError

__all__ = ["JOB_ID_ENV", "SLURM_JOB_ENV", "check_job_id", "environment_job_id", "new_job_id", "cluster_job_id",
           "launch_job_id"]

JOB_ID_ENV = "TFACCEL_JOB_ID"
SLURM_JOB_ENV = "SLURM_JOB_ID"
_JOB_ID_RE = re.compile(r"^[A-Za-z0-9._:@+-]{1,128}$")


def check_job_id(value: Any, *, source: str = JOB_ID_ENV) -> str:
    """Returns ``value`` when it is a valid job id: 1-128 letters, digits and ``._:@+-``.

    Raises:
        ConfigError: it is not; the message names ``source`` and shows what was received.

    Example:
        >>> check_job_id("mnist-run-3")
        'mnist-run-3'
    """
    if not isinstance(value, str) or not _JOB_ID_RE.match(value):
        shown = repr(value) if len(repr(value)) <= 200 else repr(value)[:200] + "..."
        raise ConfigError(f"{source} must be 1-128 characters of letters, digits and ._:@+-; received {shown}. "
                          "Set it to one name per job (the same on every task and restart), e.g. mnist-run-3")
    return value


def environment_job_id(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The job id the environment gives: ``TFACCEL_JOB_ID``, else ``slurm-<SLURM_JOB_ID>``; None without either.

    Raises:
        ConfigError: ``TFACCEL_JOB_ID`` or ``SLURM_JOB_ID`` is set but malformed.

    Example:
        >>> environment_job_id({"SLURM_JOB_ID": "4711"}), environment_job_id({})
        ('slurm-4711', None)
    """
    env = os.environ if environ is None else environ
    given = env.get(JOB_ID_ENV)
    if given is not None:
        return check_job_id(given)
    slurm = env.get(SLURM_JOB_ENV)
    if slurm:
        return check_job_id(f"slurm-{slurm}", source=SLURM_JOB_ENV)
    return None


def new_job_id(kind: str) -> str:
    """A new id for one launch, e.g. ``local-20261125-171203-3f9a1c2b`` (time for people, random for uniqueness)."""
    return f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"


def cluster_job_id(spec: Any) -> str:
    """An id derived from a cluster (``cluster-<hash>`` of its roles and addresses): every host computes the same.

    Example:
        >>> from tfaccel.cluster import ClusterSpec
        >>> cluster_job_id(ClusterSpec.from_hosts(workers=["a:1", "b:1"]))
        'cluster-7c370f5e8707'
    """
    text = json.dumps({role: list(addresses) for role, addresses in spec.roles.items()}, sort_keys=True)
    return "cluster-" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def launch_job_id(job_id: Optional[str], environ: Mapping[str, str], default: Callable[[], str]) -> str:
    """The id a launch exports to its tasks: ``job_id``, else :func:`environment_job_id`, else ``default()``.

    Args:
        job_id: the launch's own (``--job-id``), or None.
        environ: the environment the tasks start from.
        default: makes the launcher's own id (:func:`new_job_id`, :func:`cluster_job_id`).

    Raises:
        ConfigError: a given id is malformed.
    """
    if job_id is not None:
        return check_job_id(job_id, source="job_id (--job-id)")
    return environment_job_id(environ) or check_job_id(default(), source="the launcher's job id")
