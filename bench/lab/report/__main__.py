"""``python -m bench.lab.report RESULTS_JSON [--out DIR]``: render a saved run's report again."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from bench.lab.report.document import write_report
from bench.lab.report.summary import summary_table
from bench.lab.results import Results


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.lab.report RESULTS_JSON [--out DIR]``: re-render a saved run."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.lab.report",
        description="Render report.md, report.html and plots/ from a lab run's results.json.",
    )
    parser.add_argument("results_json", type=Path, help="a results.json the lab wrote")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="directory for the report (default: the results file's directory); "
        "profile paths stay relative to the results file's directory",
    )
    args = parser.parse_args(argv)
    if not args.results_json.is_file():
        parser.error(f"no such file: {args.results_json}")
    results = Results.load(args.results_json)
    out_dir = args.out or args.results_json.parent
    md_path, html_path = write_report(results, out_dir, profiles_dir=args.results_json.parent)
    print(summary_table(results))
    print(f"\nwrote {md_path} and {html_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    raise SystemExit(main())
