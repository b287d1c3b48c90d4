"""``tfaccel launch --backend ray``: run a command on N Ray Train workers (issue 14).

How a launch goes::

    tfaccel launch --backend ray --workers 2 -- python train.py
      launcher (run_ray)         supervises one process, the Ray *driver* (tfaccel's run_job: timeout,
                                 SIGINT/SIGTERM forwarding, grace then SIGKILL of its process group)
        driver (this module)     ray.init (a private local instance on 127.0.0.1, or --address / RAY_ADDRESS),
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
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from tfaccel.errors import EXIT_PREEMPTED, BackendUnavailableError, ConfigError
from tfaccel.launch.envpolicy import check_env_names, job_env, left_out, runtime_env
from tfaccel.launch.local import CHILD_DEFAULT_ENV, child_base_env, normalize_command
from tfaccel.launch.netns import check_network_mode
from tfaccel.launch.restarts import RESTARTS_ENV, is_preempted
from tfaccel.launch.supervisor import (RESTART_ENV, LaunchResult, LaunchTask, describe_returncode, exit_code,
                                       run_job)
from tfaccel.integrations.ray_train import (REPORT_ENV, RUN_DIR_ENV, WORKER_ENV, ray_backup_dir, ray_context,
                                           report_callbacks, report_to_ray)
from tfaccel.log import configure_logging, get_logger

__all__ = ["run_ray", "report_callbacks", "ray_context", "ray_backup_dir", "forwarded_env", "RAY_TESTED", "WORKER_ENV",
           "REPORT_ENV", "RUN_DIR_ENV", "INSTALL_HINT"]

RAY_TESTED = "2.60"  # the Ray versions this module was tested with (setup.cfg's `ray` extra: ray[train]==2.60.*)
INSTALL_HINT = "install Ray Train with `pip install -e '.[cpu,ray]'` (ray[train]==2.60.*)"
# The driver's environment: Ray prints worker lines without its "(RayTrainWorker pid=...)" prefix, colour or
# de-duplication (identical lines of two workers are not merged), so the lines read "[worker 1] ..." as in
# every other tfaccel launch.
DRIVER_ENV = {"RAY_DISABLE_WORKER_LOG_PREFIX": "1", "RAY_DEDUP_LOGS": "0", "RAY_COLOR_PREFIX": "0",
              "PYTHONUNBUFFERED": "1"}
_POLL_S = 0.2


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


# ------------------------------------------------------------------------------------------ inside the workers
# ray_context, ray_backup_dir, report_callbacks, report_to_ray: tfaccel.integrations.ray_train


def _read_reports(path: str, offset: int) -> "tuple[List[Dict[str, Any]], int]":
    """The complete JSON lines appended to ``path`` after ``offset``, and the new offset."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    lines = [json.loads(line) for line in data[:end].decode("utf-8").splitlines() if line.strip()]
    return lines, offset + end


def _worker_env(config: Mapping[str, Any], rank: int, size: int, report_path: str, attempt: int) -> Dict[str, str]:
    env = dict(os.environ)  # the Ray worker's: Ray's TF_CONFIG is in it
    # Ray's TensorflowConfig sets TF_USE_LEGACY_KERAS=1 (for tf_keras); tfaccel trains Keras 3 models.
    env.pop("TF_USE_LEGACY_KERAS", None)
    for key, value in CHILD_DEFAULT_ENV.items():
        env.setdefault(key, value)
    env.update(config["env"])
    env.update({WORKER_ENV: f"{rank}/{size}", REPORT_ENV: report_path, RESTART_ENV: str(attempt)})
    if config.get("run_dir"):
        env[RUN_DIR_ENV] = config["run_dir"]
    return env


def enter_launch_dir(cwd: Optional[str]) -> None:
    """Changes this Ray Train worker's directory to the launcher's, so relative paths in the command mean what they
    meant where ``tfaccel launch`` ran (Ray Train's own is a per-run artifacts directory); warns where the
    directory does not exist on this node.

    Args:
        cwd: the launcher's working directory; None leaves the directory as it is.
    """
    if not cwd:
        return
    if os.path.isdir(cwd):
        os.chdir(cwd)
        return
    get_logger().warning("launch: the launcher's working directory %s does not exist on Ray node %s; the command "
                         "runs in %s (give absolute paths, or the same directory on every node)", cwd,
                         _node_ip(), os.getcwd())


