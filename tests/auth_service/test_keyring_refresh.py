"""A replica's re-read of the shared keyring (PostgreSQL) survives what the database answers:
an error that is not an outage, a row that is not a key; it follows a revocation after."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import jwt
import psycopg

from chatlab.harness import AuthProcess
from tests.support import wait_until

PASSWORD = "correct horse"


async def test_a_keyring_refresh_that_meets_a_database_error_recovers(
    start_auth: Callable[..., AuthProcess], auth_db_url: str
):
    replica = start_auth(AUTH_DB_URL=auth_db_url)
    username = f"user_{uuid.uuid4().hex[:10]}"
    assert replica.register(username, PASSWORD).status == 201

    def signing_kid() -> str:
        return str(jwt.get_unverified_header(replica.token(username, PASSWORD))["kid"])

    old_kid = signing_kid()
    with psycopg.connect(auth_db_url, autocommit=True) as conn:
        # a statement the database refuses (ProgrammingError: no such table), not an outage
        conn.execute("ALTER TABLE signing_keys RENAME TO signing_keys_away")
        await wait_until(lambda: "keyring not re-read" in replica.log(), 15, "the error logged")
        assert signing_kid() == old_kid  # the keys held still sign
        conn.execute("ALTER TABLE signing_keys_away RENAME TO signing_keys")
        # a row whose PEM does not load is left out; the others still count
        conn.execute(
            "INSERT INTO signing_keys (kid, private_pem, created_at, active_at)"
            " VALUES ('broken', 'not a PEM', 0, 0)"
        )
        await wait_until(lambda: "key broken left out" in replica.log(), 15, "the bad row left out")
    revoked = replica.run("rotate-key", "--revoke")
    assert revoked.returncode == 0, revoked.stderr
    # the refresh still runs: the replica signs with the new key, never the revoked one again
    await wait_until(lambda: signing_kid() != old_kid, 15, "the new key signs")
    assert old_kid not in {key["kid"] for key in replica.jwks()["keys"]}
