"""Train a model with tfaccel: thin absl front end over tfaccel.job.run_job.

    python scripts/train.py --model mnist_cnn --dataset digits --epochs 5
    tfaccel launch --workers 2 -- python scripts/train.py --model mnist_cnn --dataset digits
    python scripts/train.py --cluster tf_config/two_workers.yaml --task worker:1   # on host 2
"""

import dataclasses
import json
import sys

from absl import app, flags

FLAGS = flags.FLAGS


def define_flags() -> None:
    """Defines the flags (in a function: importing this module defines nothing)."""
    from tfaccel.job import JobOptions
    from tfaccel.train.request import LR_SCALING

    d = JobOptions()
    flags.DEFINE_string("model", d.model, "built-in model name or path/to/file.py:build_model")
    flags.DEFINE_string("dataset", d.dataset, "dataset name (digits is embedded)")
    flags.DEFINE_integer("epochs", d.epochs, "epochs")
    flags.DEFINE_integer("global_batch_size", None, "examples per step over all replicas")
    flags.DEFINE_integer("per_replica_batch_size", None, "examples per step per replica")
    flags.DEFINE_string("strategy", d.strategy, "auto, default, one_device, mirrored, multi_worker, "
                        "parameter_server, tpu or horovod")
    flags.DEFINE_string("precision", d.precision, "auto, float32, mixed_float16 or mixed_bfloat16")
    flags.DEFINE_string("jit_compile", "auto", "auto, true or false")
    flags.DEFINE_string("optimizer", d.optimizer, "optimizer name")
    flags.DEFINE_float("learning_rate", None, "the optimizer's learning rate, used as given")
    flags.DEFINE_enum("scale_learning_rate", d.scale_learning_rate, list(LR_SCALING),
                      "scale the rate by global batch / base_batch_size (none keeps it as given)")
    flags.DEFINE_integer("base_batch_size", None, "the batch the rate was tuned for (default: per-replica batch)")
    flags.DEFINE_float("warmup_epochs", 0, "epochs of linear LR warmup")
    flags.DEFINE_integer("gradient_accumulation_steps", 1, "micro-batches per update")
    flags.DEFINE_integer("steps_per_epoch", None, "steps per epoch")
    flags.DEFINE_integer("num_examples", None, "use only the first N training examples")
    flags.DEFINE_string("checkpoint_dir", None, "checkpoints (chief)")
    flags.DEFINE_string("backup_dir", None, "backups for resume after a failure")
    flags.DEFINE_integer("backup_freq", None, "back up every N steps as well as each epoch")
    flags.DEFINE_string("tensorboard_dir", None, "TensorBoard logs (chief)")
    flags.DEFINE_string("cluster", None, "cluster file; with --task exports this task's TF_CONFIG")
    flags.DEFINE_string("task", None, "this process's task, e.g. worker:1")
    flags.DEFINE_integer("seed", 0, "seed for weights and data order")
    flags.DEFINE_string("json_out", None, "write the summary as JSON here (chief only)")


def main(argv: list) -> int:
    del argv  # flags only
    from tfaccel.errors import TfaccelError
    from tfaccel.job import JobOptions, format_job_summary, run_job

    fields = {f.name for f in dataclasses.fields(JobOptions)}
    options = JobOptions(**{name: FLAGS[name].value for name in fields if name in FLAGS and name != "verbose"})
    try:
        summary = run_job(options)
    except TfaccelError as exc:
        sys.stderr.write(f"train.py: error: {exc}\n")
        return 2
    if summary["is_chief"]:
        print(format_job_summary(summary))
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    define_flags()
    app.run(main)
