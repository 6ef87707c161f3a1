"""The report's scaling section: the function, each term's measured figure and source,
the ``WORKERS=2`` check, and a plan for the README's example target."""

from __future__ import annotations

from bench.lab.parts import check_of, parts_of
from bench.lab.plan import EXAMPLE_TARGET, RANGE_NOTE, plan
from bench.lab.report.model import Block, Bullets, Heading, Para, Table
from bench.lab.results import Results

#: each term: its name in the function, what it is
TERMS = {
    "u1": "chat CPU µs per delivered frame, one process on Redis, spread 1",
    "beta": "extra chat CPU µs per delivered frame for each further process holding a room",
    "knee": "one process on Redis: delivered/s at the SLO, spread 1",
    "redis_commit_us": "Redis CPU µs per commit (one send)",
    "redis_delivery_us": "Redis CPU µs per subscriber delivery (one process per room)",
    "logins_per_cpu_s": "argon2 logins per CPU-second, the configured cost",
    "refreshes_per_cpu_s": "POST /refresh answered per CPU-second of the auth service",
    "bytes_per_connection": "chat process memory per idle connection",
}

FUNCTION = (
    "For sends/s S in rooms of m members whose members are on s processes (D = S x m "
    "delivered/s): N chat processes hold D <= N x knee x u1 / u(s), with u(s) = u1 + "
    "(s - 1) x beta x m0 / m (m0: the measured room size); R Redis primaries hold "
    "S <= R x share x 10^6 / (redis_commit_us + s x redis_delivery_us); the connections "
    "N x memory per process / bytes_per_connection; A auth replicas of c cores "
    "A x c x share x logins_per_cpu_s logins/s on their hashing cores and A x share x "
    "refreshes_per_cpu_s logins plus refreshes/s on their event loops. Members placed at "
    "random are on s = N x (1 - (1 - 1/N)^m) processes on average. Spread 1 and the "
    "largest measured give the slopes; the spread between them is the check."
)


def scaling_blocks(results: Results) -> list[Block]:
    """The scaling section; empty for a run that measured none of its parts."""
    parts = parts_of(results)
    if parts.u1 is None and parts.knee is None and parts.logins_per_cpu_s is None:
        return []
    rows = []
    for name, meaning in TERMS.items():
        figure = getattr(parts, name)
        rows.append(
            [
                name,
                meaning,
                figure.text() if figure else "not measured",
                figure.source if figure else "",
            ]
        )
    blocks: list[Block] = [
        Heading(2, "The scaling function"),
        Para(FUNCTION),
        Table(["term", "what", "measured (median, min-max)", "from"], rows),
    ]
    if parts.notes:
        blocks.append(
            Table(
                ["beside the terms", "measured", "from"],
                [[name, f.text(), f.source] for name, f in parts.notes.items()],
            )
        )
    check = check_of(results)
    blocks.append(
        Para(
            f"The check: {check.sentence()}."
            if check
            else "The check: not made (it needs WORKERS=1, 2 and 4 on one Redis)."
        )
    )
    if parts.caveats:
        blocks.append(Bullets(list(parts.caveats)))
    skipped = results.parts.get("skipped") or {}
    if skipped:
        blocks.append(Bullets([f"skipped: {name}: {why}" for name, why in skipped.items()]))
    found = plan(parts, EXAMPLE_TARGET)
    t = EXAMPLE_TARGET
    blocks.append(
        Para(
            f"A plan on these figures for {t.users:,} users, {t.sends_per_user_per_min:g} "
            f"sends per user per minute, rooms of {t.room_size}, {t.logins_per_s:g} "
            f"logins/s (python -m bench.lab plan --from <this run>/results.json with "
            "another target):"
        )
    )
    blocks.append(
        Table(
            ["tier", "for the load", "with n+1", "range with n+1", "widened most by", "decided by"],
            [
                [
                    x.name,
                    str(x.for_load),
                    x.total_text(),
                    x.range.text() if x.range else "",
                    x.range.widest.text() if x.range and x.range.widest else "no part",
                    x.decided_by,
                ]
                for x in found.tiers
            ]
            + [[reason, "", "", "", "", ""] for reason in found.not_planned],
        )
    )
    blocks.append(Para(RANGE_NOTE))
    blocks.append(Bullets(list(found.assumptions)))
    return blocks
