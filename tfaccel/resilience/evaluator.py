"""The side-car evaluator: the ``evaluator`` task of a cluster follows the chief's checkpoints and evaluates them.

``tfaccel launch --ps M --workers N --evaluator -- python train.py`` runs the same script on the chief and on the
evaluator task (TF_CONFIG task type ``evaluator``). There, ``tfaccel.fit`` (and so ``compile_and_fit``) does not
train: it waits for the checkpoints the chief writes into ``checkpoint_dir`` at each epoch end, restores each new
one into the model (built and compiled by the script as usual, under the default strategy: the evaluator is not a
member of the training cluster), runs ``model.evaluate`` on ``validation_data``, logs the metrics and writes them to
``tensorboard_dir/evaluator`` when given, and returns when the chief says training ended.

How the two sides meet: when the cluster has an evaluator task, the chief's ``fit`` adds :func:`progress_callback`,
which keeps ``checkpoint_dir/tfaccel-progress.json`` up to date: the chief's address and job (so a file of an
earlier job is never followed: the same job id where the environment gives one (``TFACCEL_JOB_ID``, which
every tfaccel launcher exports, or SLURM's; :mod:`tfaccel.job_id`), else a file written
after the evaluator started, less a minute), the checkpoints written so far (each must lie in ``checkpoint_dir``),
and ``done`` once training ended (``on_train_end``). The file is replaced atomically. Waits are bounded:
``TFACCEL_EVALUATOR_TIMEOUT`` seconds (default 1800) for the first progress and between two updates.
"""

import json
import os
import time
from typing import Any, Dict, List, Optional, Sequence

import keras
import tensorflow as tf

from tfaccel.errors import ConfigError, TfaccelError
from tfaccel.job_id import environment_job_id
from tfaccel.log import get_logger
from tfaccel.resilience.atomic_io import atomic_write_text
from tfaccel.resilience.backup_guard import confined, job_identity
from tfaccel.strategies._task import current_task
from tfaccel.train.result import FitResult
from tfaccel.train.scope import plan_for_model

__all__ = ["PROGRESS_FILE", "TIMEOUT_ENV", "DEFAULT_TIMEOUT_S", "EvaluatorTimeout", "is_evaluator_task",
           "chief_address", "progress_callback", "evaluator_callbacks", "run_evaluator"]

PROGRESS_FILE = "tfaccel-progress.json"
TIMEOUT_ENV = "TFACCEL_EVALUATOR_TIMEOUT"
DEFAULT_TIMEOUT_S = 1800.0
_POLL_S = 0.5
_PROGRESS_MAX_BYTES = 16 << 20
_STALE_SLACK_S = 60.0  # a progress file written this long before the evaluator started may still be this job's
_ALL_TASKS = {"all_tasks": True}  # the evaluator is not the chief: its lines are the point of it (tfaccel.log)


class EvaluatorTimeout(TfaccelError, TimeoutError):
    """The chief wrote no progress within the evaluator's bounded wait."""


def is_evaluator_task(task: Optional[Any] = None) -> bool:
    """True in the ``evaluator`` task of a cluster (TF_CONFIG task type ``evaluator``)."""
    if task is None:
        task = current_task()
    return task is not None and task.task_type == "evaluator"


def chief_address(task: Any) -> Optional[str]:
    """The training chief's address in this task's cluster (worker 0 when there is no chief), or None."""
    for role in ("chief", "worker"):
        addrs = task.spec.roles.get(role) if task is not None else None
        if addrs:
            return str(addrs[0])
    return None


def _write_json(path: str, payload: Dict[str, Any]) -> None:
    atomic_write_text(path, json.dumps(payload))


def progress_callback(checkpoint_dir: str, *, checkpoints: Any, task: Any) -> Any:
    """The chief's callback that tells the evaluator which checkpoints exist and when training ended.

    Args:
        checkpoint_dir: where the chief writes its checkpoints.
        checkpoints: tfaccel's checkpoint callback (its ``saved`` list); this callback must run after it.
        task: the chief's ``TaskInfo`` (its address identifies the job).

    Returns:
        A ``keras.callbacks.Callback``.
    """
    path = os.path.join(checkpoint_dir, PROGRESS_FILE)
    chief = chief_address(task)

    class _Progress(keras.callbacks.Callback):
        def _write(self, done: bool) -> None:
            os.makedirs(checkpoint_dir, exist_ok=True)
            _write_json(path, {"chief": chief, "checkpoints": [str(p) for p in checkpoints.saved], "done": done,
                               "job": job_identity()})

        def on_train_begin(self, logs: Optional[Dict] = None) -> None:
            self._write(False)

        def on_epoch_end(self, epoch: int, logs: Optional[Dict] = None) -> None:
            self._write(False)

        def on_train_end(self, logs: Optional[Dict] = None) -> None:
            self._write(True)

    return _Progress()


def _timeout_s() -> float:
    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ConfigError(f"{TIMEOUT_ENV} must be a number of seconds > 0; received {raw!r}")
    return value


