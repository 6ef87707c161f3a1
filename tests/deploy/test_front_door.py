"""deploy/haproxy: Debian's HAProxy, configured by chatlab.front_door, in front of two chat
processes on Redis and two auth replicas on PostgreSQL, terminating TLS for both on one
address (a certificate from a throwaway CA).

One front door and its backends serve the whole module; a test that kills or stops a
backend starts it again before it ends, so each test finds both of each up.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import shlex
import shutil
import signal
import ssl
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect

from chat_server.codecs import get_codec
from chat_server.messages import Welcome
from chat_server.settings import SPECS as CHAT_SPECS
from chatlab.front_door import HIDDEN_PATHS, FrontDoor, main, render
from chatlab.haproxy import HAPROXY, HAProxyProcess
from chatlab.harness import AuthProcess, KeyPair, RedisProcess, ServerProcess
from chatlab.postgres import PostgresProcess
from tests.support import CHROMIUM, NO_LIMITS, ROOT, Client, say_acked, wait_until
from tests.support.auth import TEST_SETTINGS, logins_answered
from tests.support.browser import CHROMEDRIVER, browsers
from tests.support.tls import ThrowawayCA, trusted_by_chromium

pytestmark = pytest.mark.skipif(
    shutil.which(HAPROXY) is None,
    reason=f"no {HAPROXY}: CI and the setup script install Debian's haproxy",
)

PASSWORD = "correct horse"
#: registrations one client address may make at once on a replica (the limits test drains it)
REGISTER_BURST = 10
EXAMPLES = sorted((ROOT / "deploy" / "haproxy").glob("*.cfg"))


@dataclass
class Door:
    """The module's front door and what stands behind it."""

    proxy: HAProxyProcess
    chats: list[ServerProcess]
    replicas: list[AuthProcess]

    def all_up(self) -> bool:
        """True when the proxy sees every server up."""
        states = self.proxy.server_states()
        return len(states) == 4 and set(states.values()) == {"UP"}


def _request(
    method: str,
    port: int,
    path: str,
    payload: Any = None,
    *,
    source: str = "127.0.0.1",
    context: ssl.SSLContext | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    """One HTTP(S) request to 127.0.0.1:``port`` from the address ``source``; status and
    the body as JSON (None when it is not)."""
    if context is None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(source, 0))
    else:
        conn = http.client.HTTPSConnection(
            "127.0.0.1", port, timeout=30, source_address=(source, 0), context=context
        )
    body = None if payload is None else json.dumps(payload).encode()
    try:
        conn.request(method, path, body, {"Content-Type": "application/json", **(headers or {})})
        reply = conn.getresponse()
        data = reply.read()
    finally:
        conn.close()
    try:
        return reply.status, json.loads(data)
    except ValueError:
        return reply.status, None


def _through(door: Door, path: str, payload: Any = None, **kwargs: Any) -> tuple[int, Any]:
    """POST (GET without ``payload``) through the front door."""
    method = "GET" if payload is None else "POST"
    return _request(method, door.proxy.port, path, payload, context=door.proxy.client_ssl, **kwargs)


def _token(door: Door, name: str, source: str = "127.0.0.1") -> str:
    """Register ``name`` and log in through the front door; the access token."""
    account = {"username": name, "password": PASSWORD}
    assert _through(door, "/register", account, source=source)[0] == 201
    status, body = _through(door, "/login", account, source=source)
    assert status == 200, body
    return str(body["access_token"])


def _replica_of(door: Door, source: str) -> AuthProcess:
    """The auth replica the front door sends ``source``'s requests to (found by a login
    of nobody, which only that replica counts)."""
    before = [logins_answered(replica, 401) for replica in door.replicas]
    nobody = {"username": f"nobody{uuid.uuid4().hex[:8]}", "password": PASSWORD}
    assert _through(door, "/login", nobody, source=source)[0] == 401
    (serving,) = [
        replica
        for replica, count in zip(door.replicas, before, strict=True)
        if logins_answered(replica, 401) > count
    ]
    return serving


