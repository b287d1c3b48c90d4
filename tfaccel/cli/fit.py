"""``tfaccel fit``: train a reference (or your own) model on a dataset with compile_and_fit."""

import argparse
import dataclasses
import json
import sys

from tfaccel.job import JobOptions


def register(subparsers: "argparse._SubParsersAction") -> None:
    from tfaccel.datasets import DATASET_NAMES
    from tfaccel.models import MODEL_NAMES
    from tfaccel.train.optim import LR_SCALING

    parser = subparsers.add_parser("fit", help="train a model with compile_and_fit (any strategy)")
    d = JobOptions()
    parser.add_argument("--model", default=d.model,
                        help=f"built-in ({', '.join(MODEL_NAMES)}) or path/to/file.py:build_model")
    parser.add_argument("--dataset", default=d.dataset, choices=DATASET_NAMES)
    parser.add_argument("--epochs", type=int, default=d.epochs)
    parser.add_argument("--global-batch-size", type=int, default=None)
    parser.add_argument("--per-replica-batch-size", type=int, default=None)
    parser.add_argument("--strategy", default=d.strategy)
    parser.add_argument("--precision", default=d.precision)
    parser.add_argument("--jit-compile", default="auto", help="auto, true or false")
    parser.add_argument("--optimizer", default=d.optimizer)
    parser.add_argument("--learning-rate", type=float, default=None, help="the optimizer's rate, used as given")
    parser.add_argument("--scale-learning-rate", default=d.scale_learning_rate, choices=LR_SCALING,
                        help="opt-in, as in tfaccel.fit: scale the rate by global batch / --base-batch-size "
                             "(linear) or its square root (sqrt) (default: none, the rate as given)")
    parser.add_argument("--base-batch-size", type=int, default=None,
                        help="the batch the rate was tuned for (default: the per-replica batch)")
    parser.add_argument("--warmup-epochs", type=float, default=0)
    parser.add_argument("--gradient-accumulation-steps", type=int, default=1)
    parser.add_argument("--steps-per-epoch", type=int, default=None)
    parser.add_argument("--num-examples", type=int, default=None, help="use only the first N training examples")
    parser.add_argument("--checkpoint-dir", default=None)
    parser.add_argument("--backup-dir", default=None)
    parser.add_argument("--backup-freq", type=int, default=None)
    parser.add_argument("--tensorboard-dir", default=None)
    parser.add_argument("--cluster", default=None, help="cluster file; with --task, exports this task's TF_CONFIG")
    parser.add_argument("--task", default=None, help="this process's task, e.g. worker:1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-out", default=None, help="write the summary as JSON here (chief only)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tfaccel.job import format_job_summary, run_job

    fields = {f.name for f in dataclasses.fields(JobOptions)}
    options = JobOptions(**{k: v for k, v in vars(args).items() if k in fields})
    summary = run_job(options)
    if summary["is_chief"]:
        sys.stdout.write((json.dumps(summary) if args.json else format_job_summary(summary)) + "\n")
    return 0