def _read_progress(path: str, chief: Optional[str], since: float) -> Optional[Dict[str, Any]]:
    """The chief's progress of this job, or None (not written yet, or left by another job).

    A file is this job's when it names this job's chief and job: the same job id when the environment gives one,
    else written no earlier than ``since`` (the evaluator's start less a minute of slack).

    Raises:
        ConfigError: this job's progress names a checkpoint outside ``checkpoint_dir``.
    """
    try:
        if os.path.getsize(path) > _PROGRESS_MAX_BYTES:
            return None
        with open(path, encoding="utf-8") as fh:
            progress = json.load(fh)
    except (OSError, ValueError):
        return None
    job = progress.get("job") if isinstance(progress, dict) else None
    if not isinstance(job, dict) or progress.get("chief") != chief:
        return None
    given = environment_job_id()
    written = job.get("written_at")
    if (job.get("id") != given) if given else not (isinstance(written, (int, float)) and written >= since):
        return None
    checkpoints = progress.get("checkpoints")
    if not isinstance(checkpoints, list):
        return None
    directory = os.path.dirname(path)
    progress["checkpoints"] = [_inside(directory, p) for p in checkpoints]
    return progress


def _inside(checkpoint_dir: str, path: Any) -> str:
    """A checkpoint path of the progress file, refused unless it lies directly in ``checkpoint_dir``."""
    where = f"{PROGRESS_FILE} 'checkpoints'"
    if isinstance(path, str) and os.path.dirname(path) and \
            os.path.realpath(os.path.dirname(path)) == os.path.realpath(checkpoint_dir):
        path = os.path.basename(path)
    confined(checkpoint_dir, path, what="checkpoint_dir", field=where)
    return os.path.join(checkpoint_dir, path)


def _check_options(*, checkpoint_dir: Optional[str], backup_dir: Optional[str], validation_data: Any,
                   task: Any) -> None:
    where = f"tfaccel.fit in the evaluator task ({task.name})"
    if not checkpoint_dir:
        also = f" (backup_dir={backup_dir!r} cannot be followed: backups are removed when training ends)" \
            if backup_dir else ""
        raise ConfigError(f"{where}: checkpoint_dir is required; received checkpoint_dir={checkpoint_dir!r}{also}. "
                          "The side-car evaluator evaluates the checkpoints the chief writes there at each epoch end: "
                          "pass the same checkpoint_dir=... to tfaccel.fit on every task")
    if validation_data is None:
        raise ConfigError(f"{where}: validation_data is required; received None. The side-car evaluator evaluates "
                          "each checkpoint on it: pass validation_data=(x_val, y_val) (or a dataset) to tfaccel.fit")


class _Evaluation:
    """Restores one checkpoint into the model, evaluates it, logs and writes the metrics."""

    def __init__(self, model: Any, *, validation_data: Any, batch_size: Optional[int], steps: Optional[int],
                 tensorboard_dir: Optional[str]) -> None:
        self.model, self.steps, self.batch_size = model, steps, batch_size
        self.x, self.y, self.sample_weight = _unpack(validation_data)
        self.writer = (tf.summary.create_file_writer(os.path.join(tensorboard_dir, "evaluator"))
                       if tensorboard_dir else None)

    def __call__(self, path: str, epoch: int) -> Dict[str, float]:
        try:
            tf.train.Checkpoint(model=self.model).read(path).expect_partial().assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as exc:
            raise ConfigError(f"evaluator: checkpoint {path} does not fit the model {self.model.name!r} ({exc}); "
                              "build the same model on the evaluator as on the chief") from exc
        logs = self.model.evaluate(self.x, self.y, sample_weight=self.sample_weight, batch_size=self.batch_size,
                                   steps=self.steps, verbose=0, return_dict=True)
        metrics = {f"val_{k}": float(v) for k, v in logs.items()}
        get_logger().info("evaluator: checkpoint %s (epoch %d): %s", os.path.basename(path), epoch,
                          " - ".join(f"{k}: {v:.4f}" for k, v in metrics.items()), extra=_ALL_TASKS)
        if self.writer is not None:
            with self.writer.as_default():
                for name, value in logs.items():
                    tf.summary.scalar(f"epoch_{name}", float(value), step=epoch)
            self.writer.flush()
        return metrics


def _unpack(validation_data: Any) -> tuple:
    if isinstance(validation_data, (tuple, list)):
        if len(validation_data) not in (2, 3):
            raise ConfigError(f"validation_data must be (x, y) or (x, y, sample_weight) or a dataset; received a "
                              f"{type(validation_data).__name__} of length {len(validation_data)}")
        return (*validation_data, None) if len(validation_data) == 2 else tuple(validation_data)
    return validation_data, None, None


def _epoch_of(path: str) -> int:
    tail = os.path.basename(path).rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