@pytest.fixture(scope="module")
def door(
    tmp_path_factory: pytest.TempPathFactory,
    keys: KeyPair,
    ca: ThrowawayCA,
    postgres: PostgresProcess,
) -> Iterator[Door]:
    """HAProxy on 127.0.0.1 with TLS in front of two chat processes (``BROKER=redis``) and
    two auth replicas (one PostgreSQL database), all with ``TRUSTED_PROXIES=127.0.0.1``."""
    workdir = tmp_path_factory.mktemp("front-door")
    for name in ("redis", "proxy", "auth0", "auth1", "chat0", "chat1"):
        (workdir / name).mkdir()
    redis = RedisProcess(workdir / "redis")
    db_url = postgres.create_database(f"door_{uuid.uuid4().hex[:12]}")
    replicas = [
        AuthProcess(
            workdir / f"auth{index}",
            **{
                **TEST_SETTINGS,
                "REGISTER_RATE_PER_CLIENT_PER_MIN": "60",
                "REGISTER_BURST_PER_CLIENT": str(REGISTER_BURST),
            },
            AUTH_DB_URL=db_url,
            TRUSTED_PROXIES="127.0.0.1",
        )
        for index in range(2)
    ]
    jwks_urls = ",".join(replica.url("/.well-known/jwks.json") for replica in replicas)
    chats = [
        ServerProcess(
            workdir / f"chat{index}",
            keys,
            event_loop="asyncio",
            broker="redis",
            redis_url=redis.url,
            jwt_jwks_url=jwks_urls,
            jwks_refresh_s=1,
            trusted_proxies="127.0.0.1",
            drain_notice_s=2,  # the default: a proxy checks /healthz here
            **NO_LIMITS,
        )
        for index in range(2)
    ]
    proxy = HAProxyProcess(
        workdir / "proxy",
        [f"127.0.0.1:{chat.port}" for chat in chats],
        [f"127.0.0.1:{replica.port}" for replica in replicas],
        cert_file=ca.cert_file,
        key_file=ca.key_file,
        ca_file=ca.ca_file,
        check_interval_ms=500,
    )
    for chat in chats:  # the page reaches the auth service on its own origin
        chat.env["AUTH_PUBLIC_URL"] = proxy.http_url()
    door = Door(proxy, chats, replicas)
    try:
        redis.start()
        for process in (*replicas, *chats, proxy):
            process.start()
        asyncio.run(wait_until(door.all_up, 30, proxy.server_states))
        yield door
    finally:
        for process in (proxy, *chats, *replicas, redis):
            process.kill()


def test_the_examples_in_deploy_are_what_their_commands_write(tmp_path: Path):
    assert [path.name for path in EXAMPLES] == ["haproxy-tls-hop.cfg", "haproxy.cfg"]
    for example in EXAMPLES:
        first = example.read_text().splitlines()[0]
        assert first.startswith("# made by: python -m chatlab.front_door "), first
        args = shlex.split(first.removeprefix("# made by: python -m chatlab.front_door "))
        assert main([*args, "--out", str(tmp_path / example.name)]) == 0
        assert (tmp_path / example.name).read_text() == example.read_text(), example.name


