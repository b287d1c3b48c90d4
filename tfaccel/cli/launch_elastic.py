"""``tfaccel launch --workers MIN:MAX`` (issue 25): the elastic options of the launch verb and their run.

``--workers`` takes ``N`` or ``MIN:MAX``; ``MIN:MAX`` makes the job elastic (:mod:`tfaccel.launch.elastic`): a
local cluster of workers (``--backend tf``) or of Ray Train workers (``--backend ray``), with ``--capacity-file``.
"""

import argparse
import math
from typing import Any, Optional, Tuple

from tfaccel.errors import ConfigError

__all__ = ["WORKERS_HELP", "add_elastic_options", "worker_range", "check_elastic", "run_elastic_job",
           "elastic_dry_run"]

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
                  max_restarts=opts["max_restarts"], count_preemptions=opts["count_preemptions"],
                  timeout=opts["timeout"], grace=opts["grace"], capture_lines=capture_lines,
                  network=opts["network"], job_id=opts["job_id"])
    if opts["backend"] == "ray":
        result = run_elastic(opts["cmd"], address=opts["address"], storage_path=opts["storage_path"],
                             forward=opts["env_names"], **common)
    else:
        result = run_elastic(opts["cmd"], connect_timeout=opts["connect_timeout"], **common)
    return result.returncode


def elastic_dry_run(opts: dict) -> Tuple[str, dict]:
    """What ``--workers MIN:MAX --dry-run`` says elastic mode will do, and the options of its first attempt (that
    many workers, no restarts of its own), whose dry run follows.

    Raises:
        ConfigError: the capacity file cannot be read or offers fewer workers than MIN (as the launch would).
    """
    from tfaccel.launch.elastic import ElasticState

    (low, high), restarts = opts["elastic"], opts["max_restarts"]
    first = ElasticState(low, high, restarts, opts["capacity_file"]).size
    sizes = range(low, high + 1)
    brought_back = (f"brought back (the whole job restarted from its last backup) up to {restarts} time(s), then "
                    "left out" if restarts else "not brought back")
    lines = [f"tfaccel launch --dry-run (elastic, --workers {low}:{high}, --backend {opts['backend']}): would start "
             f"{first} worker(s), and restart from the last backup on {low} to {high}; nothing was started",
             f"elastic: a failed worker is {brought_back} (--max-restarts {restarts}: each worker's own budget); "
             f"without it the job restarts from its last backup on the workers it has, never fewer than {low} "
             "(below that it fails)",
             "elastic: a preemption (a task exits 75, its backup written) restarts the job from that backup, "
             + ("counted against the task's --max-restarts (--count-preemptions)" if opts["count_preemptions"] else
                "not counted against --max-restarts (--count-preemptions would count it)")]
    if opts["capacity_file"]:
        lines.append(f"elastic: capacity file {opts['capacity_file']} offers {first} worker(s) now (at most {high} "
                     "are used); it is read again at every restart, which starts as many workers as it offers "
                     "then: the job shrinks and grows back")
    else:
        lines.append("elastic: no --capacity-file: the job starts on MAX workers and does not grow back once a "
                     "worker is left out")
    lines.append(f"elastic: the global batch and the last batch of an epoch must split evenly over every size "
                 f"{', '.join(str(n) for n in sizes)}: each a multiple of {math.lcm(*sizes)} (times the replicas "
                 "of a worker); tfaccel's fit checks it before training and names the sizes that do")
    lines.append(f"elastic: every task gets TFACCEL_ELASTIC={low}:{high} and the record of the job's restarts "
                 "(FitResult.details[\"restarts\"]); each attempt is one launch with no restarts of its own, the "
                 "first:")
    return "\n".join(lines) + "\n", {**opts, "workers": first, "max_restarts": 0}