def _follow(progress_path: str, chief: Optional[str], evaluate: _Evaluation, timeout_s: float) -> List[Dict[str, Any]]:
    """Evaluates every checkpoint the chief lists, in order, until it says training ended."""
    log = get_logger()
    done: List[Dict[str, Any]] = []
    seen: set = set()
    last_change, last_state = time.monotonic(), None
    since = time.time() - _STALE_SLACK_S
    while True:
        progress = _read_progress(progress_path, chief, since)
        state = None if progress is None else (tuple(progress["checkpoints"]), bool(progress["done"]))
        if state != last_state:
            last_change, last_state = time.monotonic(), state
        for path in (progress or {}).get("checkpoints", []):
            if path in seen:
                continue
            seen.add(path)
            if not os.path.exists(path + ".index"):
                log.warning("evaluator: checkpoint %s was removed before it could be evaluated (the chief keeps the "
                            "last 3); skipped", path, extra=_ALL_TASKS)
                continue
            done.append({"checkpoint": path, "epoch": _epoch_of(path), "metrics": evaluate(path, _epoch_of(path))})
        if progress is not None and progress["done"]:
            return done
        if time.monotonic() - last_change > timeout_s:
            what = "no progress from the chief" if progress is None else "no new checkpoint from the chief"
            raise EvaluatorTimeout(f"evaluator: {what} in {progress_path} for {timeout_s:.0f} s (chief {chief}); is "
                                   f"the chief training with checkpoint_dir={os.path.dirname(progress_path)!r}? Set "
                                   f"{TIMEOUT_ENV} (seconds) for longer epochs")
        time.sleep(_POLL_S)


def run_evaluator(model: Any, *, validation_data: Any, checkpoint_dir: Optional[str], backup_dir: Optional[str] = None,
                  tensorboard_dir: Optional[str] = None, batch_size: Optional[int] = None,
                  validation_steps: Optional[int] = None, task: Optional[Any] = None) -> Any:
    """``tfaccel.fit`` in the evaluator task: evaluates each checkpoint of the chief until training ends.

    Args:
        model: the compiled model the script built (the same architecture as the chief's).
        validation_data: ``(x, y[, sample_weight])`` or a dataset, as for ``fit``.
        checkpoint_dir: the chief's ``checkpoint_dir`` (required). backup_dir: only named in the error.
        tensorboard_dir: metrics are also written to ``tensorboard_dir/evaluator`` (step = epoch).
        batch_size: evaluation batch size. validation_steps: as for ``fit``.
        task: this process's ``TaskInfo``. Defaults to the one TF_CONFIG describes.

    Returns:
        A ``FitResult``: ``history`` has one value per checkpoint for each ``val_*`` metric; ``details["evaluations"]``
        lists checkpoint, epoch and metrics.

    Raises:
        ConfigError: no checkpoint_dir or validation_data, or a checkpoint that does not fit the model.
        EvaluatorTimeout: the chief wrote no progress within ``TFACCEL_EVALUATOR_TIMEOUT`` seconds.
    """
    task = task if task is not None else current_task()
    _check_options(checkpoint_dir=checkpoint_dir, backup_dir=backup_dir, validation_data=validation_data, task=task)
    plan, _, _ = plan_for_model(model)
    chief, timeout_s = chief_address(task), _timeout_s()
    get_logger().info("evaluator: following the checkpoints of chief %s in %s (waits up to %.0f s)", chief,
                      checkpoint_dir, timeout_s, extra=_ALL_TASKS)
    evaluate = _Evaluation(model, validation_data=validation_data, batch_size=batch_size, steps=validation_steps,
                           tensorboard_dir=tensorboard_dir)
    t0 = time.perf_counter()
    evaluations = _follow(os.path.join(checkpoint_dir, PROGRESS_FILE), chief, evaluate, timeout_s)
    history: Dict[str, List[float]] = {}
    for item in evaluations:
        for name, value in item["metrics"].items():
            history.setdefault(name, []).append(value)
    get_logger().info("evaluator: training ended; %d checkpoint(s) evaluated", len(evaluations), extra=_ALL_TASKS)
    return FitResult(model=model, history=history, plan=plan, examples_per_sec=0.0, seconds=time.perf_counter() - t0,
                     global_batch_size=batch_size, steps_per_epoch=0, steps=0,
                     resumed_from=None, details={"loop": "side-car evaluator: follows the chief's checkpoints in "
                                                 f"{checkpoint_dir} (does not train)", "evaluations": evaluations})


def evaluator_callbacks(*, checkpoint_dir: Optional[str], checkpoints: Any, is_chief: bool,
                        task: Optional[Any] = None) -> Sequence[Any]:
    """The chief's progress callback when its cluster has an evaluator task and checkpoints are written; else none.

    Args:
        checkpoint_dir: fit's ``checkpoint_dir``. checkpoints: tfaccel's checkpoint callback (or None).
        is_chief: whether this process is the chief. task: this process's ``TaskInfo`` (defaults to TF_CONFIG's).

    Returns:
        ``[progress_callback(...)]`` or ``[]``.
    """
    if not (is_chief and checkpoint_dir and checkpoints is not None):
        return []
    if task is None:
        task = current_task()
    if task is None or not task.spec.roles.get("evaluator"):
        return []
    return [progress_callback(checkpoint_dir, checkpoints=checkpoints, task=task)]
