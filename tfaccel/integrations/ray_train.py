"""Reporting a tfaccel training run to Ray Train, from inside the training process (the launcher that starts Ray
Train workers is ``tfaccel.launch.ray``).

:func:`report_callbacks` gives tfaccel's training loop a Keras callback that calls ``ray.train.report`` at every
epoch end on every worker (Ray's report is a barrier), the chief attaching a small checkpoint (``tfaccel.json``:
epoch, metrics, the path of tfaccel's latest checkpoint). In a command started by ``tfaccel launch --backend ray``
the callback writes its reports to a file that the Ray worker reads and passes on; inside a user's own Ray Train
function it calls ``ray.train.report`` directly. Tested with ray 2.60. Importing this module does not import Ray.
"""

import contextlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional

__all__ = ["ray_context", "ray_backup_dir", "report_to_ray", "report_callbacks", "WORKER_ENV", "REPORT_ENV",
           "RUN_DIR_ENV", "RESULT_FILE"]

WORKER_ENV = "TFACCEL_RAY_WORKER"  # "<rank>/<world size>" in a command run by tfaccel on a Ray Train worker
REPORT_ENV = "TFACCEL_RAY_REPORT"  # the file that command appends its reports to (one JSON line per epoch)
RUN_DIR_ENV = "TFACCEL_RAY_RUN_DIR"  # the run's directory in Ray's storage (local storage only)
RESULT_FILE = "tfaccel.json"  # what the chief's Ray checkpoint holds


def _in_process_session() -> Optional[Dict[str, int]]:
    """Rank and world size when this process runs a Ray Train function (Ray already imported), else None."""
    if "ray.train" not in sys.modules:  # a Ray Train worker has imported it; nothing else should import Ray here
        return None
    try:
        import ray.train

        context = ray.train.get_context()
        return {"rank": int(context.get_world_rank()), "world_size": int(context.get_world_size())}
    except Exception:  # noqa: BLE001 - RuntimeError outside a Ray Train function; any failure means "not in one"
        return None


def ray_context(environ: Optional[Mapping[str, str]] = None) -> Optional[Dict[str, Any]]:
    """Whether this process trains under Ray Train, and how.

    Args:
        environ: the environment to read. Defaults to ``os.environ``.

    Returns:
        None outside Ray Train; else ``{"mode", "rank", "world_size"}`` where mode is ``"launch"`` (a command run
        by ``tfaccel launch --backend ray``; its reports go through ``TFACCEL_RAY_REPORT``) or ``"session"`` (a
        Ray Train function in this very process).

    Example:
        >>> ray_context({}) is None
        True
    """
    env = os.environ if environ is None else environ
    worker = env.get(WORKER_ENV)
    if worker:
        rank, _, size = worker.partition("/")
        return {"mode": "launch", "rank": int(rank), "world_size": int(size or 0)}
    if environ is not None:
        return None
    session = _in_process_session()
    return {"mode": "session", **session} if session is not None else None


def ray_backup_dir(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """``<run directory in Ray's storage>/tfaccel-backup`` in a command run by ``tfaccel launch --backend ray``.

    A job may pass it as ``compile_and_fit(backup_dir=...)`` to keep its backup with the Ray run. None elsewhere,
    and when the storage is not a local (or shared, mounted) path.
    """
    run_dir = (os.environ if environ is None else environ).get(RUN_DIR_ENV)
    return os.path.join(run_dir, "tfaccel-backup") if run_dir else None


def _scalar_metrics(epoch: int, logs: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    metrics: Dict[str, Any] = {"epoch": epoch + 1}
    for key, value in (logs or {}).items():
        with contextlib.suppress(TypeError, ValueError):
            metrics[str(key)] = float(value)
    return metrics


def _latest_checkpoint(checkpoint_dir: Optional[str]) -> Optional[str]:
    if not checkpoint_dir or not os.path.isdir(checkpoint_dir):
        return None
    import tensorflow as tf

    return tf.train.latest_checkpoint(checkpoint_dir)


def report_to_ray(metrics: Mapping[str, Any], *, is_chief: bool) -> None:
    """``ray.train.report(metrics)`` from this Ray Train worker; the chief attaches a checkpoint holding them.

    Every worker must call it the same number of times (Ray's report is a barrier). The chief's checkpoint is a
    directory with ``tfaccel.json`` (the metrics, with ``checkpoint_path``: tfaccel's latest checkpoint), so
    ``Result.metrics`` and ``Result.checkpoint`` hold the last epoch's.
    """
    import ray.train

    if not is_chief:
        ray.train.report(dict(metrics), checkpoint=None)
        return
    tmp = tempfile.mkdtemp(prefix="tfaccel-ray-report-")
    try:
        Path(tmp, RESULT_FILE).write_text(json.dumps(dict(metrics)))
        ray.train.report(dict(metrics), checkpoint=ray.train.Checkpoint.from_directory(tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _report_sink(context: Mapping[str, Any]) -> Callable[[Dict[str, Any], bool], None]:
    if context["mode"] == "session":
        return lambda metrics, chief: report_to_ray(metrics, is_chief=chief)
    path = os.environ[REPORT_ENV]

    def append(metrics: Dict[str, Any], chief: bool) -> None:
        with open(path, "a", encoding="utf-8") as fh:  # one line per write: the Ray worker reads whole lines
            fh.write(json.dumps({"metrics": metrics, "chief": chief}) + "\n")

    return append


def report_callbacks(*, is_chief: Optional[bool] = None, checkpoint_dir: Optional[str] = None) -> List[Any]:
    """The Keras callbacks that report a training run to Ray Train; an empty list outside Ray Train.

    Meant for tfaccel's own training loop (add them after the checkpoint callback, so the epoch's checkpoint
    exists when it is reported); a user never needs them.

    Args:
        is_chief: whether this process is the chief (it attaches the checkpoint). Defaults to Ray Train's
            rank 0.
        checkpoint_dir: tfaccel's ``checkpoint_dir``, if any: its latest checkpoint's path is reported as
            ``checkpoint_path``. Defaults to None.

    Returns:
        ``[callback]`` under Ray Train (see :func:`ray_context`), else ``[]``.

    Example:
        >>> report_callbacks(is_chief=True) if ray_context() is None else []
        []
    """
    context = ray_context()
    if context is None:
        return []
    import keras

    sink = _report_sink(context)
    chief = context["rank"] == 0 if is_chief is None else bool(is_chief)

    class RayReport(keras.callbacks.Callback):
        """Reports every epoch's logs (and, from the chief, tfaccel's latest checkpoint path) to Ray Train."""

        def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
            metrics = _scalar_metrics(epoch, logs)
            if chief:
                metrics["checkpoint_path"] = _latest_checkpoint(checkpoint_dir)
            sink(metrics, chief)

    return [RayReport()]