def _node_ip() -> str:
    import ray.util

    return str(ray.util.get_node_ip_address())


def _check_tf_config(rank: int, size: int) -> None:
    from tfaccel.cluster import task_from_tf_config

    info = task_from_tf_config(os.environ.get("TF_CONFIG", ""), source="TF_CONFIG set by Ray Train")
    if info is None or info.name != f"worker:{rank}" or len(info.spec.roles.get("worker", ())) != size:
        raise ConfigError(f"TF_CONFIG set by Ray Train: expected worker:{rank} of {size} workers; received "
                          f"{os.environ.get('TF_CONFIG')!r}; use ray.train.tensorflow.TensorflowTrainer "
                          f"(ray {RAY_TESTED}.*)")


def _train_loop(config: Dict[str, Any]) -> None:
    """Ray Train's function on every worker: run the command under run_job, pass its reports on to Ray."""
    import ray
    import ray.train

    context = ray.train.get_context()
    rank, size = int(context.get_world_rank()), int(context.get_world_size())
    _check_tf_config(rank, size)
    # The worker's run_job speaks only when the command fails (its "job finished OK" is not the launch's).
    configure_logging(level=logging.WARNING)
    state = config["state"]
    attempt = int(ray.get(state.started.remote(rank)))
    enter_launch_dir(config.get("cwd"))
    scratch = config.get("scratch")
    if scratch:  # a directory the driver removes: Ray kills the workers it stops, leaving their temporary files
        os.makedirs(scratch, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tfaccel-ray-worker-", dir=scratch) as tmp:
        report_path = os.path.join(tmp, "reports.jsonl")
        env = _worker_env(config, rank, size, report_path, attempt)
        task = LaunchTask("worker", rank, tuple(config["argv"]), env)
        box: Dict[str, LaunchResult] = {}
        runner = threading.Thread(target=lambda: box.update(result=run_job(  # Ray restarts, not this run_job
            lambda _attempt: [task], grace=config["grace"], capture_lines=config["capture_lines"],
            count_preemptions=True)),
            name=f"tfaccel-ray-worker-{rank}", daemon=True)
        runner.start()
        offset = 0
        while runner.is_alive():
            runner.join(_POLL_S)
            reports, offset = _read_reports(report_path, offset)
            for report in reports:
                report_to_ray(report["metrics"], is_chief=bool(report.get("chief")))
        reports, offset = _read_reports(report_path, offset)
        result = box.get("result")
        if result is not None and result.ok:
            for report in reports:
                report_to_ray(report["metrics"], is_chief=bool(report.get("chief")))
            return
    outcome = result.tasks[0] if result is not None and result.tasks else None
    rc = outcome.returncode if outcome is not None else None
    if is_preempted(rc):  # not a Ray failure (counted by Ray): the driver restarts the run, uncounted
        ray.get(state.preempted.remote(rank, attempt, time.time()))
        return
    message = (f"worker:{rank} (pid {outcome.pid if outcome else '?'}, Ray node {_node_ip()}) "
               f"failed: {describe_returncode(rc)}")
    ray.get(state.failed.remote(rank, attempt, exit_code(rc) if rc is not None else 1, message, time.time()))
    raise RuntimeError(f"tfaccel: {message}")


def _job_state_class() -> Any:
    import ray

    @ray.remote(num_cpus=0)
    class JobState:
        """Counts each worker's starts (the restart count) and records failures in the order they happen."""

        def __init__(self) -> None:
            self.starts: Dict[int, int] = {}
            self.failures: List[Dict[str, Any]] = []
            self.preemptions: List[Dict[str, Any]] = []

        def started(self, rank: int) -> int:
            self.starts[rank] = self.starts.get(rank, 0) + 1
            return self.starts[rank] - 1

        def failed(self, rank: int, attempt: int, code: int, message: str, when: float) -> None:
            self.failures.append({"rank": rank, "attempt": attempt, "code": code, "message": message, "when": when})

        def preempted(self, rank: int, attempt: int, when: float) -> None:
            self.preemptions.append({"rank": rank, "attempt": attempt, "when": when})

        def summary(self) -> Dict[str, Any]:
            return {"attempts": max(self.starts.values(), default=0), "failures": self.failures,
                    "preemptions": self.preemptions}

    return JobState


# ------------------------------------------------------------------------------------------------ the driver
@dataclasses.dataclass(frozen=True)
class _DriverSpec:
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


def _init_ray(spec: _DriverSpec) -> str:
    import ray

    if spec.address:
        ray.init(address=spec.address, log_to_driver=True)
        return f"joined the Ray cluster at {spec.address}"
    # A private instance: this host only, on loopback, CPUs for exactly the workers; it ends with this process.
    # Without a dashboard Ray's State API is unavailable, and Ray Train's placement-group cleaner (which asks it
    # whether the controller is alive) warns about it every second: Ray's own loggers say errors only.
    # Its session files (logs, sockets) go to the launch's temporary directory, removed with it; unless that path is
    # too long for Ray's unix sockets (107 bytes with the session's name and socket file after it).
    temp_dir = os.path.join(os.path.dirname(spec.result_path), "ray")
    extra = {"_temp_dir": temp_dir} if len(temp_dir) <= 48 else {}
    ray.init(num_cpus=spec.workers, _node_ip_address="127.0.0.1", include_dashboard=False, log_to_driver=True,
             logging_config=ray.LoggingConfig(log_level="ERROR"), **extra)
    return f"started a private local Ray instance on 127.0.0.1 with {spec.workers} CPU(s)"


def first_failure(summary: Mapping[str, Any], error: BaseException) -> Dict[str, Any]:
    """The failure that ended a Ray Train run, from the restart-counting actor's summary and Ray's error.

    In the last attempt: a Ray worker *process* that died (in Ray's ``worker_failures`` with no failure reported
    by tfaccel's train function: killed, or out of memory) comes first, since its peers' commands fail only
    because of it; else the earliest command that failed; else Ray's error itself.

    Args:
        summary: ``{"attempts", "failures"}`` of the job's state actor (each failure: rank, attempt, code,
            message, when).
        error: what ``TensorflowTrainer.fit()`` raised (``WorkerGroupError`` has ``worker_failures``).

    Returns:
        ``{"rank", "code", "message"}``; rank is None when no worker can be named.
    """
    last = max(0, int(summary.get("attempts") or 1) - 1)
    recorded = [f for f in summary.get("failures") or [] if f["attempt"] == last]
    seen = getattr(error, "worker_failures", None) or {}
    died = sorted(set(seen) - {f["rank"] for f in recorded})
    if died:
        cause = str(seen[died[0]]).strip().splitlines()
        return {"rank": died[0], "code": 1,
                "message": f"worker:{died[0]} (Ray Train worker process) failed: {cause[-1] if cause else '?'}"}
    if recorded:
        return min(recorded, key=lambda f: f["when"])
    return {"rank": None, "code": 1, "message": f"Ray Train failed: {type(error).__name__}: {error}"}


def _scratch_dir(spec: _DriverSpec, run_dir: Optional[str]) -> Optional[str]:
    """Where the workers keep their temporary files: the launch's temporary directory for a private instance, the
    run's directory in Ray's (shared) storage on a cluster, else the system's (left behind by killed workers)."""
    if not spec.address:
        return os.path.join(os.path.dirname(spec.result_path), "workers")
    return os.path.join(run_dir, ".tfaccel-workers") if run_dir else None


def _driver(spec: _DriverSpec) -> Dict[str, Any]:
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    log = get_logger()
    log.info("launch: %s (ray %s)", _init_ray(spec), ray.__version__)
    run_dir = os.path.join(spec.storage_path, spec.name) if spec.storage_path and os.path.isabs(
        spec.storage_path) else None
    scratch = _scratch_dir(spec, run_dir)
    try:
        state = _job_state_class().remote()
        restarts = {RESTARTS_ENV: os.environ[RESTARTS_ENV]} if os.environ.get(RESTARTS_ENV) else {}
        config = {"argv": spec.argv, "env": {**spec.env, **restarts}, "grace": spec.grace,
                  "capture_lines": spec.capture_lines,
                  "state": state, "run_dir": run_dir, "cwd": spec.cwd, "scratch": scratch}
        trainer = TensorflowTrainer(
            _train_loop, train_loop_config=config, scaling_config=ScalingConfig(num_workers=spec.workers),
            run_config=RunConfig(name=spec.name, storage_path=spec.storage_path,
                                 failure_config=FailureConfig(max_failures=spec.max_restarts)))
        error: Optional[BaseException] = None
        result = None
        try:
            result = trainer.fit()
        except Exception as exc:  # noqa: BLE001 - TrainingFailedError and whatever Ray raises instead
            error = exc
        summary = ray.get(state.summary.remote())
    finally:
        ray.shutdown()
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    out: Dict[str, Any] = {"restarts": max(0, summary["attempts"] - 1), "failures": summary["failures"]}
    preempted = [p for p in summary["preemptions"] if p["attempt"] == max(0, summary["attempts"] - 1)]
    if preempted:  # the launcher restarts the run from its backup (tfaccel.launch.restarts), uncounted
        out.update(returncode=EXIT_PREEMPTED, failed_worker=preempted[0]["rank"],
                   message=f"worker:{preempted[0]['rank']} was preempted: exit code {EXIT_PREEMPTED} (every worker "
                           "stopped at an agreed step, backup written)")
        return out
    if error is None and result is not None:
        out.update(returncode=0, metrics=result.metrics, path=str(result.path),
                   checkpoint=result.checkpoint.path if result.checkpoint is not None else None)
        return out
    failure = first_failure(summary, error)
    out.update(returncode=failure["code"] or 1, failed_worker=failure["rank"], message=failure["message"])
    return out


def driver_main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m tfaccel.launch.ray SPEC.json``: the Ray driver process of :func:`run_ray`."""
    args = list(sys.argv[1:] if argv is None else argv)
    spec = _DriverSpec(**json.loads(Path(args[0]).read_text()))
    log = get_logger()
    out = _driver(spec)
    Path(spec.result_path).write_text(json.dumps(out, default=str))
    if out["returncode"]:
        say = log.warning if is_preempted(out["returncode"]) else log.error
        say("launch: %s%s", out["message"], f" (after {out['restarts']} restart(s))" if out["restarts"] else "")
    else:
        log.info("launch: Ray Train finished OK%s; result in %s",
                 f" after {out['restarts']} restart(s)" if out["restarts"] else "", out["path"])
    return int(out["returncode"])


# ---------------------------------------------------------------------------------------------- the launcher
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


def _check_options(workers: Any, max_restarts: Any, timeout: Any, address: Optional[str]) -> None:
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


def run_ray(cmd: Union[str, Sequence[str]], *, workers: int = 2, address: Optional[str] = None,
            max_restarts: int = 0, timeout: Optional[float] = None, env: Optional[Mapping[str, str]] = None,
            storage_path: Optional[str] = None, name: Optional[str] = None, grace: float = 10.0,
            echo: bool = True, capture_lines: Optional[int] = None, network: str = "auto",
            forward: Sequence[str] = ()) -> LaunchResult:
    """Runs ``cmd`` on ``workers`` Ray Train workers (``TensorflowTrainer``) and waits for it.

    Every worker runs the command with the TF_CONFIG Ray Train gives it (workers only; worker 0 is the chief),
    ``TFACCEL_RESTART_COUNT`` and tfaccel's report channel; its output is streamed with a ``[worker i]`` prefix.
    The first worker whose command exits non-zero fails the run: Ray stops the others, and then restarts the
    whole worker group up to ``max_restarts`` times (Ray's ``FailureConfig(max_failures=...)``).

    Args:
        cmd: the command (argv list, or a string split like a shell without running one); it must exist on
            every Ray node (at the same path). It runs in the launcher's working directory where that exists on
            the node (else in Ray's, with a warning), with the node's environment plus the job's variables
            (:func:`forwarded_env`: ``TFACCEL_*``, ``TF_*`` and ``forward``; nothing else of the launcher's).
        workers: number of Ray Train workers (one CPU each). Defaults to 2.
        address: the Ray cluster to join (``host:port`` of the head, ``auto``, ``ray://...``). Defaults to
            ``$RAY_ADDRESS``; without either a private local Ray instance is started on 127.0.0.1 with
            ``workers`` CPUs and stopped afterwards.
        max_restarts: how many times Ray restarts the worker group after a failure. Defaults to 0.
        timeout: bound on the whole run in seconds; None for no bound. Defaults to None.
        env: extra environment for the command on every worker (over the forwarded one). Defaults to None.
        forward: names of variables of this environment the workers get too (``--env NAME``); each must be set.
            Defaults to none.
        storage_path: Ray Train's run storage (``RunConfig.storage_path``; shared by every node on a cluster).
            Defaults to Ray's (``~/ray_results``).
        name: the run's name in the storage. Defaults to ``tfaccel-<time>-<pid>``.
        grace: seconds between SIGTERM and SIGKILL when processes are stopped. Defaults to 10.
        echo: stream the output. Defaults to True.
        capture_lines: keep only the last N output lines in the result. Defaults to all.
        network: for a private local instance: ``"private"`` runs the driver, Ray and every worker in a
            loopback-only network namespace (see :mod:`tfaccel.launch.netns`), ``"host"`` on this machine's
            network, ``"auto"`` private where possible. With an address the real network is used. Defaults to
            "auto".

    Returns:
        A ``LaunchResult`` with one task, ``ray:0`` (the driver); ``returncode`` is the failing worker's exit
        code (128 + N for signal N; 124 on timeout), ``failed_task`` names the worker (``"worker:1"``),
        ``restarts`` counts Ray's restarts, and ``tasks[0].value`` holds Ray's result (``metrics``,
        ``checkpoint``, ``path``) or the failure.

    Raises:
        ConfigError: bad arguments, a ``forward`` name that is malformed or not set, or ``network="private"``
            with an address.
        BackendUnavailableError: Ray Train is not installed.

    Example:
        >>> from tfaccel.launch import run_ray
        >>> result = run_ray(["python", "train.py"], workers=2)  # doctest: +SKIP
        >>> result.returncode, result.tasks[0].value["metrics"]["epoch"]  # doctest: +SKIP
        (0, 3)
    """
    address = address if address is not None else (os.environ.get("RAY_ADDRESS") or None)
    _check_options(workers, max_restarts, timeout, address)
    forward = check_env_names(forward)
    check_network_mode(network)
    if address is not None:
        if network == "private":
            raise ConfigError(f"network='private': a private network namespace has only loopback, but the run "
                              f"joins the Ray cluster at {address!r}; use --network host or leave --address out")
        network = "host"
    check_ray_installed()
    argv, notes = normalize_command(cmd, check_exists=address is None)
    log = get_logger()
    for note in notes:
        log.info("launch: %s", note)
    tmp = tempfile.TemporaryDirectory(prefix="tfaccel-ray-")
    try:
        spec = _DriverSpec(argv=list(argv), workers=workers, address=address, max_restarts=max_restarts,
                           storage_path=os.path.abspath(storage_path) if storage_path else None,
                           name=name or f"tfaccel-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}",
                           env={**forwarded_env(names=forward), **CHILD_DEFAULT_ENV, **dict(env or {})}, grace=grace,
                           capture_lines=capture_lines, result_path=os.path.join(tmp.name, "result.json"),
                           cwd=os.getcwd())
        spec_path = Path(tmp.name, "spec.json")
        spec_path.write_text(json.dumps(dataclasses.asdict(spec)))
        driver_env = _driver_env(address, forward, spec.env)
        driver_env.pop("RAY_ADDRESS", None)  # the spec says where to run
        driver_env.update(DRIVER_ENV)
        driver_env.pop("TFACCEL_OUTPUT_PREFIXED", None)  # the driver's own log lines are not prefixed by Ray
        where = f"the Ray cluster at {address}" if address else "a private local Ray instance on 127.0.0.1"
        log.info("launch: %d Ray Train worker(s) on %s%s: %s", workers, where,
                 f", up to {max_restarts} restart(s)" if max_restarts else "", " ".join(argv))
        task = _DriverTask("ray", 0, (sys.executable, "-m", "tfaccel.launch.ray", str(spec_path)), driver_env)
        result = run_job(lambda _attempt: [task], timeout=timeout, grace=grace, echo=echo,
                         capture_lines=capture_lines, network=network)
        return _merge_driver_result(result, Path(spec.result_path))
    finally:
        tmp.cleanup()


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


if __name__ == "__main__":
    # Run the driver from the module under its real name, so that Ray pickles the train function by reference.
    from tfaccel.launch.ray import driver_main as _main

    sys.exit(_main())
