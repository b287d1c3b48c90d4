"""Runs Keras' own tests in plain Keras and through tfaccel and prints the "Keras' own tests" tables of
docs/guides/keras-parity.md from the results.

    python scripts/keras_conformance_table.py             # runs both tools on both paths, rewrites the JSON, prints
    python scripts/keras_conformance_table.py --from docs/data/keras_conformance.json   # only renders

The run is tests/conformance/test_keras_conformance.py with TFACCEL_CONFORMANCE_RECORD=1, which writes
docs/data/keras_conformance.json; the documentation build renders the page's tables from that file with ``render``
(scripts/docs_hooks.py).
"""

import argparse
import collections
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / "docs" / "data" / "keras_conformance.json"
COLUMNS = [("keras:default", "default: plain Keras"), ("tfaccel:default", "default: tfaccel"),
           ("keras:mirrored", "mirrored: plain Keras"), ("tfaccel:mirrored", "mirrored: tfaccel")]
CAUSE_CHARS = 110


def _module(test: str) -> str:
    return test.split("::")[0].replace("keras/src/", "")


def _counts(outcomes: Dict[str, str]) -> Dict[str, Tuple[int, int]]:
    """Per module: (passed, tests)."""
    counts: Dict[str, List[int]] = collections.defaultdict(lambda: [0, 0])
    for test, outcome in outcomes.items():
        counts[_module(test)][0] += outcome == "passed"
        counts[_module(test)][1] += 1
    return {module: (passed, total) for module, (passed, total) in counts.items()}


def _cause(outcome: str) -> str:
    text = outcome.split(": ", 1)[-1]
    return text if len(text) <= CAUSE_CHARS else text[:CAUSE_CHARS] + "..."


def _columns(data: dict) -> List[Tuple[str, str]]:
    return [(mode, title) for mode, title in COLUMNS if mode in data["modes"]]


def _paths(data: dict) -> List[str]:
    return [mode.split(":")[1] for mode, _ in _columns(data) if mode.startswith("tfaccel:")]


def _differing(data: dict, path: str) -> Dict[str, str]:
    """``{test: kind}`` for each test that passes on ``path`` in plain Keras or through tfaccel but not in both."""
    plain, routed = data["modes"][f"keras:{path}"], data["modes"][f"tfaccel:{path}"]
    refused = data.get("intended_refusals", {}).get(f"tfaccel:{path}", {})
    open_ones = data.get("open_differences", {}).get(f"tfaccel:{path}", {})
    kinds = {}
    for test in sorted(set(plain) | set(routed)):
        if (plain.get(test) == "passed") == (routed.get(test) == "passed"):
            continue
        if routed.get(test) == "passed":
            kinds[test] = "passes through tfaccel only"
        else:
            kinds[test] = ("intended refusal" if test in refused else "open difference" if test in open_ones
                           else "difference")
    return kinds


def render(data: dict) -> str:
    """The versions, the per-module table (passed / tests per path and tool, then the differences per path), the
    totals, then every test whose outcome differs between plain Keras and tfaccel, with its cause."""
    modes, columns, paths = data["modes"], _columns(data), _paths(data)
    counts = {mode: _counts(modes[mode]) for mode, _ in columns}
    differing = {path: _differing(data, path) for path in paths}
    modules = sorted({m for mode in counts.values() for m in mode})
    lines = [f"Keras {data.get('keras', '?')}, TensorFlow {data.get('tensorflow', '?')}, Python "
             f"{data.get('python', '?')}; each cell: tests passed / tests run on that path (mirrored runs the tests "
             "named above).", "",
             "| test module | " + " | ".join(title for _, title in columns) + " | differences (" + ", ".join(paths) +
             ") |", "|---" * (len(columns) + 2) + "|"]
    for module in modules:
        cells = ["{} / {}".format(*counts[mode][module]) if module in counts[mode] else "not run"
                 for mode, _ in columns]
        diffs = [str(sum(_module(t) == module for t in differing[path])) for path in paths]
        lines.append(f"| `{module}` | " + " | ".join(cells) + " | " + " / ".join(diffs) + " |")
    totals = [f"**{sum(c[0] for c in counts[mode].values())} / {len(modes[mode])}**" for mode, _ in columns]
    lines.append("| **all** | " + " | ".join(totals) + " | **" +
                 " / ".join(str(len(differing[path])) for path in paths) + "** |")
    lines += ["", "Differences between plain Keras and tfaccel (on the same path), with their cause:", ""]
    rows = [f"| {path} | `{test.replace('keras/src/', '')}` | {kind} | " +
            " | ".join(_cause(modes[f"{tool}:{path}"].get(test, "not run")) for tool in ("keras", "tfaccel")) + " |"
            for path in paths for test, kind in differing[path].items()]
    if rows:
        lines += ["| path | test | kind | plain Keras | tfaccel |", "|---|---|---|---|---|", *rows]
    else:
        lines.append("none: every test passes through tfaccel exactly where it passes in plain Keras.")
    return "\n".join(lines)


def causes(data: dict) -> str:
    """Why plain Keras fails or skips the tests it does not pass here: one row per cause, with its count per mode."""
    rows: Dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    columns = _columns(data)
    for mode, _ in columns:
        for outcome in data["modes"][mode].values():
            if outcome != "passed":
                rows[_cause(outcome)][mode] += 1
    lines = ["| outcome | " + " | ".join(title for _, title in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for cause, counter in sorted(rows.items(), key=lambda item: -sum(item[1].values())):
        lines.append(f"| {cause.replace('|', '/')} | " + " | ".join(str(counter[mode]) for mode, _ in columns) + " |")
    return "\n".join(lines)


def tables(data: dict) -> str:
    """What the documentation page shows: ``render``, then ``causes``."""
    return render(data) + "\n\nOutcomes other than passed, by cause (each mode's count):\n\n" + causes(data)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", help="render this results file instead of running the tests")
    args = parser.parse_args()
    if not args.source:
        env = {**os.environ, "TFACCEL_CONFORMANCE_RECORD": "1"}
        rc = subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              "tests/conformance/test_keras_conformance.py"], env=env, cwd=ROOT)
        print(f"keras_conformance_table: pytest exited {rc}", file=sys.stderr)
    data = json.loads(Path(args.source or RECORDED).read_text())
    print(tables(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
