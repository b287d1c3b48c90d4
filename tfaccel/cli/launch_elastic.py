"""``tfaccel launch --workers MIN:MAX`` (issue 25): the elastic options of the launch verb and their run.

``--workers`` takes ``N`` or ``MIN:MAX``; ``MIN:MAX`` makes the job elastic (:mod:`tfaccel.launch.elastic`): a
local cluster of workers (``--backend tf``) or of Ray Train workers (``--backend ray``), with ``--capacity-file``.
"""

import argparse
from typing import Any, Optional, Tuple

from tfaccel.errors import ConfigError

__all__ = ["WORKERS_HELP", "add_elastic_options", "worker_range", "check_elastic", "run_elastic_job"]

WORKERS_HELP = ("; MIN:MAX: an elastic job, started on MAX workers, that restarts from its last backup with the "
                "workers it has (at least MIN) when one cannot be brought back (its --max-restarts spent), and grows "
                "back when --capacity-file offers more")


def add_elastic_options(group: Any) -> None:
    """Adds ``--capacity-file`` to the supervision options."""
    group.add_argument("--capacity-file", default=None, metavar="FILE",
                       help="--workers MIN:MAX: a file holding the number of workers available (written by a "
                            "scheduler or by hand), read at the start and at every restart (default: none: MAX, "
                            "less the workers whose restarts are spent)")


def worker_range(args: argparse.Namespace) -> Tuple[argparse.Namespace, Optional[Tuple[int, int]]]:
    """``--workers N`` or ``MIN:MAX``: (the arguments with ``workers`` = N or MAX, (MIN, MAX) of an elastic job).

    Raises:
        ConfigError: ``--workers`` is neither (names what was received and both forms).
    """
    from tfaccel.launch.elastic import parse_workers_range

    if args.workers is None or isinstance(args.workers, int):
        return args, None
    text = str(args.workers).strip()
    if ":" in text:
        low, high = parse_workers_range(text)
        return argparse.Namespace(**{**vars(args), "workers": high}), (low, high)
    try:
        workers = int(text)
    except ValueError:  # not a whole number, or one of more digits than Python converts
        parse_workers_range(text)  # raises: names --workers, what was received and the two forms
        raise
    return argparse.Namespace(**{**vars(args), "workers": workers}), None


def check_elastic(args: argparse.Namespace, elastic: Optional[Tuple[int, int]], backend: str) -> None:
    """An elastic job is a local cluster of workers or Ray Train workers: nothing else of the layout.

    Raises:
        ConfigError: ``--capacity-file`` without a range, or a range with ps/chief/evaluator, a cluster file, a
            task or Horovod (names what was received).
    """
    if getattr(args, "capacity_file", None) is not None and elastic is None:
        raise ConfigError(f"--capacity-file: only with --workers MIN:MAX (an elastic job); received --workers "
                          f"{args.workers}")
    if elastic is None:
        return
    given = [name if value is True else f"{name} {value}" for name, value in (
        ("--backend", None if backend in ("tf", "ray") else backend), ("--ps", args.ps), ("--chief", args.chief),
        ("--evaluator", args.evaluator), ("--cluster", args.cluster), ("--task", args.task)) if value is not None]
    if given:
        raise ConfigError(f"--workers {elastic[0]}:{elastic[1]}: an elastic job is a local cluster of workers or Ray "
                          f"Train workers; received {', '.join(given)}. Across hosts, a scheduler restarts the job "
                          "with the hosts it has on the same backup_dir (see tfaccel.launch.elastic); or launch a "
                          "fixed number (--workers N)")


def run_elastic_job(opts: dict, *, capture_lines: int) -> int:
    """Runs the elastic job ``opts`` describes (``tfaccel.launch.elastic.run_elastic``); its exit status."""
    from tfaccel.launch.elastic import run_elastic

    common = dict(workers=opts["elastic"], backend=opts["backend"], capacity_file=opts["capacity_file"],
                  max_restarts=opts["max_restarts"], timeout=opts["timeout"], grace=opts["grace"],
                  capture_lines=capture_lines, network=opts["network"], job_id=opts["job_id"])
    if opts["backend"] == "ray":
        result = run_elastic(opts["cmd"], address=opts["address"], storage_path=opts["storage_path"],
                             forward=opts["env_names"], **common)
    else:
        result = run_elastic(opts["cmd"], connect_timeout=opts["connect_timeout"], **common)
    return result.returncode
