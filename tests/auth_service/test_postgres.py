"""Users in PostgreSQL (AUTH_DB_URL): shared by replicas, unique whatever the case under
concurrent registration, 503 while the database is down, moved over from SQLite."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import jwt
import psycopg
import pytest

from chatlab.harness import AuthProcess, free_port
from chatlab.postgres import PostgresProcess
from tests.support import wait_until
from tests.support.auth import at_once

PASSWORD = "correct horse"


DOWN_DETAIL = "the user database is down; one request at a time is trying it"


def test_replicas_share_users_and_one_keyring(
    start_replicas: Callable[..., list[AuthProcess]], auth_db_url: str
):
    a, b = start_replicas(2, auth_db_url=auth_db_url)
    assert a.register("Carol", PASSWORD).status == 201
    assert b.register("carol", PASSWORD).status == 409
    reply = b.login("CAROL", PASSWORD)
    assert reply.status == 200
    # either replica's token is signed with the one shared key, listed by both
    assert a.jwks() == b.jwks()
    assert len(a.jwks()["keys"]) == 1


def test_two_replicas_registering_one_name_at_once_give_one_201_and_one_409(
    start_replicas: Callable[..., list[AuthProcess]], auth_db_url: str
):
    a, b = start_replicas(2, auth_db_url=auth_db_url)
    for index in range(8):
        name = f"race{index}"
        replies = at_once(
            [
                lambda name=name: a.register(name, PASSWORD),
                lambda name=name: b.register(name.upper(), PASSWORD),
            ]
        )
        statuses = [r.status for r in replies]
        assert sorted(statuses) == [201, 409], (name, statuses)
    with psycopg.connect(auth_db_url) as db:
        (count,) = db.execute(
            "SELECT count(*) FROM users WHERE username_key LIKE 'race%'"
        ).fetchone()
    assert count == 8


def test_the_database_itself_refuses_a_second_case_of_a_name(auth_db_url: str, tmp_path: Path):
    # the schema is made by the service's first start
    service = AuthProcess(tmp_path, AUTH_DB_URL=auth_db_url, EVENT_LOOP="asyncio").start()
    service.stop()
    row = "INSERT INTO users VALUES (%s, %s, 'hash', 0)"
    with psycopg.connect(auth_db_url, autocommit=True) as db:
        db.execute(row, ("dave", "Dave"))
        with pytest.raises(psycopg.errors.UniqueViolation):
            db.execute(row, ("dave", "DAVE"))
        with pytest.raises(psycopg.errors.CheckViolation):  # a key that is not the name lowered
            db.execute(row, ("DAVE2", "dave2"))


def test_the_pool_holds_at_most_auth_db_pool_max_connections(
    start_auth: Callable[..., AuthProcess], auth_db_url: str
):
    auth = start_auth(
        auth_db_url=auth_db_url,
        auth_db_pool_max=2,
        hash_pool_size=2,
        # the burst of 16 logins is not what is under test
        login_rate_per_user_per_min=0,
        login_rate_per_user_client_per_min=0,
    )
    assert auth.register("pooled", PASSWORD).status == 201
    seen: list[int] = []
    done = threading.Event()

    def watch() -> None:
        with psycopg.connect(auth_db_url, autocommit=True) as db:
            while not done.is_set():
                (count,) = db.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'chatlab-auth'"
                ).fetchone()
                seen.append(count)
                time.sleep(0.01)  # a sample every 10 ms while the logins run

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        replies = at_once([lambda: auth.login("pooled", PASSWORD) for _ in range(16)])
        statuses = [r.status for r in replies]
    finally:
        done.set()
        watcher.join(10)
    assert set(statuses) <= {200, 503} and 200 in statuses
    assert seen and max(seen) <= 2


def test_a_database_down_answers_503_with_retry_after_then_recovers(
    start_auth: Callable[..., AuthProcess],
):
    postgres = PostgresProcess().start()  # its own: the test stops it
    try:
        url = postgres.create_database("auth")
        auth = start_auth(auth_db_url=url, auth_db_timeout_s=1)
        assert auth.register("erin", PASSWORD).status == 201
        postgres.stop()
        for reply in (auth.login("erin", PASSWORD), auth.register("frank", PASSWORD)):
            assert reply.status == 503, reply
            assert reply.json()["error"] == "unavailable"
            assert int(reply.headers["retry-after"]) >= 1
        # while it is down one request at a time tries it: the others are answered at
        # once (each would otherwise hold a pool slot for AUTH_DB_TIMEOUT_S)
        replies = at_once([lambda: auth.login("erin", PASSWORD) for _ in range(8)])
        details = [(r.status, r.json()["detail"]) for r in replies]
        assert all(status == 503 for status, _ in details), details
        fast = [d for _, d in details if d == DOWN_DETAIL]
        assert 1 <= len(fast) <= 7, details  # and never all: one of them is the probe
        assert "user database down" in auth.log()
        assert auth.get("/.well-known/jwks.json").status == 200  # keys stay served
        postgres.start()

        def logs_in() -> bool:
            reply = auth.login("erin", PASSWORD)
            assert reply.status in (200, 503), reply
            return reply.status == 200

        asyncio.run(wait_until(logs_in, 30, "the service using the database again", 0.2))
        assert auth.register("frank", PASSWORD).status == 201
        assert "user database back after" in auth.log()
        assert postgres.password not in auth.log()
    finally:
        postgres.remove()


def test_an_unreachable_database_url_exits_2_naming_it_without_its_password(tmp_path: Path):
    url = f"postgresql://auth:s3cret-pw@127.0.0.1:{free_port()}/auth"
    service = AuthProcess(tmp_path, AUTH_DB_URL=url, AUTH_DB_TIMEOUT_S="1")
    with pytest.raises(RuntimeError, match="exited 2") as failed:
        service.start()
    assert "AUTH_DB_URL" in str(failed.value)
    assert "s3cret-pw" not in str(failed.value)
    assert "auth:[redacted]@127.0.0.1" in str(failed.value)


def test_migrate_users_moves_sqlite_users_and_the_key_to_postgresql(
    start_auth: Callable[..., AuthProcess], tmp_path: Path, auth_db_url: str
):
    sqlite = start_auth(tmp_path)
    for name in ("Gina", "hal", "Ivy"):
        assert sqlite.register(name, PASSWORD).status == 201
    token = sqlite.token("gina", PASSWORD)
    kid = sqlite.jwks()["keys"][0]["kid"]
    assert sqlite.stop() == 0

    moving = AuthProcess(tmp_path, AUTH_DB_URL=auth_db_url)
    first = moving.run("migrate-users")
    assert first.returncode == 0, first.stderr
    assert "copied 3 of 3 users" in first.stdout
    assert urlsplit(auth_db_url).password not in first.stdout
    again = moving.run("migrate-users")
    assert again.returncode == 0 and "copied 0 of 3 users" in again.stdout
    assert "3 names were already there" in again.stdout

    postgres = start_auth(tmp_path, auth_db_url=auth_db_url)
    assert postgres.login("GINA", PASSWORD).status == 200
    assert postgres.register("ivy", PASSWORD).status == 409
    # the file's key became the keyring's first: tokens issued before the move stay good
    assert [key["kid"] for key in postgres.jwks()["keys"]] == [kid]
    assert postgres.token("hal", PASSWORD) != token


def test_rotate_key_revoke_in_the_database_replaces_every_key_on_every_replica(
    start_replicas: Callable[..., list[AuthProcess]], auth_db_url: str
):
    a, b = start_replicas(2, auth_db_url=auth_db_url)
    assert a.register("judy", PASSWORD).status == 201
    old_kid = a.jwks()["keys"][0]["kid"]
    revoked = b.run("rotate-key", "--revoke")
    assert revoked.returncode == 0, revoked.stderr
    assert urlsplit(auth_db_url).password not in revoked.stdout + revoked.stderr

    def dropped() -> bool:
        return old_kid not in {key["kid"] for r in (a, b) for key in r.jwks()["keys"]}

    asyncio.run(wait_until(dropped, 10, "every replica dropping the revoked key", 0.2))
    (new_kid,) = {key["kid"] for key in a.jwks()["keys"]}
    token = a.token("judy", PASSWORD)
    assert jwt.get_unverified_header(token)["kid"] == new_kid  # it signs at once
