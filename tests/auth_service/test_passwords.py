"""Password hashes: argon2id with the settings' parameters, upgraded at login when they change."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

import psutil
import psycopg

from chatlab.harness import AuthProcess

PASSWORD = "correct horse"


def _stored_hash(auth: AuthProcess, username: str) -> str:
    """The hash as stored: in PostgreSQL with AUTH_DB_URL, else in the SQLite file."""
    query = "SELECT password_hash FROM users WHERE username_key = {}"
    if "AUTH_DB_URL" in auth.settings:
        with psycopg.connect(auth.settings["AUTH_DB_URL"]) as db:
            row = db.execute(query.format("%s"), (username.casefold(),)).fetchone()
    else:
        with sqlite3.connect(auth.db_path) as db:
            row = db.execute(query.format("?"), (username.casefold(),)).fetchone()
    assert row is not None
    return row[0]


def test_hashes_use_the_settings_parameters_and_are_upgraded_at_login(
    start_auth: Callable[..., AuthProcess], store_env: dict[str, str]
):
    auth = start_auth(argon2_time_cost=1, **store_env)
    assert auth.register("Rehash_Me", PASSWORD).status == 201
    first = _stored_hash(auth, "Rehash_Me")
    assert first.startswith("$argon2id$v=19$m=8192,t=1,p=1$")
    assert auth.stop() == 0

    auth = start_auth(argon2_time_cost=2, **store_env)
    assert auth.login("rehash_me", "wrong password").status == 401
    assert _stored_hash(auth, "Rehash_Me") == first  # only a good login upgrades
    assert auth.login("rehash_me", PASSWORD).status == 200
    upgraded = _stored_hash(auth, "Rehash_Me")
    assert upgraded.startswith("$argon2id$v=19$m=8192,t=2,p=1$")
    assert auth.login("rehash_me", PASSWORD).status == 200
    assert _stored_hash(auth, "Rehash_Me") == upgraded  # once is enough
    assert "upgraded to the current argon2 parameters" in auth.log()


def test_hashing_workers_end_with_the_service_even_after_sigkill(
    start_auth: Callable[..., AuthProcess],
):
    auth = start_auth(hash_pool_size=2)
    assert auth.proc is not None
    workers = [
        child
        for child in psutil.Process(auth.proc.pid).children()
        if "spawn_main" in " ".join(child.cmdline())
    ]
    assert len(workers) == 2
    auth.kill()
    _, alive = psutil.wait_procs(workers, timeout=15)
    assert not alive
