"""``tfaccel doctor [--steps K] [--replicas N] [--nan] [--json] -- python train.py [args]``: why does my model train
differently on N replicas?

Runs the user's unmodified script twice, each in a child process (``python -m tfaccel.divergence.child``): once on
one replica and once on N mirrored replicas (N virtual CPUs, made before TensorFlow starts, which is why these are
child processes). Each run trains K steps of the model that the script's first ``fit`` call is given, with the same
initial weights and the same global batches. Prints where the runs part and the likely cause; exit code 0 (equal
to rounding), 1 (they part), 2 (bad input: no command, K < 1, a script that crashes or never calls fit). This
parent never imports TensorFlow.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import List, Optional

from tfaccel.errors import ConfigError

EXIT_EQUAL, EXIT_PART = 0, 1
DEFAULT_STEPS = 5
DEFAULT_TIMEOUT_S = 600


def register(subparsers: "argparse._SubParsersAction") -> None:
    parser = subparsers.add_parser("doctor", help="train on 1 and N replicas; say where and why they part")
    parser.add_argument("--steps", default=str(DEFAULT_STEPS), help=f"steps to compare (default {DEFAULT_STEPS})")
    parser.add_argument("--replicas", default="2", help="replicas of the N-replica run (default 2)")
    parser.add_argument("--seed", default="0", help="seed of the example order (default 0)")
    parser.add_argument("--rtol", default=None, help="relative tolerance (default: from the model's dtype and K)")
    parser.add_argument("--timeout", default=str(DEFAULT_TIMEOUT_S), help="seconds for each run (default 600)")
    parser.add_argument("--nan", action="store_true",
                        help="also find each run's first step with a NaN/Inf and the first layer that produced it")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
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


def _child(role: str, out: str, options: List[str], script: List[str], timeout: int) -> None:
    """Runs one role; a bad input (error.txt) or a failed child becomes a ConfigError with one line."""
    cmd = [sys.executable, "-m", "tfaccel.divergence.child", "--role", role, "--out", out, *options, *script]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    try:
        done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"doctor: the {role} run did not finish in {timeout} s (--timeout)") from None
    error = os.path.join(out, "error.txt")
    if os.path.exists(error):
        with open(error, encoding="utf-8") as f:
            raise ConfigError(f"doctor: {f.read().strip()}")
    if done.returncode != 0:
        tail = [line for line in done.stderr.splitlines() if line.strip()][-1:] or ["no output"]
        raise ConfigError(f"doctor: the {role} run failed (exit {done.returncode}): {tail[0]}")


def run(args: argparse.Namespace) -> int:
    steps = _whole("--steps", args.steps, 1)
    replicas = _whole("--replicas", args.replicas, 2)
    seed = _whole("--seed", args.seed, 0)
    timeout = _whole("--timeout", args.timeout, 1)
    if args.rtol is not None:
        try:
            float(args.rtol)
        except ValueError:
            raise ConfigError(f"--rtol must be a number; received {args.rtol!r}") from None
    script = _script(args.command)
    options = ["--steps", str(steps), "--replicas", str(replicas), "--seed", str(seed)] + \
        (["--rtol", args.rtol] if args.rtol is not None else []) + (["--nan"] if args.nan else [])
    with tempfile.TemporaryDirectory(prefix="tfaccel-doctor-") as out:
        _child("single", out, options, script, timeout)
        _child("replicas", out, options, script, timeout)
        with open(os.path.join(out, "report.json"), encoding="utf-8") as f:
            report = json.load(f)
        with open(os.path.join(out, "summary.txt"), encoding="utf-8") as f:
            summary = f.read()
    sys.stdout.write(json.dumps(report, indent=1) + "\n" if args.json else summary)
    return EXIT_EQUAL if report["equal"] else EXIT_PART
