"""Inside a Ray Train worker of ``tfaccel launch --backend ray``: the train function that runs the command.

Ray Train calls :func:`train_loop` on every worker: it checks the TF_CONFIG Ray set, enters the launcher's working
directory, runs the command as a child process under tfaccel's supervisor (output prefixed ``[worker i]``) and
passes the command's metric reports (written to a file by :func:`tfaccel.integrations.ray_train.report_callbacks`)
on to Ray. A job-state actor (:func:`job_state_class`) counts each worker's starts (the restart count) and records
failures in order. Importing this module does not import Ray or TensorFlow.
"""

import json
import logging
import os
import tempfile
import threading
import time
from typing import Any, Dict, List, Mapping, Optional

from tfaccel.errors import ConfigError
from tfaccel.integrations.ray_train import REPORT_ENV, RUN_DIR_ENV, WORKER_ENV, report_to_ray
from tfaccel.launch.command import CHILD_DEFAULT_ENV
from tfaccel.launch.outcome import LaunchResult, LaunchTask, describe_returncode, exit_code
from tfaccel.launch.ray import RAY_TESTED
from tfaccel.launch.supervisor import RESTART_ENV, run_job
from tfaccel.log import configure_logging, get_logger

__all__ = ["train_loop", "job_state_class", "enter_launch_dir"]

_POLL_S = 0.2


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


def train_loop(config: Dict[str, Any]) -> None:
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
        runner = threading.Thread(target=lambda: box.update(result=run_job(
            lambda _attempt: [task], grace=config["grace"], capture_lines=config["capture_lines"])),
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
    message = (f"worker:{rank} (pid {outcome.pid if outcome else '?'}, Ray node {_node_ip()}) "
               f"failed: {describe_returncode(rc)}")
    ray.get(state.failed.remote(rank, attempt, exit_code(rc) if rc is not None else 1, message, time.time()))
    raise RuntimeError(f"tfaccel: {message}")


def job_state_class() -> Any:
    import ray

    @ray.remote(num_cpus=0)
    class JobState:
        """Counts each worker's starts (the restart count) and records failures in the order they happen."""

        def __init__(self) -> None:
            self.starts: Dict[int, int] = {}
            self.failures: List[Dict[str, Any]] = []

        def started(self, rank: int) -> int:
            self.starts[rank] = self.starts.get(rank, 0) + 1
            return self.starts[rank] - 1

        def failed(self, rank: int, attempt: int, code: int, message: str, when: float) -> None:
            self.failures.append({"rank": rank, "attempt": attempt, "code": code, "message": message, "when": when})

        def summary(self) -> Dict[str, Any]:
            return {"attempts": max(self.starts.values(), default=0), "failures": self.failures}

    return JobState
