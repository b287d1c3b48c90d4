"""Entry point of the ``tfaccel`` command.

Each verb lives in its own module with ``register(subparsers)``; errors that tfaccel raises on purpose
become one line on stderr and exit code 2, never a traceback.
"""

import argparse
import importlib
import os
import sys
from typing import List, Optional

from tfaccel._version import __version__
from tfaccel.errors import TfaccelError

# Verb modules under tfaccel.cli, in the order `tfaccel --help` lists them.
_VERB_MODULES = ("env", "tf_config", "launch", "fit", "bench", "memory")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tfaccel", description="Take a Keras model from one CPU to many GPUs, "
                                     "many hosts or a TPU without rewriting it.")
    parser.add_argument("--version", action="version", version=f"tfaccel {__version__}")
    subparsers = parser.add_subparsers(dest="verb", metavar="VERB")
    for name in _VERB_MODULES:
        importlib.import_module(f"tfaccel.cli.{name}").register(subparsers)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TF's C++ start-up chatter out of CLI output
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except TfaccelError as exc:
        sys.stderr.write(f"tfaccel {args.verb}: error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write(f"tfaccel {args.verb}: interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
