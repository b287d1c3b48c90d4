"""Renders docs/real_models.md (the "Real models" table) from a ``tfaccel bench --suite real`` JSON.

    python scripts/real_models_page.py [--from docs/data/real_bench.json] [--out docs/real_models.md]
                                       [--command "the command that made the JSON"]
    python scripts/real_models_page.py --from a.json --from b.json --json merged.json --png chart.png

Several ``--from`` files (e.g. one bench run per model) are merged into one report first (their models in the
given order; the first run's date and load before, the last run's load after); ``--json`` keeps the merge.
"""

import argparse
import datetime
import json
import os
import sys

DEFAULT_COMMAND = ("tfaccel bench --suite real --real-paths default,mirrored --repeats 3 "
                   "--json docs/data/real_bench.json --png docs/img/real_bench.png")


def main(argv: list) -> int:
    from tfaccel.bench.real_report import merge_reports, plot_real, render_page
    from tfaccel.train.atomic_io import atomic_write_text

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="sources", action="append", default=None,
                        help="a bench JSON (repeat to merge runs); default docs/data/real_bench.json")
    parser.add_argument("--json", dest="merged", default=None, help="write the merged report here")
    parser.add_argument("--png", default=None, help="draw the report's chart here (as tfaccel bench --png)")
    parser.add_argument("--out", default="docs/real_models.md", help="the page to write")
    parser.add_argument("--command", default=DEFAULT_COMMAND, help="the command that produced the JSON")
    args = parser.parse_args(argv)
    reports = []
    for source in args.sources or ["docs/data/real_bench.json"]:
        try:
            with open(source, encoding="utf-8") as fh:
                report = json.load(fh)
            if "real" not in report:
                raise ValueError("it has no 'real' key (run tfaccel bench --suite real --json FILE)")
        except (OSError, ValueError) as exc:
            sys.stderr.write(f"real_models_page: --from {source}: {exc}\n")
            return 2
        if "date" not in report.get("machine", {}):  # reports written before the bench recorded the date
            stamp = datetime.datetime.fromtimestamp(os.path.getmtime(source), datetime.timezone.utc)
            report.setdefault("machine", {})["date"] = stamp.strftime("%Y-%m-%d %H:%M UTC") + " (the file's time)"
        reports.append(report)
    report = merge_reports(reports)
    if args.merged:
        atomic_write_text(args.merged, json.dumps(report, indent=2))
    if args.png:
        plot_real(report, args.png)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    atomic_write_text(args.out, render_page(report, command=args.command))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
