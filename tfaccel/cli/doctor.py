"""``tfaccel doctor [--steps K] [--replicas N | --workers W] [--strategy S] [--nan] [--json] [--plot FILE.png]
-- python train.py [args]``: why does my model train differently on N replicas?

Runs the user's unmodified script twice, each in a child process (``python -m tfaccel.divergence.child``): once on
one replica and once on N replicas: N virtual CPUs in one process (made before TensorFlow starts, which is why
these are child processes), or with ``--workers W`` W local worker processes of a MultiWorkerMirrored cluster
started by tfaccel's own launcher (:func:`tfaccel.launch.run_local`, loopback only). Each run trains K steps of
the model that the script's first ``fit`` call is given (or of its custom loop's step), with the same initial
weights and the same global batches. Prints where the runs part and the likely cause; exit code 0 (equal to
rounding, no problem of a run's own), 1 (they part, or a run has a problem of its own such as a metric
accumulator overflowing), 2 (bad input, one line: no command, K < 1, bad --workers/--strategy/--plot, a script
that crashes or never trains). This parent never imports TensorFlow.
"""

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
from typing import List, Optional

from tfaccel.errors import ConfigError, invalid_choice
from tfaccel.launch import run_local
from tfaccel.log import get_logger

EXIT_EQUAL, EXIT_PART = 0, 1
STRATEGIES = ("mirrored", "multi_worker")
"""The N-replica run's strategies (registry names): mirrored (N replicas in one process, the default) and
multi_worker (one replica in each of the --workers processes, the default with --workers)."""
DEFAULT_STEPS = 5
DEFAULT_TIMEOUT_S = 600


def register(subparsers: "argparse._SubParsersAction") -> None:
    parser = subparsers.add_parser("doctor", help="train on 1 and N replicas; say where and why they part")
    parser.add_argument("--steps", default=str(DEFAULT_STEPS), help=f"steps to compare (default {DEFAULT_STEPS})")
    parser.add_argument("--replicas", default=None, help="replicas of the one-process N-replica run (default 2)")
    parser.add_argument("--workers", default=None,
                        help="run the N-replica side as this many local worker processes (MultiWorkerMirrored, one "
                             "replica each) instead of one process")
    parser.add_argument("--strategy", default=None,
                        help=f"the N-replica run's strategy: {', '.join(STRATEGIES)} (default: mirrored; "
                             "multi_worker with --workers)")
    parser.add_argument("--seed", default="0", help="seed of the example order (default 0)")
    parser.add_argument("--rtol", default=None, help="relative tolerance (default: from the model's dtype and K)")
    parser.add_argument("--timeout", default=str(DEFAULT_TIMEOUT_S), help="seconds for each run (default 600)")
    parser.add_argument("--nan", action="store_true",
                        help="also find each run's first step with a NaN/Inf and the first layer that produced it")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--plot", default=None, metavar="FILE.png",
                        help="also write a PNG of the loss and gradient norm per step of both runs (needs matplotlib: "
                             "pip install 'tfaccel[doctor]')")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- python train.py [args]")
    parser.set_defaults(func=run)


def _whole(option: str, raw: str, minimum: int) -> int:
    try:
        value = int(raw)
    except (TypeError, ValueError):
        value = minimum - 1
    if value < minimum:
        raise ConfigError(f"{option} must be a whole number >= {minimum}; received {raw!r}")
    return value


def _script(command: List[str]) -> List[str]:
    """``[script, args...]`` from ``[--] python script args...``."""
    command = command[1:] if command[:1] == ["--"] else command
    if len(command) < 2 or not os.path.basename(command[0]).startswith("python"):
        raise ConfigError(f"doctor needs the training command after `--`, as `tfaccel doctor -- python train.py "
                          f"[args]`; received {' '.join(command) or 'nothing'!r}")
    if not os.path.isfile(command[1]):
        raise ConfigError(f"doctor: script {command[1]!r} not found")
    return command[1:]


def _raise_child_error(out: str, role: str, returncode: int, stderr: str) -> None:
    """A bad input (error.txt) or a failed child becomes a ConfigError with one line."""
    error = os.path.join(out, "error.txt")
    if os.path.exists(error):
        with open(error, encoding="utf-8") as f:
            raise ConfigError(f"doctor: {f.read().strip()}")
    if returncode != 0:
        tail = [line for line in stderr.splitlines() if line.strip()][-1:] or ["no output"]
        raise ConfigError(f"doctor: the {role} run failed (exit {returncode}): {tail[0]}")


