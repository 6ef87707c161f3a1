"""``python -m bench.slow_consumer``: what a reader that stops costs the server, and for how long.

Method: start ``python -m chat_server`` (uvloop, orjson, ``MAX_OUTBOUND_BYTES`` and
``CLOSE_TIMEOUT_S`` at their defaults unless given), put a reader that stops reading at
once (its transport paused, as a client whose process hangs) and a talker that keeps
reading into one room, and have the talker send 3,000-character messages at
``--rate`` until the server closes the reader with 1013 (its ``/stats``). Every 50 ms
``ss -tnm`` reads the server's end of the reader's socket: state, Send-Q and the
kernel memory it holds (``skmem``: ``w`` queued for sending, ``tb`` the send buffer's
bound). Reported per variant: seconds and bytes sent until the 1013, the peak kernel
memory of that socket before and after the close, and how long the socket outlived
the close (and in which state). Variants: ``SOCKET_SEND_BUFFER_BYTES=0`` (the kernel's
autotuning, how the server ran before the setting) and the default (64 KiB); with
``--server-root`` the server runs from another checkout (an older commit, for a
before/after of the reset on drop).

Exit status: 0 when every variant ended in a 1013 close, 1 otherwise, 2 for a bad argument.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from websockets.asyncio.client import ClientConnection, connect

from chatlab.harness import KeyPair, ServerProcess

#: the message body the talker sends (characters)
BODY_CHARS = 3000
#: how often the server's socket is read with ``ss``
POLL_S = 0.05
#: the longest a variant may take until its 1013
MOST_S = 60.0
#: how long after the close the socket is watched
AFTER_CLOSE_S = 20.0
_SKMEM = re.compile(r"skmem:\(([^)]*)\)")


def server_socket(port: int, client_port: int) -> dict[str, Any] | None:
    """The server's end of the connection from ``client_port``: state, Send-Q, skmem fields."""
    result = subprocess.run(
        ["ss", "-tanmH", f"( sport = :{port} and dport = :{client_port} )"],
        capture_output=True,
        text=True,
        check=True,
    )
    line = " ".join(result.stdout.split())
    if not line:
        return None
    fields = line.split()
    found: dict[str, Any] = {"state": fields[0], "send_q": int(fields[2])}
    if match := _SKMEM.search(line):
        for item in match.group(1).split(","):
            key = item.rstrip("0123456789")
            found[key] = int(item[len(key) :])
    return found


async def _read_all(conn: ClientConnection) -> None:
    async for _ in conn:
        pass


async def measure(
    send_buffer_bytes: int, rate: float, settings: dict[str, str], server_root: Path | None
) -> dict[str, Any]:
    """One variant: a stuck reader until its 1013 and its socket until it is gone."""
    with tempfile.TemporaryDirectory(prefix="chatlab-slow-") as tmp:
        keys = KeyPair(Path(tmp))
        server = ServerProcess(
            Path(tmp),
            keys,
            serializer="orjson",
            event_loop="uvloop",
            socket_send_buffer_bytes=send_buffer_bytes,
            close_timeout_s=5,
            rate_limit_per_s=100000,
            rate_limit_burst=100000,
            log_level="warning",
            **settings,
        )
        if server_root is not None:
            server.env["PYTHONPATH"] = str(server_root)
        server.start()
        try:
            assert server.proc is not None
            rss = psutil.Process(server.proc.pid)
            return await _stuck_reader(server, keys, rate, rss)
        finally:
            server.stop()


