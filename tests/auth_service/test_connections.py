"""What a slow client can hold of the auth service: a header, a body and an idle connection
each have a deadline (408, or closed), connections a bound (503), and honest clients are
served meanwhile, also under a low open-files limit."""

from __future__ import annotations

import asyncio
import json
import resource
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from chatlab.harness import AuthProcess
from tests.support import wait_until
from tests.support.auth import TEST_SETTINGS

PASSWORD = "correct horse"
#: the shape of the attack: more slow sockets than the service may open files (the
#: report that found it: 2,000 sockets under a limit of 1,024)
SLOW_SOCKETS = 2000
OPEN_FILES = 1024


class LimitedAuthProcess(AuthProcess):
    """The auth service under an open-files limit of :data:`OPEN_FILES` (soft and hard)."""

    def command(self) -> list[str]:
        return ["prlimit", f"--nofile={OPEN_FILES}", *super().command()]


def _answer(sock: socket.socket, deadline: float | None = None) -> tuple[int | None, bytes]:
    """Read until the server closes (by ``deadline``, a monotonic time; default 30 s from
    now): the status of its answer, None when closed without one, -1 when still open."""
    deadline = time.monotonic() + 30 if deadline is None else deadline
    sock.settimeout(max(0.1, deadline - time.monotonic()))
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        return -1, data  # still open: the server holds it
    except ConnectionResetError:
        pass
    finally:
        sock.close()
    if not data.startswith(b"HTTP/1.1 "):
        return None, data
    return int(data.split()[1]), data


def _login_retrying(auth: AuthProcess, username: str, deadline_s: float = 30) -> int:
    """Log in, waiting out 503's Retry-After (as the load test and the page do)."""
    deadline = time.monotonic() + deadline_s
    while True:
        reply = auth.login(username, PASSWORD)
        if reply.status != 503 or time.monotonic() > deadline:
            return reply.status
        time.sleep(int(reply.headers.get("retry-after", "1")))  # as the answer asks


@pytest.fixture
def many_files() -> Iterator[None]:
    """This process may open the slow sockets (the service under test may not)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = SLOW_SOCKETS + 512
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"the hard open-files limit {hard} is below {wanted}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_slow_sockets_under_a_low_open_files_limit_leave_logins_served(
    tmp_path: Path, many_files: None
):
    auth = LimitedAuthProcess(
        tmp_path,
        **TEST_SETTINGS,
        AUTH_HEADER_TIMEOUT_S="2",
        AUTH_BODY_TIMEOUT_S="2",
        AUTH_IDLE_TIMEOUT_S="2",
    ).start()
    slow: list[socket.socket] = []
    try:
        assert auth.register("honest_user", PASSWORD).status == 201
        for _ in range(SLOW_SOCKETS):  # each sends part of a header, then nothing
            sock = socket.create_connection(("127.0.0.1", auth.port), timeout=10)
            sock.sendall(b"POST /login HTTP/1.1\r\nHost: auth\r\nContent-Ty")
            slow.append(sock)
        logins = [_login_retrying(auth, "honest_user") for _ in range(10)]
        deadline = time.monotonic() + 30
        answers = [_answer(sock, deadline) for sock in slow]
    finally:
        for sock in slow:
            sock.close()
        auth.stop()
    assert logins == [200] * 10
    statuses = Counter(status for status, _ in answers)
    # every slow socket was answered and closed: past the bound at once (503), else when
    # its header was late (408)
    assert set(statuses) == {408, 503}, statuses
    busy = next(data for status, data in answers if status == 503)
    assert b"retry-after: 1" in busy.lower()
    assert json.loads(busy.split(b"\r\n\r\n", 1)[1])["error"] == "unavailable"
    late = next(data for status, data in answers if status == 408)
    assert json.loads(late.split(b"\r\n\r\n", 1)[1])["error"] == "request_timeout"
    log = auth.log()
    assert "AUTH_MAX_CONNECTIONS=1000 cut to" in log  # the open-files limit ruled
    assert "reached: " in log  # the bound, said once per episode


@pytest.fixture
def quick_auth(start_auth: Callable[..., AuthProcess]) -> AuthProcess:
    return start_auth(
        auth_header_timeout_s=1,
        auth_body_timeout_s=1,
        auth_idle_timeout_s=1,
        auth_max_connections=3,
    )


def test_a_trickled_header_gets_408_however_often_bytes_come(quick_auth: AuthProcess):
    sock = socket.create_connection(("127.0.0.1", quick_auth.port), timeout=10)
    trickle = b"POST /login HTTP/1.1\r\nHost: auth\r\nUser-Agent: " + b"x" * 40
    sent = 0
    try:
        for byte in trickle:  # a byte every 0.1 s, 7 s in all: the deadline is 1 s
            sock.sendall(bytes([byte]))
            sent += 1
            assert quick_auth.get("/healthz").status == 200  # others are served meanwhile
            time.sleep(0.1)
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert sent < len(trickle)  # cut off mid-trickle: the bytes did not move the deadline
    status, _ = _answer(sock)
    assert status in (408, None)  # the 408, unless the reset beat it to the reader


def test_a_slow_body_gets_408(quick_auth: AuthProcess):
    sock = socket.create_connection(("127.0.0.1", quick_auth.port), timeout=10)
    sock.sendall(
        b"POST /login HTTP/1.1\r\nHost: auth\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n" + b'{"username": '
    )
    status, data = _answer(sock)
    assert status == 408, data
    assert b"body" in data
    assert quick_auth.get("/healthz").status == 200


def test_an_idle_kept_alive_connection_is_closed(quick_auth: AuthProcess):
    sock = socket.create_connection(("127.0.0.1", quick_auth.port), timeout=10)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: auth\r\n\r\n")
    status, data = _answer(sock)  # the answer, then the close AUTH_IDLE_TIMEOUT_S later
    assert status == 200, data


def test_past_the_connection_bound_503_and_a_warning(quick_auth: AuthProcess):
    held = [socket.create_connection(("127.0.0.1", quick_auth.port), timeout=10) for _ in range(3)]
    try:
        extra = socket.create_connection(("127.0.0.1", quick_auth.port), timeout=10)
        status, data = _answer(extra)
        assert status == 503, data
    finally:
        for sock in held:
            sock.close()
    # slots free as the held ones close
    asyncio.run(wait_until(lambda: quick_auth.get("/healthz").status == 200, 10, "a free slot"))
    assert "AUTH_MAX_CONNECTIONS=3 reached" in quick_auth.log()
