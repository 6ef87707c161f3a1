"""Rate limits (429) and hashing saturation (503), each with Retry-After."""

from __future__ import annotations

import http.client
import json
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from threading import Barrier, Event

from chatlab.harness import AuthProcess, HttpReply

PASSWORD = "correct horse"
#: the owner's address in the attack below (the attacker's is 127.0.0.2)
OWNER = "127.0.0.1"


def _assert_retry_later(reply: HttpReply, status: int, code: str) -> int:
    assert reply.status == status, reply
    assert reply.json()["error"] == code
    retry_after = reply.headers["retry-after"]
    assert retry_after.isdigit() and int(retry_after) >= 1
    return int(retry_after)


def test_failed_logins_per_username_are_limited(start_auth: Callable[..., AuthProcess]):
    auth = start_auth(login_rate_per_user_per_min=1, login_burst_per_user=2)
    assert auth.register("mallory_target", PASSWORD).status == 201
    assert [auth.login("mallory_target", f"guess {i}!").status for i in range(2)] == [401, 401]
    # the username is locked for about a minute, whatever the case and the password
    assert _assert_retry_later(auth.login("Mallory_Target", "guess 3!"), 429, "rate_limited") >= 1
    assert auth.login("mallory_target", PASSWORD).status == 429
    # other usernames are not affected, successful logins do not count
    assert auth.register("bystander", PASSWORD).status == 201
    assert [auth.login("bystander", PASSWORD).status for _ in range(4)] == [200] * 4
    # unknown usernames are limited the same way
    assert [auth.login("nobody_here", PASSWORD).status for _ in range(3)] == [401, 401, 429]


def test_logins_and_registrations_per_client_are_limited(start_auth: Callable[..., AuthProcess]):
    auth = start_auth(
        login_rate_per_client_per_min=1,
        login_burst_per_client=3,
        register_rate_per_client_per_min=1,
        register_burst_per_client=2,
    )
    assert [auth.register(f"client_{i}", PASSWORD).status for i in range(2)] == [201, 201]
    _assert_retry_later(auth.register("client_2", PASSWORD), 429, "rate_limited")
    assert [auth.login(f"client_{i % 2}", PASSWORD).status for i in range(3)] == [200] * 3
    retry_after = _assert_retry_later(auth.login("client_0", PASSWORD), 429, "rate_limited")
    assert retry_after <= 60


def test_saturated_hashing_answers_503_with_retry_after(start_auth: Callable[..., AuthProcess]):
    # hashes of ~0.25 s so that concurrent logins overlap
    auth = start_auth(
        hash_pool_size=1,
        hash_queue_max=1,
        argon2_time_cost=2,
        argon2_memory_cost_kib=65536,
        login_rate_per_user_per_min=0,
        login_rate_per_user_client_per_min=0,
    )
    assert auth.register("busy_user", PASSWORD).status == 201
    start = Barrier(8)

    def login(_: int) -> HttpReply:
        start.wait()
        return auth.login("busy_user", PASSWORD)

    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(login, range(8)))
    statuses = sorted(reply.status for reply in replies)
    assert 200 in statuses and 503 in statuses, statuses
    assert set(statuses) == {200, 503}, statuses
    for reply in replies:
        if reply.status == 503:
            _assert_retry_later(reply, 503, "unavailable")
    # once the burst is over, the service answers again
    assert auth.login("busy_user", PASSWORD).status == 200


def _login_from(auth: AuthProcess, address: str, username: str, password: str) -> int:
    """POST /login from the local ``address`` (127.0.0.0/8: one client address each)."""
    conn = http.client.HTTPConnection(
        "127.0.0.1", auth.port, timeout=30, source_address=(address, 0)
    )
    try:
        body = json.dumps({"username": username, "password": password})
        conn.request("POST", "/login", body, {"Content-Type": "application/json"})
        return conn.getresponse().status
    finally:
        conn.close()


def test_an_attacker_guessing_cannot_lock_the_owner_out(start_auth: Callable[..., AuthProcess]):
    # the default limits: 5 failed logins at once, then 10 a minute, per username and per
    # (username, address)
    auth = start_auth()
    assert auth.register("owner_alice", PASSWORD).status == 201
    assert _login_from(auth, OWNER, "owner_alice", PASSWORD) == 200  # her usual address
    attacker: Counter[int] = Counter()
    stop = Event()

    def guess() -> None:  # a wrong password every 0.1 s from another address
        guesses = 0
        while not stop.is_set():
            attacker[_login_from(auth, "127.0.0.2", "owner_alice", f"guess {guesses}!")] += 1
            guesses += 1
            stop.wait(0.1)

    with ThreadPoolExecutor(1) as pool:
        guessing = pool.submit(guess)
        owner = []
        for _ in range(10):  # the owner logs in every second meanwhile: every login works
            owner.append(_login_from(auth, OWNER, "owner_alice", PASSWORD))
            time.sleep(1)
        # an address the name never logged in from meets the per-username ceiling
        elsewhere = _login_from(auth, "127.0.0.3", "owner_alice", PASSWORD)
        stop.set()
        guessing.result()
    assert owner == [200] * 10
    assert elsewhere == 429
    # the attacker was slowed: its burst and what refilled in ~12 s were hashed, no more
    assert 5 <= attacker[401] <= 8, attacker
    assert attacker[429] >= 20, attacker
    assert set(attacker) == {401, 429}, attacker


def _register_from(
    auth: AuthProcess, address: str, username: str, forwarded_for: str | None = None
) -> int:
    """POST /register from the local ``address``, with ``X-Forwarded-For`` when given."""
    conn = http.client.HTTPConnection(
        "127.0.0.1", auth.port, timeout=30, source_address=(address, 0)
    )
    headers = {"Content-Type": "application/json"}
    if forwarded_for is not None:
        headers["X-Forwarded-For"] = forwarded_for
    try:
        body = json.dumps({"username": username, "password": PASSWORD})
        conn.request("POST", "/register", body, headers)
        return conn.getresponse().status
    finally:
        conn.close()


def test_clients_behind_a_trusted_proxy_are_limited_apart_and_a_forged_header_is_not_believed(
    start_auth: Callable[..., AuthProcess],
):
    # 127.0.0.1 is the proxy; one registration per client address at once
    auth = start_auth(
        trusted_proxies="127.0.0.1",
        register_rate_per_client_per_min=1,
        register_burst_per_client=1,
    )
    office, home = "203.0.113.7", "198.51.100.9"
    assert _register_from(auth, OWNER, "office_one", office) == 201
    assert _register_from(auth, OWNER, "office_two", office) == 429
    assert _register_from(auth, OWNER, "office_three", f"{office}, 127.0.0.1") == 429  # a chain
    assert _register_from(auth, OWNER, "home_one", home) == 201  # limited apart
    assert _register_from(auth, OWNER, "proxy_itself") == 201  # no header: the proxy's own
    # a peer that is no listed proxy is counted as itself, whatever it claims
    assert _register_from(auth, "127.0.0.2", "direct_one", "192.0.2.50") == 201
    assert _register_from(auth, "127.0.0.2", "direct_two", "192.0.2.51") == 429
