"""Signing keys on disk: created 0600, reused, refused when loose, rotated without a gap."""

from __future__ import annotations

import asyncio
import json
import signal
import stat
from collections.abc import Callable
from pathlib import Path

import jwt
import pytest

from chatlab.harness import AUDIENCE, AuthProcess
from tests.support import wait_until

PASSWORD = "correct horse"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _kid(token: str) -> str:
    return jwt.get_unverified_header(token)["kid"]


def _verify_through_jwks(auth: AuthProcess, token: str) -> dict:
    """Verify as a JWKS client does: fetch the set, pick the key by the token's kid."""
    client = jwt.PyJWKClient(auth.url("/.well-known/jwks.json"), cache_jwk_set=False)
    key = client.get_signing_key_from_jwt(token)
    return jwt.decode(token, key.key, algorithms=["EdDSA"], audience=AUDIENCE)


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_keys_are_created_0600_and_reused_across_restarts(
    start_auth: Callable[..., AuthProcess], stop_signal: int
):
    auth = start_auth()
    assert _mode(auth.private_path) == 0o600
    private_pem, public_pem = auth.private_path.read_bytes(), auth.public_path.read_bytes()
    assert b"PRIVATE KEY" in private_pem and b"PUBLIC KEY" in public_pem
    assert auth.register("keeper", PASSWORD).status == 201
    token = auth.token("keeper", PASSWORD)
    auth.signal(stop_signal)
    assert auth.wait() == 0
    assert "PRIVATE KEY" not in auth.log()  # key material is never logged

    auth = start_auth()
    assert auth.private_path.read_bytes() == private_pem
    assert auth.public_path.read_bytes() == public_pem
    assert [key["kid"] for key in auth.jwks()["keys"]] == [_kid(token)]
    assert _kid(auth.token("keeper", PASSWORD)) == _kid(token)
    jwt.decode(token, public_pem, algorithms=["EdDSA"], audience=AUDIENCE)
    assert auth.stop() == 0


def test_a_private_key_with_a_looser_mode_stops_the_service(
    start_auth: Callable[..., AuthProcess],
):
    auth = start_auth()
    assert auth.stop() == 0
    auth.private_path.chmod(0o644)
    result = auth.run()
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "JWT_PRIVATE_KEY" in lines[0] and "0644" in lines[0] and "0600" in lines[0]


def test_rotate_key_signs_with_a_new_key_and_keeps_serving_the_old_one(
    start_auth: Callable[..., AuthProcess],
):
    auth = start_auth()
    assert auth.register("rotator", PASSWORD).status == 201
    old_token = auth.token("rotator", PASSWORD)
    old_kid = _kid(old_token)
    old_public = auth.public_path.read_bytes()

    result = auth.run("rotate-key")
    assert result.returncode == 0, result.stderr
    assert f"JWT_JWKS_URL=http://127.0.0.1:{auth.port}/.well-known/jwks.json" in result.stdout
    assert _mode(auth.private_path) == 0o600
    assert auth.public_path.read_bytes() != old_public
    keyring = json.loads(auth.keyring_path.read_text())["keys"]
    retired = {entry["kid"]: entry["retired_at"] for entry in keyring}
    assert retired[old_kid] is not None
    (new_kid,) = [kid for kid, at in retired.items() if at is None]

    # the running service takes up the new key (it looks at most once a second)
    def signed_anew() -> str | None:
        token = auth.token("rotator", PASSWORD)
        return token if _kid(token) != old_kid else None

    new_token = asyncio.run(wait_until(signed_anew, 10, "a token signed with the new key", 0.2))
    assert _kid(new_token) == new_kid
    assert {key["kid"] for key in auth.jwks()["keys"]} == {old_kid, new_kid}
    assert _verify_through_jwks(auth, old_token)["sub"] == "rotator"
    assert _verify_through_jwks(auth, new_token)["sub"] == "rotator"
    # JWT_PUBLIC_KEY now holds the new key only
    jwt.decode(new_token, auth.public_path.read_bytes(), algorithms=["EdDSA"], audience=AUDIENCE)
    with pytest.raises(jwt.InvalidSignatureError):
        jwt.decode(
            old_token, auth.public_path.read_bytes(), algorithms=["EdDSA"], audience=AUDIENCE
        )

    # a restart keeps the new key and still serves the old public key
    assert auth.stop() == 0
    auth = start_auth()
    assert _kid(auth.token("rotator", PASSWORD)) == new_kid
    assert {key["kid"] for key in auth.jwks()["keys"]} == {old_kid, new_kid}


def test_retired_keys_leave_the_jwk_set_once_their_tokens_expired(
    start_auth: Callable[..., AuthProcess],
):
    auth = start_auth(token_ttl_s=1)
    first_kid = auth.jwks()["keys"][0]["kid"]
    # pretend the first key was retired long ago: the next rotation prunes it
    assert auth.run("rotate-key").returncode == 0
    keyring = json.loads(auth.keyring_path.read_text())
    for entry in keyring["keys"]:
        if entry["kid"] == first_kid:
            entry["retired_at"] -= 3600
    auth.keyring_path.write_text(json.dumps(keyring))
    assert auth.run("rotate-key").returncode == 0
    kids = [entry["kid"] for entry in json.loads(auth.keyring_path.read_text())["keys"]]
    assert first_kid not in kids and len(kids) == 2
    assert not (auth.keyring_path.parent / f"jwt_public.{first_kid}.pem").exists()


def test_rotate_key_revoke_drops_every_older_key_at_once(start_auth: Callable[..., AuthProcess]):
    auth = start_auth()
    old_kid = auth.jwks()["keys"][0]["kid"]
    revoked = auth.run("rotate-key", "--revoke")
    assert revoked.returncode == 0, revoked.stderr
    assert "revoked" in revoked.stdout

    def served() -> list[str]:  # the running service looks at its keyring once a second
        return [key["kid"] for key in auth.jwks()["keys"]]

    asyncio.run(wait_until(lambda: old_kid not in served(), 10, "the revoked key dropped", 0.2))
    kids = served()
    assert len(kids) == 1 and old_kid not in kids
