"""Runs the Keras-parity suite and prints the "Keras parity" table (docs/guides/keras-parity.md) from its results.

    python scripts/parity_table.py [--json parity.json]      # runs tests/parity and tests/real, prints the table
    python scripts/parity_table.py --from parity.json         # only renders an earlier run's results
    python scripts/parity_table.py --json docs/data/parity.json   # refresh the results the docs page shows

The documentation build renders the page's table from docs/data/parity.json with ``render`` (scripts/docs_hooks.py).
"""

import sys

COLUMNS = [("tfaccel:default:compiled", "default, compiled loop"), ("tfaccel:default:keras", "default, Keras fit"),
           ("tfaccel:mirrored:auto", "mirrored (2 vCPUs)"), ("tfaccel:multi_worker:auto", "multi_worker (2 processes)"),
           ("tfaccel:horovod:auto", "horovod (2 ranks)"),
           ("tfaccel:parameter_server:auto", "parameter_server (chief + worker + ps)")]


def render(outcomes: dict) -> str:
    cases = list(dict.fromkeys(c for path in outcomes.values() for c in path))
    lines = ["| case | " + " | ".join(title for _, title in COLUMNS) + " |",
             "|---" * (len(COLUMNS) + 1) + "|"]
    for case in cases:
        cells = []
        for path, _ in COLUMNS:
            # a real-model row has no case on some paths (its suite does not run them there): not "not run"
            outcome = outcomes.get(path, {}).get(case, "—" if case.startswith("real: ") else "not run")
            cells.append("refused: " + outcome.split("refused: ", 1)[1].split(";")[0][:90]
                         if outcome.startswith("refused") else outcome.split(":")[0])
        lines.append(f"| {case} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    # here, not at the top: the docs build loads this file by its path for render() alone
    from results_table import run_and_render

    return run_and_render(__doc__, render, results_env="TFACCEL_PARITY_JSON", pytest_args=["tests/parity", "tests/real/test_real_parity.py"],
                          default_name="parity.json")


if __name__ == "__main__":
    sys.exit(main())
