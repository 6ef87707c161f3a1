"""``python -m bench.reconnect_storm``: every client of a restarted chat server back at once,
with refresh tokens and with passwords; what it costs the auth service in argon2.

Method: start an auth service and a chat server on loopback (``SERIALIZER=orjson``,
``JWT_LEEWAY_S=0``: one machine, no clock skew to allow for), register ``--users`` users
and connect ``--clients`` clients, each logged in on its own (a user holds
``clients / users`` of them, as a person holds tabs and devices; each login is its own
session), in rooms of ``--room-size``; every client sends one message and reads its
room's. Then, once per mode: wait until every access token has expired
(``--token-ttl-s`` and a second), restart the chat server (SIGTERM: the clients are
closed with 1001; then the same port again), and release every client at once: each
gets a new access token, reconnects, joins its room again with ``since`` the last
``seq`` it saw, and sends one message. A client is back when it has ``joined``, caught
up when it has seen every message of its room up to the last of the storm (what was
sent while it was away comes by the ``since`` replay). The modes:

- ``refresh``: the client spends its refresh token at ``POST /refresh`` (no password);
- ``password``: the client logs in with its password again (``POST /login``).

Reported per mode: argon2 hashes during the storm (the auth service's
``auth_hash_seconds_count``, every ``op``), seconds from the release until every client
was back and until every one was caught up, the auth calls, those answered 429/503 and
retried after their ``Retry-After``, those given up on, and the joins and sends made
again (answered with an error frame, or their connection closed first; a send again with
its ``ref``, which the server stores once). The auth service's per-address limits
(login, register, refresh) are off, since every client comes from 127.0.0.1; its argon2
cost is its configured one (its ``.env``, the environment; the defaults are
argon2-cffi's) unless ``--fast-argon2``; ``HASH_QUEUE_MAX`` its default. Auth
calls run ``--http-concurrency`` at a time (blocking ``urllib`` calls in threads; one
waiting out a ``Retry-After`` holds its thread).

Bounded: every storm ends within ``--timeout-s``; a client not caught up by then is
counted as missing. Exit status: 0 when every client was caught up in every mode, 1
otherwise, 2 for a bad argument.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException
from websockets.typing import Subprotocol

from chatlab.harness import FAST_ARGON2, AuthProcess, KeyPair, ServerProcess
from loadtest.auth import AuthClient, Grant
from loadtest.client import RETRIED_STATUSES, password_for

MODES = ("refresh", "password")
#: the auth service of the storm: every client is on 127.0.0.1, so no per-address limit
STORM_AUTH = {
    "LOGIN_RATE_PER_CLIENT_PER_MIN": "0",
    "REGISTER_RATE_PER_CLIENT_PER_MIN": "0",
    "LOGIN_RATE_PER_USER_PER_MIN": "0",
    "LOGIN_RATE_PER_USER_CLIENT_PER_MIN": "0",
    "REFRESH_RATE_PER_CLIENT_PER_MIN": "0",
    "LOG_LEVEL": "warning",
}
#: seconds between a client's connection attempts while the chat server does not answer
RECONNECT_PAUSE_S = 0.2
#: attempts of one auth call answered 429/503 (each after its Retry-After): the storm's
#: deadline, not this, is what bounds a storm
AUTH_ATTEMPTS = 1000
JSON = Subprotocol("chatlab.json")


@dataclass
class StormClient:
    """One client: its user, room, grant, and the last ``seq`` it saw of its room."""

    index: int
    user: str
    room: str
    grant: Grant | None = None
    last_seq: int = 0
    gaps: int = 0
    conn: ClientConnection | None = None
    reader: asyncio.Task[None] | None = None
    #: answers to the client's join: "joined", or an error frame's code
    join_answers: asyncio.Queue[str] = field(default_factory=asyncio.Queue)
    progressed: asyncio.Event = field(default_factory=asyncio.Event)
    #: the answer to the client's last send: "ack", or an error frame's code
    answered: asyncio.Queue[str] = field(default_factory=asyncio.Queue)


@dataclass
class ModeResult:
    """One storm's figures."""

    mode: str
    clients: int
    hashes: float
    back_s: float | None  # until the last client joined (None: not all did)
    caught_up_s: float | None  # until the last client saw every message of its room
    auth_calls: int
    retried: dict[int, int]  # status -> answers retried after their Retry-After
    given_up: int
    missing: int  # clients not caught up by the deadline
    gaps: int  # seq gaps seen (a message skipped: never expected)
    refused: dict[str, int]  # "join: CODE", "send: CODE", "...: closed CODE" -> times (then again)


