"""``tfaccel cache {path,clear}``: where ``"auto"``'s decision cache is, and clearing it."""

import argparse
import sys


def register(subparsers: "argparse._SubParsersAction") -> None:
    parser = subparsers.add_parser(
        "cache", help="show or clear the figures 'auto' measured on earlier jobs "
                      "($TFACCEL_CACHE_DIR/decisions, default ~/.cache/tfaccel/decisions)",
        description="jit_compile='auto' on one CPU device measures what XLA costs and saves on a job and keeps\n"
                    "the figures (one JSON file per model, devices, batch and versions), so the next run of the\n"
                    "same job decides before its first step. This verb prints where they are, or removes them.",
        epilog="examples:\n  tfaccel cache path\n  tfaccel cache clear",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("path", "clear"), help="path: print the folder; clear: remove every record")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tfaccel.train.decisions import cache_dir, clear

    if args.action == "path":
        sys.stdout.write(cache_dir() + "\n")
        return 0
    removed = clear()
    sys.stdout.write(f"removed {removed} decision record(s) from {cache_dir()}\n")
    return 0
