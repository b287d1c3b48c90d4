"""Runs the keras-io corpus (tests/corpus) and prints its table (docs/guides/keras-parity.md) from the results.

    python scripts/corpus_table.py [--json corpus.json]      # runs tests/corpus, prints the table
    python scripts/corpus_table.py --from corpus.json         # only renders an earlier run's results
    python scripts/corpus_table.py --json docs/data/corpus.json   # refresh the results the docs page shows

The documentation build renders the page's table from docs/data/corpus.json with ``render`` (scripts/docs_hooks.py).
"""

import sys

COLUMNS = [("default", "default"), ("mirrored", "mirrored (2 vCPUs)"), ("multi_worker", "multi_worker (2 processes)")]
KERAS_IO = "https://github.com/keras-team/keras-io/blob/master/"


def _cell(outcome: str, pending: str) -> str:
    if outcome == "equal":
        return "equal"
    if pending:
        return f"waits for a fix: {pending}"
    if outcome.startswith("refused: "):
        return "refused: " + outcome.split("refused: ", 1)[1].split(";")[0][:120]
    return outcome.split(":")[0].lower()


def render(results: dict) -> str:
    """The Markdown table of a results file (``{"cases": {name: {source, proves}}, "outcomes": {path: {name:
    outcome}}, "pending": {path: {name: why}}}``)."""
    lines = ["| case | source | what it shows | " + " | ".join(title for _, title in COLUMNS) + " |",
             "|---" * (len(COLUMNS) + 3) + "|"]
    for name, meta in results["cases"].items():
        cells = [_cell(results["outcomes"].get(path, {}).get(name, "not run"),
                       results.get("pending", {}).get(path, {}).get(name, "")) for path, _ in COLUMNS]
        source = f"[{meta['source'].rsplit('/', 1)[-1]}]({KERAS_IO}{meta['source']})"
        lines.append(f"| {name} | {source} | {meta['proves']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    # here, not at the top: the docs build loads this file by its path for render() alone
    from results_table import run_and_render

    return run_and_render(__doc__, render, results_env="TFACCEL_CORPUS_JSON", pytest_args=["tests/corpus"],
                          default_name="corpus.json")


if __name__ == "__main__":
    sys.exit(main())
