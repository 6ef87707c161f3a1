"""Render pytest-benchmark's ``--benchmark-json`` as the seed report's table.

The seed report is the report this project started from, whose server measured
6,500 → 18,000 messages/s on its own machine at p90/p95/p99 481/570/768 ms (see
``README.md``); its serialization table is ``SEED_PUBLISHED``.

For each benchmark group: per format, the median time per million operations in
ms, the encoded size in bytes, and both as a ratio to json. Usage::

    pytest bench/ --benchmark-only --benchmark-json=bench.json
    python -m bench.seed_table bench.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

SEED_PUBLISHED = {
    "seed message: serialize": {"json": 3588, "orjson": 407, "protobuf": 403},
    "seed message: deserialize": {"json": 2630, "orjson": 645, "protobuf": 344},
}
FORMAT = re.compile(r"\[(?:[a-z]+-)?(json|orjson|protobuf)\]$")


def render(document: dict) -> str:
    """The table text for a pytest-benchmark JSON document."""
    groups: dict[str, dict[str, tuple[float, int]]] = defaultdict(dict)
    for bench in document["benchmarks"]:
        match = FORMAT.search(bench["name"])
        if match is None:
            continue
        ms_per_million = bench["stats"]["median"] * 1e9
        groups[bench["group"]][match.group(1)] = (
            ms_per_million,
            bench["extra_info"].get("bytes", 0),
        )
    lines = [
        "median ms per million operations (pytest-benchmark), encoded bytes, ratios to json",
        f"{'group':<32}{'format':<10}{'ms/M':>9}{'vs json':>9}{'bytes':>7}{'vs json':>9}"
        f"{'seed ms/M':>11}",
    ]
    for group in sorted(groups):
        rows = groups[group]
        base_ms, base_bytes = rows.get("json", (0.0, 0))
        for fmt in ("json", "orjson", "protobuf"):
            if fmt not in rows:
                continue
            ms, size = rows[fmt]
            seed = SEED_PUBLISHED.get(group, {}).get(fmt)
            lines.append(
                f"{group:<32}{fmt:<10}{ms:>9,.0f}{ms / base_ms if base_ms else 0:>9.2f}"
                f"{size:>7}{size / base_bytes if base_bytes else 0:>9.2f}"
                f"{f'{seed:,}' if seed else '':>11}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the table for the file given."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.seed_table", description=__doc__.splitlines()[0]
    )
    parser.add_argument("benchmark_json", type=Path, help="file written by --benchmark-json")
    args = parser.parse_args(argv)
    print(render(json.loads(args.benchmark_json.read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
