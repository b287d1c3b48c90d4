"""The Ray driver process of ``tfaccel launch --backend ray``: ``python -m tfaccel.launch.ray_driver SPEC.json``.

It joins a Ray cluster (or starts a private local instance on 127.0.0.1), runs ``TensorflowTrainer`` with
:func:`tfaccel.launch.ray_worker.train_loop` on N workers and ``FailureConfig(max_failures=max_restarts)``, and
writes what happened (metrics and checkpoint, or the first failure) to the spec's ``result_path`` for the
launcher. Importing this module does not import Ray or TensorFlow.
"""

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence

from tfaccel.launch.ray import DriverSpec
from tfaccel.launch.ray_worker import job_state_class, train_loop
from tfaccel.log import get_logger

__all__ = ["driver_main", "first_failure"]


def _init_ray(spec: DriverSpec) -> str:
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


def _scratch_dir(spec: DriverSpec, run_dir: Optional[str]) -> Optional[str]:
    """Where the workers keep their temporary files: the launch's temporary directory for a private instance, the
    run's directory in Ray's (shared) storage on a cluster, else the system's (left behind by killed workers)."""
    if not spec.address:
        return os.path.join(os.path.dirname(spec.result_path), "workers")
    return os.path.join(run_dir, ".tfaccel-workers") if run_dir else None


def _driver(spec: DriverSpec) -> Dict[str, Any]:
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    log = get_logger()
    log.info("launch: %s (ray %s)", _init_ray(spec), ray.__version__)
    run_dir = os.path.join(spec.storage_path, spec.name) if spec.storage_path and os.path.isabs(
        spec.storage_path) else None
    scratch = _scratch_dir(spec, run_dir)
    try:
        state = job_state_class().remote()
        config = {"argv": spec.argv, "env": spec.env, "grace": spec.grace, "capture_lines": spec.capture_lines,
                  "state": state, "run_dir": run_dir, "cwd": spec.cwd, "scratch": scratch}
        trainer = TensorflowTrainer(
            train_loop, train_loop_config=config, scaling_config=ScalingConfig(num_workers=spec.workers),
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
    spec = DriverSpec(**json.loads(Path(args[0]).read_text()))
    log = get_logger()
    out = _driver(spec)
    Path(spec.result_path).write_text(json.dumps(out, default=str))
    if out["returncode"]:
        log.error("launch: %s%s", out["message"], f" (after {out['restarts']} restart(s))" if out["restarts"] else "")
    else:
        log.info("launch: Ray Train finished OK%s; result in %s",
                 f" after {out['restarts']} restart(s)" if out["restarts"] else "", out["path"])
    return int(out["returncode"])



if __name__ == "__main__":
    # Run the driver from the module under its real name, so that Ray pickles what it sends by reference.
    from tfaccel.launch.ray_driver import driver_main as _main

    sys.exit(_main())
