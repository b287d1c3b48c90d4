"""A training job described by plain options: what ``tfaccel fit`` and ``scripts/train.py`` run.

Both front ends parse their flags and call :func:`run_job`; all logic lives here.
"""

import dataclasses
import json
import os
from typing import Any, Dict, Optional, Union

from tfaccel.errors import ConfigError

__all__ = ["JobOptions", "run_job", "format_job_summary"]


@dataclasses.dataclass(frozen=True)
class JobOptions:
    """Options of a training job (the flags of ``tfaccel fit`` / ``scripts/train.py``)."""

    model: str = "mnist_cnn"
    dataset: str = "digits"
    epochs: int = 5
    global_batch_size: Optional[int] = None
    per_replica_batch_size: Optional[int] = None
    strategy: str = "auto"
    precision: str = "auto"
    jit_compile: Any = "auto"
    optimizer: str = "adam"
    learning_rate: Optional[float] = None
    # Opt-in, as in tfaccel.fit (one default for the CLI and the Python API): the same command trains the same
    # rate on 1 and on 2 workers unless --scale-learning-rate linear|sqrt is given.
    scale_learning_rate: str = "none"
    base_batch_size: Optional[int] = None
    warmup_epochs: float = 0
    gradient_accumulation_steps: int = 1
    shard_optimizer_state: Union[bool, str] = False
    steps_per_epoch: Optional[int] = None
    num_examples: Optional[int] = None
    checkpoint_dir: Optional[str] = None
    backup_dir: Optional[str] = None
    backup_freq: Optional[int] = None
    tensorboard_dir: Optional[str] = None
    cluster: Optional[str] = None
    task: Optional[str] = None
    seed: Optional[int] = 0
    verbose: Any = "auto"
    json_out: Optional[str] = None


def parse_jit(value: Any) -> Any:
    """``"auto"``, or a boolean from ``true/false/1/0/on/off``."""
    if isinstance(value, bool) or value == "auto":
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "on", "yes"):
        return True
    if text in ("false", "0", "off", "no"):
        return False
    raise ConfigError(f"jit_compile: expected auto, true or false; received {value!r}")


def run_job(options: JobOptions) -> Dict[str, Any]:
    """Loads the data, builds the model and trains it with compile_and_fit.

    With ``cluster`` and ``task`` set, this task's TF_CONFIG is exported first (before TensorFlow starts).

    Returns:
        A JSON-serialisable summary: task, plan, final metrics, throughput, seconds.
    """
    if (options.cluster is None) != (options.task is None):
        raise ConfigError(f"--cluster and --task go together; received cluster={options.cluster!r}, "
                          f"task={options.task!r}")
    if options.cluster:
        from tfaccel.cluster import ClusterSpec

        ClusterSpec.from_file(options.cluster).export(options.task)
    from tfaccel.datasets import load_dataset
    from tfaccel.models import get_model_builder
    from tfaccel.train.api import compile_and_fit

    builder = get_model_builder(options.model)
    x, y = load_dataset(options.dataset, split="train", num_examples=options.num_examples,
                        seed=options.seed or 0)
    xv, yv = load_dataset(options.dataset, split="test", seed=options.seed or 0)
    num_classes = int(max(y.max(), yv.max()) + 1)
    input_shape = tuple(x.shape[1:])

    def build_model() -> Any:
        return builder(input_shape=input_shape, num_classes=num_classes)

    result = compile_and_fit(
        build_model, (x, y), validation_data=(xv, yv), epochs=options.epochs,
        global_batch_size=options.global_batch_size, per_replica_batch_size=options.per_replica_batch_size,
        strategy=options.strategy, precision=options.precision, jit_compile=parse_jit(options.jit_compile),
        optimizer=options.optimizer, learning_rate=options.learning_rate,
        scale_learning_rate=options.scale_learning_rate, base_batch_size=options.base_batch_size,
        warmup_epochs=options.warmup_epochs, loss="sparse_categorical_crossentropy", metrics=["accuracy"],
        gradient_accumulation_steps=options.gradient_accumulation_steps, steps_per_epoch=options.steps_per_epoch,
        shard_optimizer_state=options.shard_optimizer_state,
        checkpoint_dir=options.checkpoint_dir, backup_dir=options.backup_dir, backup_freq=options.backup_freq,
        tensorboard_dir=options.tensorboard_dir, seed=options.seed, verbose=options.verbose)
    summary = {
        "task": result.plan.task, "is_chief": result.plan.is_chief, "strategy": result.plan.strategy,
        "replicas": result.plan.num_replicas, "precision": result.plan.precision,
        "jit_compile": bool(result.model.jit_compile),  # what trained (the plan's "auto" may be refined per model)
        "model": options.model, "dataset": options.dataset, "epochs": options.epochs,
        "global_batch_size": result.global_batch_size, "steps": result.steps,
        "final": {k: v[-1] for k, v in result.history.items() if v},
        "examples_per_sec": round(result.examples_per_sec, 1),
        "examples_per_sec_over": result.details.get("examples_per_sec_over"), "seconds": round(result.seconds, 2),
        "learning_rate": result.details.get("learning_rate"), "loop": result.details.get("loop"),
        **{k: result.details.get(k) for k in ("optimizer_state", "optimizer_state_bytes")},
        "plan": result.plan.to_dict(),
    }
    if options.json_out and result.plan.is_chief:
        from tfaccel.resilience.atomic_io import atomic_write_text

        os.makedirs(os.path.dirname(os.path.abspath(options.json_out)), exist_ok=True)
        atomic_write_text(options.json_out, json.dumps(summary, indent=2))
    return summary


def format_job_summary(summary: Dict[str, Any]) -> str:
    """One line a person reads at the end of a job."""
    final = summary["final"]
    acc = final.get("val_accuracy", final.get("accuracy"))
    acc_text = f"val_accuracy {acc:.4f}" if acc is not None else f"loss {final.get('loss', float('nan')):.4f}"
    over = str(summary.get("examples_per_sec_over") or "").split(",")[0]  # "epochs 2-5"
    return (f"tfaccel fit: {summary['model']} on {summary['dataset']}: {acc_text}; trained {summary['steps']} steps in "
            f"{summary['seconds']:.1f}s, {summary['examples_per_sec']:,.0f} examples/s"
            f"{f' over {over}' if over else ''} "
            f"({summary['strategy']} x{summary['replicas']} replicas, {summary['precision']}, "
            f"jit={summary['jit_compile']}, global batch {summary['global_batch_size']})")
