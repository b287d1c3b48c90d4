"""Runs the two-strategies order of issue 13 N times under `tfaccel launch --workers 2` and prints the tally.

    python scripts/two_strategies_runs.py                      # 20 runs, compile_and_fit route
    python scripts/two_strategies_runs.py --runs 5 --route scope_fit --timeout 90

Each run: both workers call ``tfaccel.get_strategy("multi_worker")``, build a dataset, then train with
``strategy="auto"``. Prints one line per run and ``two-strategies <route>: completed 20/20 (hung 0, failed 0)``.
Exits 1 unless every run completed. The logic lives in tests/strategies/strategies_two_runs.py.
"""

import sys
from pathlib import Path

from absl import app, flags

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "strategies"))

FLAGS = flags.FLAGS


def define_flags() -> None:
    flags.DEFINE_integer("runs", 20, "launches to run, one after the other")
    flags.DEFINE_enum("route", "compile_and_fit", ["compile_and_fit", "scope_fit"],
                      "compile_and_fit(strategy='auto'), or tfaccel.scope() + tfaccel.fit")
    flags.DEFINE_float("timeout", 120.0, "seconds a run may take before it counts as hung")


def main(argv: list) -> None:
    del argv
    import strategies_two_runs as two

    def report(index: int, outcome: "two.RunOutcome") -> None:
        print(f"run {index + 1}/{FLAGS.runs}: {outcome.describe()}", flush=True)

    counts = two.tally(FLAGS.runs, route=FLAGS.route, timeout=FLAGS.timeout, on_run=report)
    print(f"two-strategies {FLAGS.route}: completed {counts['completed']}/{FLAGS.runs} "
          f"(hung {counts['hung']}, failed {counts['failed']})")
    sys.exit(0 if counts["completed"] == FLAGS.runs else 1)


if __name__ == "__main__":
    define_flags()
    app.run(main)
