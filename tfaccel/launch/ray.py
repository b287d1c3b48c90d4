"""``tfaccel launch --backend ray``: run a command on N Ray Train workers (issue 14).

How a launch goes::

    tfaccel launch --backend ray --workers 2 -- python train.py
      launcher (run_ray)         supervises one process, the Ray *driver* (tfaccel's run_job: timeout,
                                 SIGINT/SIGTERM forwarding, grace then SIGKILL of its process group)
        driver (ray_driver.py)   ray.init (a private local instance on 127.0.0.1, or --address / RAY_ADDRESS),
                                 TensorflowTrainer(N workers, FailureConfig(max_failures=--max-restarts)).fit()
          Ray Train worker i     Ray sets TF_CONFIG (workers only, worker 0 is the chief); tfaccel's train function
                                 runs the command as a child process under run_job (in the launcher's working
                                 directory, with the node's environment plus the job's variables: TFACCEL_*,
                                 TF_* and what --env names, never the rest of the launcher's), which streams its output
                                 with a ``[worker i]`` prefix (Ray forwards it to the driver, unprefixed by Ray)
                                 and reports its exit status; a non-zero status fails the worker group.

Ray restarts the whole worker group after a failure (up to ``max_restarts`` times); a command that passes
``backup_dir`` to ``compile_and_fit`` resumes from tfaccel's last backup, so the result equals an uninterrupted
run. The command runs with no Ray code: ``strategy="auto"`` sees Ray's TF_CONFIG and picks multi_worker.

Metrics reach Ray's ``Result`` through :func:`report_callbacks`: a Keras callback that calls ``ray.train.report``
at every epoch end on every worker (Ray's report is a barrier), the chief attaching a small checkpoint
(``tfaccel.json``: epoch, metrics, the path of tfaccel's latest checkpoint). In a command started by this
launcher the callback writes its reports to a file that the Ray worker reads and passes on; inside a user's own
Ray Train function (``TensorflowTrainer(train_func)`` calling ``tfaccel.compile_and_fit``) it calls
``ray.train.report`` directly.

Tested with ray 2.60 (Ray Train v2). Importing this module does not import Ray or TensorFlow.
"""

import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from tfaccel.errors import BackendUnavailableError, ConfigError
from tfaccel.integrations.ray_train import (REPORT_ENV, RUN_DIR_ENV, WORKER_ENV, ray_backup_dir, ray_context,
                                           report_callbacks)
from tfaccel.job_id import new_job_id
from tfaccel.launch.command import CHILD_DEFAULT_ENV, child_base_env, export_job_id, normalize_command
from tfaccel.launch.envpolicy import check_env_names, job_env, left_out, runtime_env
from tfaccel.launch.netns import check_network_mode
from tfaccel.launch.outcome import LaunchResult, LaunchTask
from tfaccel.launch.restarts import RestartBudget
from tfaccel.launch.supervisor import run_job
from tfaccel.log import get_logger

__all__ = ["run_ray", "report_callbacks", "ray_context", "ray_backup_dir", "forwarded_env", "RAY_TESTED", "WORKER_ENV",
           "REPORT_ENV", "RUN_DIR_ENV", "INSTALL_HINT", "DriverSpec", "check_ray_installed"]

RAY_TESTED = "2.60"  # the Ray versions this module was tested with (setup.cfg's `ray` extra: ray[train]==2.60.*)
INSTALL_HINT = "install Ray Train with `pip install -e '.[cpu,ray]'` (ray[train]==2.60.*)"
# The driver's environment: Ray prints worker lines without its "(RayTrainWorker pid=...)" prefix, colour or
# de-duplication (identical lines of two workers are not merged), so the lines read "[worker 1] ..." as in
# every other tfaccel launch.
DRIVER_ENV = {"RAY_DISABLE_WORKER_LOG_PREFIX": "1", "RAY_DEDUP_LOGS": "0", "RAY_COLOR_PREFIX": "0",
              "PYTHONUNBUFFERED": "1"}