class Storm:
    """The services, the clients and the auth client of one ``reconnect_storm`` run."""

    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        settings = {**STORM_AUTH, "TOKEN_TTL_S": str(args.token_ttl_s)}
        settings["REFRESH_FAMILIES_PER_USER"] = str(max(50, math.ceil(args.clients / args.users)))
        if args.fast_argon2:
            settings |= FAST_ARGON2
        (workdir / "auth").mkdir()
        self.auth = AuthProcess(workdir / "auth", **settings)
        self.server: ServerProcess | None = None
        self.pool = ThreadPoolExecutor(max_workers=args.http_concurrency)
        self.retried: Counter[int] = Counter()
        self.calls = 0
        self.given_up = 0
        self.client: AuthClient | None = None
        self.clients = [
            StormClient(
                i,
                f"storm{i % args.users}",
                f"storm-{i // args.room_size}",
            )
            for i in range(args.clients)
        ]
        self.targets: dict[str, int] = {}
        self.refused: Counter[str] = Counter()

    def _on_retry(self, name: str, status: int) -> None:
        if status in RETRIED_STATUSES:
            self.retried[status] += 1

    def _on_request(self, name: str, elapsed_ms: float, error: Exception | None) -> None:
        self.calls += 1
        if error is not None:
            self.given_up += 1

    # ---- services -----------------------------------------------------------------------

    def start(self) -> None:
        """Start the auth service, then the chat server on its public key."""
        self.auth.start(timeout_s=60)
        self.client = AuthClient(
            self.auth.url(),
            max_attempts=AUTH_ATTEMPTS,
            on_retry=self._on_retry,
            on_request=self._on_request,
        )
        (self.workdir / "chat").mkdir()
        self.server = ServerProcess(
            self.workdir / "chat",
            KeyPair(self.workdir / "chat"),  # unused: JWT_PUBLIC_KEY is the auth service's
            JWT_PUBLIC_KEY=str(self.auth.public_path),
            JWT_LEEWAY_S="0",
            SERIALIZER="orjson",
            LOG_LEVEL="warning",
        ).start()

    def stop(self) -> None:
        """Stop both services (bounded) and the HTTP threads."""
        for service in (self.server, self.auth):
            if service is not None:
                service.stop()
        self.pool.shutdown(wait=False, cancel_futures=True)

    def restart_chat(self) -> None:
        """SIGTERM the chat server (its clients are closed with 1001) and start it again on
        the same port."""
        assert self.server is not None
        self.server.stop()
        self.server.start(timeout_s=60)

    def hashes(self) -> float:
        """argon2 jobs the auth service has run so far (``auth_hash_seconds_count``, every op)."""
        text = self.auth.get("/metrics").body.decode()
        return sum(
            s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "auth_hash_seconds_count"
        )

    # ---- auth calls, in threads ---------------------------------------------------------

    async def _blocking(self, call: Callable[[AuthClient], Any]) -> Any:
        auth = self.client
        assert auth is not None, "start() first"
        return await asyncio.get_running_loop().run_in_executor(self.pool, call, auth)

    async def login(self, client: StormClient) -> None:
        """Log ``client`` in with its user's password: a new session."""
        client.grant = await self._blocking(
            lambda auth: auth.login(client.user, password_for(client.user))
        )

    async def refresh(self, client: StormClient) -> None:
        """Spend ``client``'s refresh token for a new grant."""
        assert client.grant is not None and client.grant.refresh_token is not None
        token = client.grant.refresh_token
        client.grant = await self._blocking(lambda auth: auth.refresh(token))

    async def register(self, user: str) -> None:
        """Register ``user`` (taken already: fine)."""
        await self._blocking(lambda auth: auth.register(user, password_for(user)))

    # ---- the chat side ------------------------------------------------------------------

    async def connect(self, client: StormClient, deadline: float) -> None:
        """Connect with the client's token, join its room with ``since`` the last seq it
        saw, and start reading. A server that does not answer yet is tried again; a join
        refused (an error frame) is sent again, and a connection closed before ``joined``
        opened again, each counted (until the deadline)."""
        while True:
            conn = await self._open(client, deadline)
            client.conn = conn
            client.reader = asyncio.create_task(self._read(client, conn))
            while True:
                join: dict[str, Any] = {"type": "join", "room": client.room}
                if client.last_seq:
                    join["since"] = client.last_seq
                with contextlib.suppress(ConnectionClosed):
                    await conn.send(json.dumps(join))
                answer = await self._answer(client, client.join_answers)
                if answer == "joined":
                    return
                self.refused[f"join: {answer}"] += 1
                await asyncio.sleep(RECONNECT_PAUSE_S)
                if answer.startswith("closed"):
                    break

    async def _open(self, client: StormClient, deadline: float) -> ClientConnection:
        """The websocket, opened with the client's token; again while the server does not
        answer (until the deadline). A refused handshake (401) raises: a failure of the run."""
        assert self.server is not None and client.grant is not None
        while True:
            try:
                return await connect(
                    self.server.url,
                    additional_headers={"Authorization": f"Bearer {client.grant.access_token}"},
                    subprotocols=[JSON],
                    compression=None,
                    open_timeout=max(1.0, deadline - time.monotonic()),
                )
            except InvalidStatus:
                raise
            except (OSError, WebSocketException, TimeoutError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(RECONNECT_PAUSE_S)

    async def _answer(self, client: StormClient, answers: asyncio.Queue[str]) -> str:
        """The next answer in ``answers``, or ``closed CODE`` when the connection ends first."""
        assert client.reader is not None and client.conn is not None
        getter = asyncio.ensure_future(answers.get())
        await asyncio.wait({getter, client.reader}, return_when=asyncio.FIRST_COMPLETED)
        if getter.done():
            return getter.result()
        getter.cancel()
        return f"closed {client.conn.close_code}"

    async def _read(self, client: StormClient, conn: ClientConnection) -> None:
        with_gaps = 0
        try:
            async for raw in conn:
                frame = json.loads(raw)
                kind = frame.get("type")
                if kind == "joined":
                    client.join_answers.put_nowait("joined")
                elif kind == "ack":
                    client.answered.put_nowait("ack")
                elif kind == "error":
                    code = str(frame.get("code"))
                    queue = client.answered if frame.get("ref") else client.join_answers
                    queue.put_nowait(code)
                elif kind == "message" and frame.get("room") == client.room:
                    seq = int(frame["seq"])
                    if seq > client.last_seq + 1:
                        with_gaps += 1
                    client.last_seq = max(client.last_seq, seq)
                    client.progressed.set()
        except ConnectionClosed:
            pass
        finally:
            client.gaps += with_gaps

    async def say(self, client: StormClient, text: str, deadline: float) -> None:
        """Send one chat message to the client's room and wait for its ack. A send refused
        (an error frame), or whose connection closed first, is counted and sent again with
        the same ``ref`` (the server stores it once), on a new connection if need be."""
        body = {"type": "send", "room": client.room, "body": text, "ref": f"{client.index}-{text}"}
        while True:
            assert client.conn is not None
            with contextlib.suppress(ConnectionClosed):
                await client.conn.send(json.dumps(body))
            answer = await self._answer(client, client.answered)
            if answer == "ack":
                return
            self.refused[f"send: {answer}"] += 1
            await asyncio.sleep(RECONNECT_PAUSE_S)
            if answer.startswith("closed"):
                await self.connect(client, deadline)

    async def caught_up(self, client: StormClient) -> None:
        """Return once the client has seen its room's target seq."""
        while client.last_seq < self.targets[client.room]:
            client.progressed.clear()
            if client.last_seq >= self.targets[client.room]:
                return
            await client.progressed.wait()

    def expect_one_each(self) -> None:
        """Every client sends one message: each room's target grows by its members."""
        for client in self.clients:
            self.targets[client.room] = self.targets.get(client.room, 0) + 1

    async def close_all(self) -> None:
        """Wait for every reader to end (the server closed the connections)."""
        readers = [c.reader for c in self.clients if c.reader is not None]
        await asyncio.wait_for(asyncio.gather(*readers, return_exceptions=True), 30)
        for c in self.clients:
            c.conn = c.reader = None


async def _bounded(coros: list[Any], deadline: float) -> tuple[int, list[BaseException]]:
    """Run ``coros`` at once until they end or the deadline: (how many ended well, errors)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    done, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - time.monotonic()))
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    errors = [e for t in done if (e := t.exception()) is not None]
    return len(done) - len(errors), errors


class Progress:
    """One line on stderr every couple of seconds while a phase runs (off with --quiet)."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.started = time.monotonic()

    def say(self, text: str) -> None:
        if not self.quiet:
            print(f"[{time.monotonic() - self.started:6.1f} s] {text}", file=sys.stderr, flush=True)

    async def watch(self, what: str, count: Callable[[], int], total: int) -> None:
        while True:
            await asyncio.sleep(2.0)
            self.say(f"{what}: {count()}/{total}")


async def _phase(
    progress: Progress, what: str, coros: list[Any], deadline: float, count: Callable[[], int]
) -> tuple[int, list[BaseException]]:
    watcher = asyncio.create_task(progress.watch(what, count, len(coros)))
    try:
        return await _bounded(coros, deadline)
    finally:
        watcher.cancel()


async def _wait_expired(storm: Storm, progress: Progress) -> None:
    """Sleep until every client's access token has expired (and a second more)."""
    latest = max(c.grant.expires_at or 0.0 for c in storm.clients if c.grant is not None)
    wait_s = latest + 1.0 - time.time()
    if wait_s > 0:
        progress.say(f"waiting {wait_s:.0f} s for every access token to expire")
        await asyncio.sleep(wait_s)


async def setup(storm: Storm, progress: Progress) -> None:
    """Users registered, every client logged in, connected, joined, one message each seen."""
    args = storm.args
    deadline = time.monotonic() + args.timeout_s
    users = sorted({c.user for c in storm.clients})
    progress.say(f"registering {len(users)} users (one argon2 hash each)")
    ok, errors = await _bounded([storm.register(u) for u in users], deadline)
    if errors or ok < len(users):
        raise RuntimeError(f"registering: {ok} of {len(users)}; {errors[:1]}")
    done = [0]

    async def first(client: StormClient) -> None:
        await storm.login(client)
        await storm.connect(client, deadline)
        done[0] += 1

    progress.say(f"logging in and connecting {len(storm.clients)} clients (one hash each)")
    ok, errors = await _phase(
        progress, "connected", [first(c) for c in storm.clients], deadline, lambda: done[0]
    )
    if errors or ok < len(storm.clients):
        raise RuntimeError(f"connecting: {ok} of {len(storm.clients)}; {errors[:1]}")
    storm.expect_one_each()
    ok, errors = await _bounded([storm.say(c, "before", deadline) for c in storm.clients], deadline)
    if errors or ok < len(storm.clients):
        raise RuntimeError(f"first messages: {ok} of {len(storm.clients)} acked; {errors[:1]}")
    ok, errors = await _bounded([storm.caught_up(c) for c in storm.clients], deadline)
    if errors or ok < len(storm.clients):
        raise RuntimeError(f"first messages: {ok} of {len(storm.clients)} caught up")


async def storm_once(storm: Storm, mode: str, progress: Progress) -> ModeResult:
    """Expire the tokens, restart the chat server, release every client at once."""
    await _wait_expired(storm, progress)
    progress.say("restarting the chat server")
    # in a thread: the clients must answer the server's closing handshakes meanwhile
    await asyncio.to_thread(storm.restart_chat)
    await storm.close_all()
    hashes_before = await asyncio.to_thread(storm.hashes)
    calls_before, given_up_before = storm.calls, storm.given_up
    retried_before = Counter(storm.retried)
    refused_before = Counter(storm.refused)
    storm.expect_one_each()
    back: list[float] = []
    caught: list[float] = []
    gaps_before = sum(c.gaps for c in storm.clients)
    started = time.monotonic()
    deadline = started + storm.args.timeout_s

    async def reconnect(client: StormClient) -> None:
        await (storm.refresh(client) if mode == "refresh" else storm.login(client))
        await storm.connect(client, deadline)
        back.append(time.monotonic() - started)
        await storm.say(client, f"back-{mode}", deadline)
        await storm.caught_up(client)
        caught.append(time.monotonic() - started)

    progress.say(f"storm ({mode}): {len(storm.clients)} clients at once")
    _, errors = await _phase(
        progress,
        f"caught up ({mode})",
        [reconnect(c) for c in storm.clients],
        deadline,
        lambda: len(caught),
    )
    for error in errors[:3]:
        progress.say(f"a client failed: {type(error).__name__}: {error}")
    behind = [c for c in storm.clients if c.last_seq < storm.targets[c.room]]
    for c in behind[:3]:
        progress.say(
            f"not caught up: client {c.index} in {c.room} saw seq {c.last_seq} of "
            f"{storm.targets[c.room]}"
        )
    total = len(storm.clients)
    return ModeResult(
        mode=mode,
        clients=total,
        hashes=await asyncio.to_thread(storm.hashes) - hashes_before,
        back_s=max(back) if len(back) == total else None,
        caught_up_s=max(caught) if len(caught) == total else None,
        auth_calls=storm.calls - calls_before,
        retried=dict(storm.retried - retried_before),
        given_up=storm.given_up - given_up_before,
        missing=total - len(caught),
        gaps=sum(c.gaps for c in storm.clients) - gaps_before,
        refused=dict(storm.refused - refused_before),
    )


def summary(args: argparse.Namespace, cost: str, results: list[ModeResult]) -> str:
    """The table printed at the end."""

    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    lines = [
        f"reconnect storm: {args.clients} clients ({args.users} users, "
        f"{args.clients / args.users:g} sessions each), rooms of {args.room_size}, "
        f"TOKEN_TTL_S {args.token_ttl_s}, {cost}; auth per-address limits off; "
        f"{args.http_concurrency} auth calls in flight at most",
        f"{'mode':<9}{'argon2 hashes':>14}{'all back s':>12}{'all caught up s':>17}"
        f"{'auth calls':>12}{'429 retried':>13}{'503 retried':>13}{'given up':>10}"
        f"{'missing':>9}{'gaps':>6}{'joins/sends again':>19}",
    ]
    for r in results:
        lines.append(
            f"{r.mode:<9}{r.hashes:>14.0f}{seconds(r.back_s):>12}{seconds(r.caught_up_s):>17}"
            f"{r.auth_calls:>12}{r.retried.get(429, 0):>13}{r.retried.get(503, 0):>13}"
            f"{r.given_up:>10}{r.missing:>9}{r.gaps:>6}"
            f"{sum(r.refused.values()):>19}"
        )
    return "\n".join(lines)


def argon2_cost(storm: Storm) -> str:
    """The auth service's argon2 cost, as its settings give it."""
    from auth_service.passwords import Argon2Params
    from auth_service.settings import Settings

    params = Argon2Params.from_settings(Settings.load(storm.auth.env))
    return f"argon2id t={params.time_cost} m={params.memory_cost_kib} KiB p={params.parallelism}"


async def run(args: argparse.Namespace, workdir: Path) -> tuple[str, list[ModeResult]]:
    """Set up, storm once per mode, stop; the argon2 cost and each mode's figures."""
    progress = Progress(args.quiet)
    storm = Storm(args, workdir)
    try:
        progress.say("starting the auth service and the chat server")
        storm.start()
        cost = argon2_cost(storm)
        await setup(storm, progress)
        results = [await storm_once(storm, mode, progress) for mode in args.modes]
    finally:
        storm.stop()
    return cost, results


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line; exit 2 naming a bad value."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.reconnect_storm",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="A load measurement: it owns the machine. The test runs it with 20 clients "
        "and --fast-argon2.",
    )
    parser.add_argument("--clients", type=int, default=2000, help="clients [2000]")
    parser.add_argument(
        "--users",
        type=int,
        default=0,
        help="users the clients log in as (each client its own session) [clients / 10]",
    )
    parser.add_argument("--room-size", type=int, default=10, help="clients per room [10]")
    parser.add_argument(
        "--token-ttl-s", type=int, default=20, help="the auth service's TOKEN_TTL_S [20]"
    )
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"storms to run, in order, comma-separated [{','.join(MODES)}]",
    )
    parser.add_argument(
        "--http-concurrency", type=int, default=200, help="auth calls in flight at most [200]"
    )
    parser.add_argument(
        "--timeout-s", type=float, default=600, help="the longest one phase may take [600]"
    )
    parser.add_argument(
        "--fast-argon2",
        action="store_true",
        help="cheap argon2 parameters (for tests; the hash counts stay, the times do not)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)
    args.users = args.users or max(1, args.clients // 10)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in args.modes if m not in MODES]
    if bad or not args.modes:
        parser.error(f"--modes {','.join(bad) or '(none)'}: each one of {', '.join(MODES)}")
    for name in ("clients", "users", "room_size", "token_ttl_s", "http_concurrency"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be 1 or more")
    if args.users > args.clients:
        parser.error(f"--users {args.users}: at most --clients ({args.clients})")
    if args.timeout_s <= 0:
        parser.error("--timeout-s must be above 0")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the storms; print the table; 0 when every client caught up in every mode."""
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="chatlab-storm-") as tmp:
        cost, results = asyncio.run(run(args, Path(tmp)))
    print(summary(args, cost, results))
    if args.json:
        args.json.write_text(
            json.dumps({"cost": cost, "modes": [asdict(r) for r in results]}, indent=2) + "\n"
        )
    return 0 if all(r.missing == 0 and r.given_up == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
