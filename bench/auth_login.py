"""Logins per second with the hashing pool versus inline on the event loop, and the loop's health.

What is measured, for each mode in the same run: ``--concurrency`` coroutines
verify a correct password again and again for ``--duration-s`` seconds (the argon2
work of a login), while a ticker coroutine on the same event loop asks to wake
every 10 ms and records how late each wake-up is. *pool* is the auth service's
:class:`~auth_service.passwords.PasswordPool` (worker processes, bounded
admission); *inline* is :class:`~auth_service.passwords.InlinePasswords`, the
REGRESSION=auth_inline path that hashes on the event loop. The ticker's lateness
is what every other coroutine of that process (chat traffic, in the regression)
would suffer. argon2 parameters default to argon2-cffi's own (RFC 9106 low-memory).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import argon2

from auth_service.errors import Unavailable
from auth_service.passwords import Argon2Params, InlinePasswords, PasswordPool

TICK_S = 0.010


async def _ticker(measuring: asyncio.Event, stop: asyncio.Event, lateness_ms: list[float]) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        due = loop.time() + TICK_S
        await asyncio.sleep(TICK_S)
        if measuring.is_set():
            lateness_ms.append((loop.time() - due) * 1000)


async def _login_loop(
    passwords: PasswordPool | InlinePasswords,
    password_hash: str,
    stop: asyncio.Event,
    done: list[int],
) -> None:
    while not stop.is_set():
        try:
            verdict = await passwords.verify(password_hash, "correct horse battery")
        except Unavailable:
            await asyncio.sleep(0.01)  # admission refused: the service would answer 503
            continue
        assert verdict.ok
        done[0] += 1
        # the next request arrives through I/O: that is where a real server yields
        await asyncio.sleep(0)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def measure(mode: str, params: Argon2Params, args: argparse.Namespace) -> dict[str, Any]:
    """Run one mode and return logins/s and the ticker's lateness percentiles."""
    pool_size = args.pool_size or max(1, len(os.sched_getaffinity(0)) - 1)
    passwords: PasswordPool | InlinePasswords
    if mode == "pool":
        passwords = PasswordPool(params, pool_size, args.concurrency)
    else:
        passwords = InlinePasswords(params)
    await passwords.start()
    password_hash = params.hasher().hash("correct horse battery")
    stop = asyncio.Event()
    lateness_ms: list[float] = []
    done = [0]
    measuring = asyncio.Event()
    ticker = asyncio.ensure_future(_ticker(measuring, stop, lateness_ms))
    await asyncio.sleep(0.05)
    measuring.set()
    started = time.perf_counter()
    workers = [
        asyncio.ensure_future(_login_loop(passwords, password_hash, stop, done))
        for _ in range(args.concurrency)
    ]
    await asyncio.sleep(args.duration_s)
    stop.set()
    await asyncio.gather(*workers)
    elapsed = time.perf_counter() - started
    await ticker
    await passwords.close()
    return {
        "mode": mode,
        "pool_size": pool_size if mode == "pool" else 0,
        "logins": done[0],
        "logins_per_s": done[0] / elapsed,
        "tick_late_p50_ms": statistics.median(lateness_ms),
        "tick_late_p99_ms": _percentile(lateness_ms, 0.99),
        "tick_late_max_ms": max(lateness_ms),
        "ticks": len(lateness_ms),
        "ticks_expected": int(elapsed / TICK_S),
    }


def main(argv: list[str] | None = None) -> int:
    """Run both modes, print a side-by-side table."""
    defaults = argon2.PasswordHasher()
    parser = argparse.ArgumentParser(
        prog="python -m bench.auth_login", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--duration-s", type=float, default=10, help="seconds per mode")
    parser.add_argument("--concurrency", type=int, default=8, help="logins in flight")
    parser.add_argument("--pool-size", type=int, default=0, help="0: usable cores - 1 (min 1)")
    parser.add_argument("--time-cost", type=int, default=defaults.time_cost)
    parser.add_argument("--memory-cost-kib", type=int, default=defaults.memory_cost)
    parser.add_argument("--parallelism", type=int, default=defaults.parallelism)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    params = Argon2Params(args.time_cost, args.memory_cost_kib, args.parallelism)
    results = []
    for mode in ("pool", "inline"):
        print(f"measuring {mode} for {args.duration_s:g} s ...", file=sys.stderr)
        results.append(asyncio.run(measure(mode, params, args)))
    print(
        f"logins with argon2id t={params.time_cost} m={params.memory_cost_kib} KiB "
        f"p={params.parallelism}, {args.concurrency} in flight, {args.duration_s:g} s each; "
        f"lateness of a 10 ms timer on the same event loop"
    )
    print(
        f"{'mode':<8}{'logins/s':>10}{'late p50 ms':>13}{'late p99 ms':>13}"
        f"{'late max ms':>13}{'ticks seen/due':>16}"
    )
    for r in results:
        print(
            f"{r['mode']:<8}{r['logins_per_s']:>10.1f}{r['tick_late_p50_ms']:>13.1f}"
            f"{r['tick_late_p99_ms']:>13.1f}{r['tick_late_max_ms']:>13.1f}"
            f"{r['ticks']:>9}/{r['ticks_expected']}"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