def forwarded_env(environ: Optional[Mapping[str, str]] = None, names: Sequence[str] = ()) -> Dict[str, str]:
    """What of the launcher's environment the workers' commands get (inside Ray's ``train_loop_config``): an
    allowlist, ``TFACCEL_*`` and ``TF_*`` (not TF_CONFIG) and the ``names`` given with ``--env NAME``; never the
    rest (a secret such as ``AWS_SECRET_ACCESS_KEY`` stays home unless named).

    Example:
        >>> forwarded_env({"PATH": "/bin", "AWS_SECRET_ACCESS_KEY": "s", "EPOCHS": "2", "TF_CPP_MIN_LOG_LEVEL": "2"},
        ...               names=["EPOCHS"])
        {'EPOCHS': '2', 'TF_CPP_MIN_LOG_LEVEL': '2'}
    """
    return job_env(environ, names)


@dataclasses.dataclass(frozen=True)
class DriverSpec:
    """What the launcher tells the Ray driver (:mod:`tfaccel.launch.ray_driver`), as a JSON file."""

    argv: List[str]
    workers: int
    address: Optional[str]
    max_restarts: int
    storage_path: Optional[str]
    name: str
    env: Dict[str, str]
    grace: float
    capture_lines: Optional[int]
    result_path: str
    cwd: Optional[str] = None


def check_ray_installed() -> str:
    """The installed Ray's version.

    Raises:
        BackendUnavailableError: Ray Train is not installed.
    """
    try:
        import ray
        import ray.train  # noqa: F401
    except ImportError as exc:
        raise BackendUnavailableError(f"launch --backend ray: Ray Train is not importable here ({exc}); "
                                      f"{INSTALL_HINT}") from None
    if not ray.__version__.startswith(RAY_TESTED + "."):
        get_logger().warning("launch: ray %s is installed; tfaccel was tested with ray %s.*", ray.__version__,
                             RAY_TESTED)
    return ray.__version__