def _child(role: str, out: str, options: List[str], script: List[str], timeout: int) -> None:
    """Runs one role in one child process."""
    cmd = [sys.executable, "-m", "tfaccel.divergence.child", "--role", role, "--out", out, *options, *script]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    try:
        done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"doctor: the {role} run did not finish in {timeout} s (--timeout)") from None
    _raise_child_error(out, role, done.returncode, done.stderr)


def run_workers(out: str, options: List[str], script: List[str], workers: int, timeout: int) -> None:
    """Runs the N-replica role in ``workers`` local worker processes through tfaccel's launcher."""
    cmd = [sys.executable, "-m", "tfaccel.divergence.child", "--role", "replicas", "--out", out, *options, *script]
    logger = get_logger()
    level = logger.level
    logger.setLevel(logging.WARNING)  # the launcher's INFO lines (job id, ports) are not the doctor's output
    try:
        result = run_local(cmd, workers=workers, timeout=timeout, echo=False, capture_lines=200,
                           env={"TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")})
    finally:
        logger.setLevel(level)
    if result.reason == "timeout":
        raise ConfigError(f"doctor: the {workers}-worker run did not finish in {timeout} s (--timeout)")
    failed = next((t for t in result.tasks if t.returncode not in (0, None) and not t.stopped), result.tasks[0])
    _raise_child_error(out, f"{workers}-worker ({failed.name})", result.returncode, failed.stderr)


def _layout(args: argparse.Namespace) -> List[str]:
    """The N-replica run's options (``--replicas``, ``--workers``, ``--strategy``), checked together."""
    workers = None if args.workers is None else _whole("--workers", args.workers, 2)
    if workers is not None and args.replicas is not None:
        raise ConfigError(f"--replicas and --workers: give one; with --workers each process holds one replica "
                          f"(received --replicas {args.replicas} --workers {args.workers})")
    replicas = workers or _whole("--replicas", args.replicas or "2", 2)
    strategy = args.strategy or ("multi_worker" if workers else "mirrored")
    if strategy not in STRATEGIES:
        raise invalid_choice("--strategy", strategy, STRATEGIES)
    if workers and strategy != "multi_worker":
        raise ConfigError(f"--strategy {strategy} runs in one process; with --workers {workers} the processes train "
                          "as one MultiWorkerMirrored cluster: leave --strategy out (or give multi_worker)")
    if strategy == "multi_worker" and not workers:
        raise ConfigError("--strategy multi_worker needs --workers W (W local processes, one replica each): in one "
                          "process it holds a single replica on CPUs; received no --workers")
    return ["--replicas", str(replicas), "--strategy", strategy] + (["--workers", str(workers)] if workers else [])


def _plot_path(raw: Optional[str]) -> List[str]:
    """``["--plot", absolute path]`` for the child, or nothing; the folder must exist."""
    if raw is None:
        return []
    path = os.path.abspath(raw)
    if not path.lower().endswith(".png"):
        raise ConfigError(f"--plot must name a .png file; received {raw!r}")
    if not os.path.isdir(os.path.dirname(path)):
        raise ConfigError(f"--plot {raw!r}: folder {os.path.dirname(path)!r} does not exist; make it first")
    return ["--plot", path]


def run(args: argparse.Namespace) -> int:
    steps = _whole("--steps", args.steps, 1)
    seed = _whole("--seed", args.seed, 0)
    timeout = _whole("--timeout", args.timeout, 1)
    if args.rtol is not None:
        try:
            float(args.rtol)
        except ValueError:
            raise ConfigError(f"--rtol must be a number; received {args.rtol!r}") from None
    layout = _layout(args)
    script = _script(args.command)
    options = ["--steps", str(steps), "--seed", str(seed)] + layout + \
        (["--rtol", args.rtol] if args.rtol is not None else []) + (["--nan"] if args.nan else []) + \
        _plot_path(args.plot)
    with tempfile.TemporaryDirectory(prefix="tfaccel-doctor-") as out:
        _child("single", out, options, script, timeout)
        if "--workers" in layout:
            run_workers(out, options, script, int(layout[layout.index("--workers") + 1]), timeout)
        else:
            _child("replicas", out, options, script, timeout)
        with open(os.path.join(out, "report.json"), encoding="utf-8") as f:
            report = json.load(f)
        with open(os.path.join(out, "summary.txt"), encoding="utf-8") as f:
            summary = f.read()
    sys.stdout.write(json.dumps(report, indent=1) + "\n" if args.json else summary)
    return EXIT_EQUAL if report["ok"] else EXIT_PART
