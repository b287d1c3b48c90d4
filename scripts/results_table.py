"""The one command line of the results-table scripts (parity_table.py, corpus_table.py): run a suite that writes
its outcomes to a JSON file named by an environment variable, then print the table ``render`` makes of them."""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Callable, List


def run_and_render(doc: str, render: Callable[[dict], str], *, results_env: str, pytest_args: List[str],
                   default_name: str) -> int:
    """Parses ``--json`` / ``--from``, runs ``pytest -q *pytest_args`` unless ``--from`` names earlier results, and
    prints the table; returns the exit status (1 when the suite wrote no results)."""
    script = os.path.basename(sys.argv[0]).rsplit(".", 1)[0]
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--json", help="where to keep the results (default: a temporary file)")
    parser.add_argument("--from", dest="source", help="render this results file instead of running the suite")
    args = parser.parse_args()
    path = args.source or args.json or os.path.join(tempfile.mkdtemp(), default_name)
    if not args.source:
        rc = subprocess.call([sys.executable, "-m", "pytest", "-q", *pytest_args], env={**os.environ, results_env: path})
        if not os.path.exists(path):
            sys.stderr.write(f"{script}: the suite wrote no results (pytest exit {rc})\n")
            return 1
    with open(path) as fh:
        print(render(json.load(fh)))
    return 0