def test_a_backend_without_a_port_exits_2_naming_it(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as exited:
        main(["--chat", "10.0.1.1", "--auth", "10.0.2.1:8001", "--cert", "site.pem"])
    assert exited.value.code == 2
    assert "chat server '10.0.1.1': host:port expected" in capsys.readouterr().err


def test_the_defaults_log_no_query_outlast_the_pings_and_check_within_the_drain_notice():
    front = FrontDoor(("10.0.0.1:8000",), ("10.0.0.2:8001",), "/etc/haproxy/site.pem")
    text = render(front)
    log_format = next(line for line in text.splitlines() if "log-format" in line)
    assert "HPO" in log_format
    assert not re.search(r"%(\{[^}]*\})?(r|HU|HQ)\b", log_format), log_format
    chat = {spec.env: spec.default for spec in CHAT_SPECS}
    ping_s = float(chat["PING_INTERVAL_S"]) + float(chat["PING_TIMEOUT_S"])
    assert front.tunnel_timeout_s > ping_s
    assert f"timeout tunnel {front.tunnel_timeout_s}s" in text
    # one failed check takes a draining chat process out before its listener closes
    assert front.check_interval_ms / 1000 < float(chat["DRAIN_NOTICE_S"])
    assert f"inter {front.check_interval_ms}ms fall 1 " in text


def test_the_page_over_https_chats_and_catches_up_after_its_chat_process_is_killed(
    door: Door, ca: ThrowawayCA, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    if shutil.which(CHROMEDRIVER) is None or shutil.which(CHROMIUM) is None:
        pytest.skip("no chromium or chromium-driver: CI and the setup script install them")
    monkeypatch.setenv("SE_OFFLINE", "true")  # selenium may never fetch a browser
    room = f"door{uuid.uuid4().hex[:6]}"
    alice = _token(door, f"alice{room}")
    # through the front door (orjson, the chat server's default)
    asyncio.run(say_acked(door.proxy, alice, room, ["before the page"]))
    with browsers(tmp_path, "page", flags=(trusted_by_chromium(ca.cert_file),)) as (page,):
        page.open(door.proxy.http_url("/"))
        page.sign_in(f"pat{room}", register=True)
        # the auth service on the page's own https origin: the refresh token is a cookie,
        # and /refresh reaches an auth replica through the door
        cookies = [c for c in page.cookies() if c["name"] == "chatlab_refresh"]
        assert sorted(c["path"] for c in cookies) == ["/logout", "/refresh"]
        assert page.js("return session.renew().then((renewed) => renewed.ok)") is True
        page.join(room)
        page.wait(lambda: len(page.messages(room)) == 1, "history")
        assert page.messages(room)[0]["origin"] == "history"
        page.say("hello through the door")
        page.wait(lambda: len(page.messages(room)) == 2, "own message")

        # the chat process holding the page's websocket dies
        (held,) = asyncio.run(
            wait_until(
                lambda: [c for c in door.chats if c.stats()["connections"]] or None,
                20,
                "the page's websocket on one chat process",
            )
        )
        held.kill()
        page.wait(lambda: page.field("connection").text != "online", "connection lost")
        missed = [f"while away {n}" for n in range(5)]
        asyncio.run(say_acked(door.proxy, alice, room, missed))  # to the process left
        page.wait(lambda: page.field("connection").text == "online", "reconnected")
        page.wait(lambda: len(page.messages(room)) == 7, "caught up")
        shown = page.messages(room)
        assert [m["body"] for m in shown] == ["before the page", "hello through the door", *missed]
        assert [m["seq"] for m in shown] == list(range(shown[0]["seq"], shown[0]["seq"] + 7))
    held.start()
    asyncio.run(wait_until(door.all_up, 20, door.proxy.server_states))


def test_logins_keep_succeeding_while_an_auth_replica_is_killed(door: Door):
    source = "127.0.0.5"  # a client of its own, sent to one replica: that one is killed
    account = {"username": f"stopper{uuid.uuid4().hex[:6]}", "password": PASSWORD}
    assert _through(door, "/register", account, source=source)[0] == 201
    serving = _replica_of(door, source)
    serving.kill()  # SIGKILL: its port refuses at once, before a check marks it down
    for _ in range(5):
        status, body = _through(door, "/login", account, source=source)
        assert status == 200, body
    assert _through(door, "/healthz")[0] == 200
    serving.start()
    asyncio.run(wait_until(door.all_up, 20, door.proxy.server_states))


def test_a_draining_chat_process_is_taken_out_on_its_503_before_its_listener_closes(
    door: Door,
):
    draining = door.chats[1]
    name = f"chat/chat{door.chats.index(draining) + 1}"
    logged_before = len(door.proxy.log())
    draining.signal(signal.SIGTERM)
    assert draining.wait() == 0
    since = door.proxy.log()[logged_before:]
    # the proxy saw the 503 of DRAIN_NOTICE_S, not a refused connection
    assert f"{name} is DOWN, reason: Layer7 wrong status, code: 503" in since, since
    draining.start()
    asyncio.run(wait_until(door.all_up, 20, door.proxy.server_states))


def test_the_internal_paths_are_not_served_through_the_front_door(door: Door):
    for path in HIDDEN_PATHS:
        assert _through(door, path)[0] == 404, path
    assert "connections" in door.chats[0].stats()  # served on the private side
    status, jwks = _through(door, "/.well-known/jwks.json")
    assert status == 200 and jwks["keys"]


async def test_the_proxy_log_holds_no_token(door: Door):
    token = _token(door, f"logged{uuid.uuid4().hex[:6]}")
    async with connect(
        f"{door.proxy.url}?token={token}",
        ssl=door.proxy.client_ssl,
        subprotocols=[get_codec("orjson").subprotocol],
    ) as ws:
        assert json.loads(await ws.recv())["type"] == "welcome"
    assert _through(door, f"/?token={token}")[0] == 200
    await wait_until(lambda: '"/ws"' in door.proxy.log(), 10, door.proxy.log)
    log = door.proxy.log()
    assert '"/register"' in log and '"/login"' in log
    assert "token=" not in log
    assert token not in log
    assert not re.search(r"eyJ[\w-]+\.[\w-]+\.[\w-]+", log)


def _registrations_until_refused(register: Callable[[str], int]) -> list[int]:
    """The statuses of ``register(name)`` for fresh names, until one is 429 (at most three
    bursts' worth)."""
    statuses: list[int] = []
    for n in range(REGISTER_BURST * 3):
        statuses.append(register(f"user{n}{uuid.uuid4().hex[:8]}"))
        if statuses[-1] == 429:
            break
    return statuses


def test_a_forwarded_header_sent_straight_to_a_service_is_not_believed(door: Door):
    replica = door.replicas[0]

    def register(name: str, source: str, forwarded_for: str = "") -> int:
        headers = {"X-Forwarded-For": forwarded_for} if forwarded_for else {}
        account = {"username": name, "password": PASSWORD}
        status, _ = _request(
            "POST", replica.port, "/register", account, source=source, headers=headers
        )
        return status

    # each claiming another address: one address, one budget
    claims = iter(range(1000))
    statuses = _registrations_until_refused(
        lambda name: register(name, "127.0.0.4", f"10.1.2.{next(claims)}")
    )
    assert statuses[-1] == 429, statuses
    assert statuses.count(201) >= REGISTER_BURST - 1
    # another address straight to the same replica is served meanwhile
    assert register(f"honest{uuid.uuid4().hex[:6]}", "127.0.0.6") == 201


def test_two_clients_behind_the_proxy_are_limited_apart(door: Door):
    # needs TRUSTED_PROXIES in the auth service: behind the proxy (127.0.0.1) a client is
    # the right-most address the proxy did not add itself, whatever it sent before it.
    # Both clients on one replica (each keeps its own counts): else they would be apart
    # even if the replica counted the proxy's address
    busy = "127.0.0.2"
    replica = _replica_of(door, busy)
    quiet = next(
        f"127.0.0.{n}" for n in range(10, 40) if _replica_of(door, f"127.0.0.{n}") is replica
    )

    def register(name: str, source: str) -> int:
        account = {"username": name, "password": PASSWORD}
        headers = {"X-Forwarded-For": "10.9.9.9"}  # the same claim from both
        status, _ = _through(door, "/register", account, source=source, headers=headers)
        return status

    statuses = _registrations_until_refused(lambda name: register(name, busy))
    assert statuses[-1] == 429, statuses
    assert register(f"quiet{uuid.uuid4().hex[:6]}", quiet) == 201


async def test_the_tls_hop_takes_only_backends_its_ca_signed(
    tmp_path: Path, keys: KeyPair, ca: ThrowawayCA, wrong_ca: ThrowawayCA
):
    for name in ("good", "stranger", "auth", "proxy"):
        (tmp_path / name).mkdir()
    good, stranger = (
        ServerProcess(
            tmp_path / name,
            keys,
            event_loop="asyncio",
            tls_cert_file=signer.cert_file,
            tls_key_file=signer.key_file,
            ca_file=signer.ca_file,
        )
        for name, signer in (("good", ca), ("stranger", wrong_ca))
    )
    auth = AuthProcess(
        tmp_path / "auth",
        **TEST_SETTINGS,
        TLS_CERT_FILE=ca.cert_file,
        TLS_KEY_FILE=ca.key_file,
        ca_file=ca.ca_file,
    )
    proxy = HAProxyProcess(
        tmp_path / "proxy",
        [f"127.0.0.1:{good.port}", f"127.0.0.1:{stranger.port}"],
        [f"127.0.0.1:{auth.port}"],
        cert_file=ca.cert_file,
        key_file=ca.key_file,
        ca_file=ca.ca_file,
        backend_ca_file=str(ca.ca_file),
        backend_server_name="localhost",
        check_interval_ms=500,
    )
    try:
        for process in (good, stranger, auth, proxy):
            process.start()
        expected = {"chat/chat1": "UP", "chat/chat2": "DOWN", "auth/auth1": "UP"}
        await wait_until(lambda: proxy.server_states() == expected, 20, proxy.server_states)
        for _ in range(4):  # each to the one chat process the proxy trusts
            client = await Client.connect(proxy, keys.mint("hopper"), serializer="orjson")
            await client.expect(Welcome)
            await client.close()
        status, jwks = _request(
            "GET", proxy.port, "/.well-known/jwks.json", context=proxy.client_ssl
        )
        assert status == 200 and jwks["keys"]
        log = proxy.log()
        assert "chat/chat2 is DOWN" in log and "SSL handshake failure" in log
        assert "front_door~ chat/chat1 " in log and "front_door~ chat/chat2 " not in log
    finally:
        for process in (proxy, good, stranger, auth):
            process.kill()
