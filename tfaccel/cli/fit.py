"""``tfaccel fit``: train a reference (or your own) model on a dataset with compile_and_fit."""

import argparse
import dataclasses
import json
import logging
import sys

from tfaccel.job import JobOptions


def register(subparsers: "argparse._SubParsersAction") -> None:
    from tfaccel.datasets import DATASET_NAMES
    from tfaccel.models import MODEL_NAMES
    from tfaccel.precision import PRECISION_NAMES
    from tfaccel.strategies.names import STRATEGY_NAMES
    from tfaccel.train.request import OPTIMIZER_NAMES

    parser = subparsers.add_parser(
        "fit", help="train a model with compile_and_fit (any strategy)",
        description="Train a built-in (or your own) model on a dataset with tfaccel.compile_and_fit, then print\n"
                    "one summary line (chief only). Run it under `tfaccel launch` to train on several workers.",
        epilog="example:\n  tfaccel launch --workers 2 -- tfaccel fit --model mnist_cnn --dataset digits --epochs 5",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    d = JobOptions()
    parser.add_argument("--model", default=d.model,
                        help=f"built-in ({', '.join(MODEL_NAMES)}) or path/to/file.py:build_model (default: {d.model})")
    parser.add_argument("--dataset", default=d.dataset, choices=DATASET_NAMES,
                        help=f"a built-in dataset (default: {d.dataset}, embedded; the others are downloaded by Keras "
                             "or generated)")
    parser.add_argument("--epochs", type=int, default=d.epochs, help=f"epochs to train (default: {d.epochs})")
    parser.add_argument("--global-batch-size", type=int, default=None,
                        help="examples per step over all replicas, Keras' batch_size (default: 32 per replica)")
    parser.add_argument("--per-replica-batch-size", type=int, default=None,
                        help="examples per step on each replica (give this or --global-batch-size; both must agree)")
    parser.add_argument("--strategy", default=d.strategy,
                        help=f"auto or one of {', '.join(STRATEGY_NAMES[1:])} (default: {d.strategy}: from the "
                             "hardware and the cluster)")
    parser.add_argument("--precision", default=d.precision,
                        help=f"{', '.join(PRECISION_NAMES)} (default: {d.precision}: mixed precision on GPUs that "
                             "gain from it, float32 elsewhere)")
    parser.add_argument("--jit-compile", default="auto",
                        help="XLA for the training step: auto, true or false (default: auto, decided per job)")
    parser.add_argument("--optimizer", default=d.optimizer,
                        help=f"one of {', '.join(OPTIMIZER_NAMES)}, with Keras' default rate unless --learning-rate "
                             f"(default: {d.optimizer})")
    _add_rate_and_job_options(parser, d)
    parser.set_defaults(func=run)


def _add_rate_and_job_options(parser: argparse.ArgumentParser, d: JobOptions) -> None:
    """The learning rate, the steps, the files a job writes, its cluster task, its seed and its summary."""
    from tfaccel.train.request import LR_SCALING

    parser.add_argument("--learning-rate", type=float, default=None,
                        help="the optimizer's rate, used as given (default: Keras' default for --optimizer)")
    parser.add_argument("--scale-learning-rate", default=d.scale_learning_rate, choices=LR_SCALING,
                        help="opt-in, as in tfaccel.fit: scale the rate by global batch / --base-batch-size "
                             "(linear) or its square root (sqrt) (default: none, the rate as given)")
    parser.add_argument("--base-batch-size", type=int, default=None,
                        help="the batch the rate was tuned for (default: the per-replica batch)")
    parser.add_argument("--warmup-epochs", type=float, default=0,
                        help="epochs of linear warm-up to the scaled rate (default: 0)")
    parser.add_argument("--gradient-accumulation-steps", type=int, default=1,
                        help="batches whose gradients are summed into one update (default: 1)")
    parser.add_argument("--shard-optimizer-state", nargs="?", const=True, default=False, choices=["auto"],
                        metavar="auto",
                        help="shard the optimizer's slots over the replicas (ZeRO-1; mirrored, multi_worker with "
                             "one device per worker, or Horovod ranks), as tfaccel.fit(shard_optimizer_state=True); with 'auto', only "
                             "when tfaccel memory's estimate of a replica exceeds its GPU's memory; refused where it "
                             "cannot train exactly (default: off)")
    parser.add_argument("--steps-per-epoch", type=int, default=None,
                        help="training steps per epoch (default: one pass over the data)")
    parser.add_argument("--num-examples", type=int, default=None,
                        help="use only the first N training examples (default: all)")
    parser.add_argument("--checkpoint-dir", default=None,
                        help="tf.train.Checkpoints written by the chief at each epoch end (default: none)")
    parser.add_argument("--backup-dir", default=None,
                        help="resumable backups of model and optimizer; a restarted job resumes from the latest "
                             "(default: none)")
    parser.add_argument("--backup-freq", type=int, default=None,
                        help="also write a backup every N steps (default: at epoch ends only)")
    parser.add_argument("--tensorboard-dir", default=None, help="TensorBoard logs, chief only (default: none)")
    parser.add_argument("--cluster", default=None, help="cluster file; with --task, exports this task's TF_CONFIG")
    parser.add_argument("--task", default=None, help="this process's task, e.g. worker:1")
    parser.add_argument("--seed", type=int, default=0,
                        help="the seed of the initial weights, the example order and the --num-examples subset "
                             "(default: 0)")
    parser.add_argument("--json-out", default=None, help="write the summary as JSON here (chief only)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON (with the whole plan)")
    parser.add_argument("--verbose", action="store_true", dest="debug_log",  # not JobOptions.verbose (Keras')
                        help="also log the details at DEBUG: the plan with every reason, the data, the loop and what "
                             "tfaccel changed (default: one summary line per job)")


def run(args: argparse.Namespace) -> int:
    from tfaccel.job import format_job_summary, run_job
    from tfaccel.log import configure_logging

    if args.debug_log:
        configure_logging(level=logging.DEBUG)
    fields = {f.name for f in dataclasses.fields(JobOptions)}
    options = JobOptions(**{k: v for k, v in vars(args).items() if k in fields})
    summary = run_job(options)
    if summary["is_chief"]:
        sys.stdout.write((json.dumps(summary) if args.json else format_job_summary(summary)) + "\n")
    return 0
