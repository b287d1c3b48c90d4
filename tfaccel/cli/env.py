"""``tfaccel env [--json]``: print the environment report."""

import argparse
import json
import sys


def register(subparsers: "argparse._SubParsersAction") -> None:
    parser = subparsers.add_parser("env", help="print a paste-ready report of this machine and its cluster role")
    parser.add_argument("--json", action="store_true", help="print JSON only (machine-readable)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tfaccel.report import env_report, format_report

    report = env_report()
    if args.json:
        sys.stdout.write(json.dumps(report, indent=2, sort_keys=True, default=str) + "\n")
    else:
        sys.stdout.write(format_report(report) + "\n")
    return 0