def _check_options(workers: Any, max_restarts: Any, timeout: Any, address: Optional[str], forward: Sequence[str],
                   network: str) -> Tuple[Optional[str], Tuple[str, ...], str]:
    """Checks run_ray's options: ``(address, forward, network)`` with ``$RAY_ADDRESS`` and the network resolved."""
    address = address if address is not None else (os.environ.get("RAY_ADDRESS") or None)
    for name, value, minimum in (("workers", workers, 1), ("max_restarts", max_restarts, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(f"{name}: must be a whole number >= {minimum}; received {value!r}. Example: "
                              "tfaccel launch --backend ray --workers 2 --max-restarts 1 -- python train.py")
    if timeout is not None and timeout <= 0:
        raise ConfigError(f"timeout: must be a positive number of seconds or None; received {timeout!r}")
    if address is not None and not str(address).strip():
        raise ConfigError("address: received an empty address; give the head's host:port (e.g. 10.0.0.1:6379), "
                          "`auto` for the cluster of this machine's `ray start`, or leave it out for a private "
                          "local instance")
    forward = check_env_names(forward)
    check_network_mode(network)
    if address is not None:
        if network == "private":
            raise ConfigError(f"network='private': a private network namespace has only loopback, but the run "
                              f"joins the Ray cluster at {address!r}; use --network host or leave --address out")
        network = "host"
    return address, forward, network


def run_ray(cmd: Union[str, Sequence[str]], *, workers: int = 2, address: Optional[str] = None,
            max_restarts: int = 0, timeout: Optional[float] = None, env: Optional[Mapping[str, str]] = None,
            storage_path: Optional[str] = None, name: Optional[str] = None, grace: float = 10.0,
            echo: bool = True, capture_lines: Optional[int] = None, network: str = "auto",
            forward: Sequence[str] = (), job_id: Optional[str] = None, count_preemptions: bool = False,
            record: Optional[RestartBudget] = None) -> LaunchResult:
    """Runs ``cmd`` on ``workers`` Ray Train workers (``TensorflowTrainer``) and waits for it.

    Every worker runs the command with the TF_CONFIG Ray Train gives it (workers only; worker 0 is the chief),
    ``TFACCEL_RESTART_COUNT`` and tfaccel's report channel, output prefixed ``[worker i]``. The first worker whose
    command exits non-zero fails the run; Ray then restarts the whole worker group up to ``max_restarts`` times.

    Args:
        cmd: the command (argv list, or a string split like a shell without running one), present on every Ray
            node at the same path. It runs in the launcher's working directory where that exists on the node,
            with the node's environment plus :func:`forwarded_env` (``TFACCEL_*``, ``TF_*``, ``forward``) and ``env``.
        workers: number of Ray Train workers (one CPU each). Defaults to 2.
        address: the Ray cluster to join (``host:port`` of the head, ``auto``, ``ray://...``). Defaults to
            ``$RAY_ADDRESS``; without either, a private local Ray instance on 127.0.0.1 (``workers`` CPUs).
        max_restarts, count_preemptions: how many times Ray restarts the worker group after a failure; whether a
            preemption (exit 75) ends the launch (else the run restarts, uncounted). Defaults to 0, False.
        timeout: bound on the whole run in seconds; None for no bound. Defaults to None.
        env: extra environment for the command on every worker. Defaults to None.
        forward: names of variables of this environment the workers get too (``--env NAME``); each must be set.
        job_id: ``TFACCEL_JOB_ID`` of every worker, kept across Ray's restarts (:mod:`tfaccel.job_id`). Defaults to
            the environment's (``TFACCEL_JOB_ID``, ``SLURM_JOB_ID``), else a new one.
        storage_path: Ray Train's run storage (shared by every node of a cluster). Defaults to ``~/ray_results``.
        name: the run's name in the storage. Defaults to ``tfaccel-<time>-<pid>``.
        grace, echo, capture_lines, record: as for :func:`tfaccel.launch.supervisor.run_job` (``record``:
            ``run_elastic``'s restart record, handed to the workers; one Ray run, never restarted here).
        network: for a private local instance, ``"private"`` (driver, Ray and workers in a loopback-only network
            namespace), ``"host"`` or ``"auto"``; with an address the real network is used. Defaults to "auto".

    Returns:
        A ``LaunchResult`` with one task, ``ray:0`` (the driver): ``returncode`` the failing worker's exit code
        (124 on timeout), ``failed_task`` its name, ``restarts`` Ray's restarts, ``tasks[0].value`` Ray's result.

    Raises:
        ConfigError: bad arguments, a bad ``forward`` name, or ``network="private"`` with an address.
        BackendUnavailableError: Ray Train is not installed.

    Example:
        >>> result = run_ray(["python", "train.py"], workers=2)  # doctest: +SKIP
    """
    address, forward, network = _check_options(workers, max_restarts, timeout, address, forward, network)
    check_ray_installed()
    argv = _argv(cmd, address)
    tmp = tempfile.TemporaryDirectory(prefix="tfaccel-ray-")
    try:
        spec = DriverSpec(argv=list(argv), workers=workers, address=address, max_restarts=max_restarts,
                          storage_path=os.path.abspath(storage_path) if storage_path else None,
                          name=name or f"tfaccel-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}",
                          env=_job_env(env, forward, job_id), grace=grace, capture_lines=capture_lines,
                          result_path=os.path.join(tmp.name, "result.json"), cwd=os.getcwd())
        task = _driver_task(spec, Path(tmp.name, "spec.json"), forward)
        result = run_job(lambda _attempt: [task], timeout=timeout, grace=grace, echo=echo, capture_lines=capture_lines,
                         network=network, count_preemptions=count_preemptions, record=record)
        return _merge_driver_result(result, Path(spec.result_path))
    finally:
        tmp.cleanup()


def _argv(cmd: Union[str, Sequence[str]], address: Optional[str]) -> Tuple[str, ...]:
    """The command's argv (checked to exist for a private local instance); the notes on it logged."""
    argv, notes = normalize_command(cmd, check_exists=address is None)
    for note in notes:
        get_logger().info("launch: %s", note)
    return argv


def _job_env(env: Optional[Mapping[str, str]], forward: Sequence[str], job_id: Optional[str]) -> Dict[str, str]:
    """What the workers' commands get on top of their node's environment: :func:`forwarded_env`, the launch's
    defaults, ``env`` and the job's id (``TFACCEL_JOB_ID``, the same for every worker and every restart)."""
    job = {**forwarded_env(names=forward), **CHILD_DEFAULT_ENV, **dict(env or {})}
    export_job_id(job, job_id, lambda: new_job_id("ray"), source={**os.environ, **dict(env or {})})
    return job


def _driver_task(spec: DriverSpec, spec_path: Path, forward: Sequence[str]) -> LaunchTask:
    """Writes the driver's spec and returns the driver's task: ``python -m tfaccel.launch.ray_driver SPEC``."""
    spec_path.write_text(json.dumps(dataclasses.asdict(spec)))
    driver_env = _driver_env(spec.address, forward, spec.env)
    driver_env.pop("RAY_ADDRESS", None)  # the spec says where to run
    driver_env.update(DRIVER_ENV)
    driver_env.pop("TFACCEL_OUTPUT_PREFIXED", None)  # the driver's own log lines are not prefixed by Ray
    where = f"the Ray cluster at {spec.address}" if spec.address else "a private local Ray instance on 127.0.0.1"
    get_logger().info("launch: %d Ray Train worker(s) on %s%s: %s", spec.workers, where,
                      f", up to {spec.max_restarts} restart(s)" if spec.max_restarts else "", " ".join(spec.argv))
    return _DriverTask("ray", 0, (sys.executable, "-m", "tfaccel.launch.ray_driver", str(spec_path)), driver_env)


def _driver_env(address: Optional[str], forward: Sequence[str], job: Mapping[str, str]) -> Dict[str, str]:
    """The Ray driver's environment. A private instance's Ray processes and workers inherit it, so there it is the
    allowlist (:func:`tfaccel.launch.envpolicy.runtime_env`, plus Ray's own ``RAY_*`` settings); the driver that
    joins a cluster keeps this environment (the cluster's workers have their nodes')."""
    base = child_base_env()
    env = runtime_env(base, forward)
    env.update({k: v for k, v in base.items() if k.startswith("RAY_")})
    left = left_out(base, {**env, **job})
    if left:
        get_logger().info("launch: the Ray workers get TFACCEL_*, TF_* and the variables named with --env; not "
                          "passed on: %s; name one with --env NAME", left)
    return base if address else env


class _DriverTask(LaunchTask):
    """The Ray driver's process: its lines pass through unprefixed (the workers' already read ``[worker i]``)."""

    @property
    def prefix(self) -> str:
        """No prefix."""
        return ""


def _merge_driver_result(result: LaunchResult, path: Path) -> LaunchResult:
    """The launch result in Ray's terms: the failing worker's name and code, Ray's restarts and result."""
    if not path.exists():  # the driver did not finish (timeout, interrupt, crash): the supervisor's verdict holds
        return result
    out = json.loads(path.read_text())
    if result.tasks:
        result.tasks[0].value = out
    result.restarts += int(out.get("restarts", 0))  # Ray's restarts of the last run, after the driver's own
    if out.get("returncode"):
        rank = out.get("failed_worker")
        result.failed_task = f"worker:{rank}" if rank is not None else result.failed_task
        result.message = out.get("message") or result.message
        result.returncode = int(out["returncode"])
    return result
