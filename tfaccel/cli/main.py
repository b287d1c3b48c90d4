"""Entry point of the ``tfaccel`` command.

Each verb lives in its own module with ``register(subparsers)``; errors that tfaccel raises on purpose
become one line on stderr and exit code 2, never a traceback.
"""

import argparse
import importlib
import os
import sys
from typing import List, NoReturn, Optional

from tfaccel._version import __version__
from tfaccel.cluster.limits import shorten
from tfaccel.errors import TfaccelError

# Verb modules under tfaccel.cli, in the order `tfaccel --help` lists them.
_VERB_MODULES = ("env", "tf_config", "k8s", "launch", "fit", "doctor", "bench", "memory", "cache")


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (argparse prints the whole usage first), exit code 2."""

    def error(self, message: str) -> NoReturn:
        """Writes ``tfaccel VERB: error: MESSAGE; see `tfaccel VERB --help``` and exits 2."""
        self.exit(2, f"{self.prog}: error: {shorten(message)}; see `{self.prog} --help`\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``tfaccel`` parser with every verb (subparsers inherit its one-line errors)."""
    parser = _Parser(prog="tfaccel", description="Take a Keras model from one CPU to many GPUs, "
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
        sys.stderr.write(f"tfaccel {args.verb}: error: {_one_line(str(exc))}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write(f"tfaccel {args.verb}: interrupted\n")
        return 130


def _one_line(message: str) -> str:
    """The message on one line (a line break in a received value would make it two), at most a few KB."""
    return shorten(" ".join(message.splitlines()), 4000)


if __name__ == "__main__":
    sys.exit(main())