async def _stuck_reader(
    server: ServerProcess, keys: KeyPair, rate: float, rss: psutil.Process
) -> dict[str, Any]:
    def session(user: str, **kwargs: Any) -> Any:
        return connect(
            server.url,
            additional_headers={"Authorization": f"Bearer {keys.mint(user)}"},
            ping_interval=None,
            **kwargs,
        )

    async with session("stuck", max_queue=1) as stuck, session("talker") as talker:
        for conn in (stuck, talker):
            await conn.recv()  # welcome
            await conn.send(json.dumps({"type": "join", "room": "slow"}))
            await conn.recv()  # joined
        stuck.transport.pause_reading()
        client_port = stuck.transport.get_extra_info("sockname")[1]
        reading = asyncio.ensure_future(_read_all(talker))
        rss_before = rss.memory_info().rss
        body = "x" * BODY_CHARS
        frame = json.dumps({"type": "send", "room": "slow", "body": body})
        started = time.monotonic()
        sent = 0
        peak: dict[str, int] = {"w": 0, "send_q": 0, "tb": 0}
        peak_rss = rss_before
        closed_after_s = None
        while time.monotonic() - started < MOST_S:
            due = int((time.monotonic() - started) * rate) - sent
            for _ in range(max(0, due)):
                await talker.send(frame)
                sent += 1
            seen = server_socket(server.port, client_port)
            if seen is not None:
                for key, most in peak.items():
                    peak[key] = max(most, seen.get(key, 0))
            peak_rss = max(peak_rss, rss.memory_info().rss)
            if server.stats()["slow_consumer_closes"]:
                closed_after_s = time.monotonic() - started
                break
            await asyncio.sleep(POLL_S)
        closed_at = time.monotonic()
        states: list[str] = []
        after_peak_w = 0
        gone_after_s = None
        while time.monotonic() - closed_at < AFTER_CLOSE_S:
            seen = server_socket(server.port, client_port)
            if seen is None:
                gone_after_s = time.monotonic() - closed_at
                break
            if not states or states[-1] != seen["state"]:
                states.append(seen["state"])
            after_peak_w = max(after_peak_w, seen.get("w", 0))
            await asyncio.sleep(POLL_S)
        reading.cancel()
        stuck.transport.abort()
    return {
        "closed_1013_after_s": closed_after_s,
        "bytes_sent_to_reader": sent * (len(frame) + 60),  # the message frame, roughly
        "peak_kernel_queued_bytes": peak["w"],
        "peak_send_q_bytes": peak["send_q"],
        "send_buffer_bound_bytes": peak["tb"],
        "server_rss_growth_bytes": peak_rss - rss_before,
        "states_after_close": states,
        "kernel_queued_after_close_bytes": after_peak_w,
        "socket_gone_after_close_s": gone_after_s,
    }


def main(argv: list[str] | None = None) -> int:
    """Measure each ``--send-buffer-bytes`` variant and print a table."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.slow_consumer", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--send-buffer-bytes",
        default="0,65536",
        help="SOCKET_SEND_BUFFER_BYTES values to compare, 0 = kernel autotuning [0,65536]",
    )
    parser.add_argument("--rate", type=float, default=200, help="talker's sends/s [200]")
    parser.add_argument(
        "--server-root",
        type=Path,
        help="run the server from this checkout (e.g. a git worktree of an older commit)",
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    try:
        variants = [int(v) for v in args.send_buffer_bytes.split(",") if v.strip()]
    except ValueError:
        parser.error(f"--send-buffer-bytes {args.send_buffer_bytes!r}: a comma list of integers")
    results = []
    for send_buffer in variants:
        print(f"measuring SOCKET_SEND_BUFFER_BYTES={send_buffer} ...", file=sys.stderr)
        result = asyncio.run(measure(send_buffer, args.rate, {}, args.server_root))
        results.append({"socket_send_buffer_bytes": send_buffer, **result})
    print("a reader that stops: the server's end of its socket (ss -tnm), until gone")
    header = (
        f"{'SNDBUF':>8} {'1013 after':>11} {'sent to it':>11} {'peak kernel':>12} "
        f"{'server RSS +':>13} {'after close':>24} {'kernel then':>12} {'gone after':>11}"
    )
    print(header)
    for r in results:
        gone = r["socket_gone_after_close_s"]
        closed = r["closed_1013_after_s"]
        print(
            f"{r['socket_send_buffer_bytes']:>8} "
            f"{'never' if closed is None else f'{closed:.1f} s':>11} "
            f"{r['bytes_sent_to_reader'] / 2**20:>7.1f} MiB "
            f"{r['peak_kernel_queued_bytes'] / 2**10:>8.0f} KiB "
            f"{r['server_rss_growth_bytes'] / 2**20:>9.1f} MiB "
            f"{' > '.join(r['states_after_close']) or '-':>24} "
            f"{r['kernel_queued_after_close_bytes'] / 2**10:>8.0f} KiB "
            f"{f'{gone:.1f} s' if gone is not None else f'> {AFTER_CLOSE_S:g} s':>11}"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0 if all(r["closed_1013_after_s"] is not None for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
