"""Token claims held to the contract once a token verifies, and tokens kept out of logs
(plain values, no server)."""

from __future__ import annotations

import io
import logging
import time

import pytest

from chat_server.auth import InvalidToken, TokenVerifier, load_verifier
from chat_server.settings import Settings
from chatlab.keys import key_id
from chatlab.log_redaction import RedactTokens, redact
from tests.support import AUDIENCE, ISSUER, KeyPair


@pytest.fixture
def verifier(keys: KeyPair) -> TokenVerifier:
    public_key = keys.private_key.public_key()
    return TokenVerifier(public_key, "EdDSA", ISSUER, AUDIENCE, kid=key_id(public_key))


def test_a_well_formed_token_gives_its_user(verifier: TokenVerifier, keys: KeyPair):
    assert verifier.verify(keys.mint("alice.b-2_x")) == "alice.b-2_x"


@pytest.mark.parametrize(
    "claims",
    [
        {"exp": "9999999999"},
        {"iat": "1"},
        {"nbf": "1"},
        {"exp": True},
        {"sub": "ali\nce <script>"},
        {"sub": "al"},
        {"sub": "x" * 33},
        {"sub": 42},
    ],
    ids=repr,
)
def test_loose_claims_are_refused(verifier: TokenVerifier, keys: KeyPair, claims: dict):
    sub = claims.pop("sub", "alice")
    with pytest.raises(InvalidToken):
        verifier.verify(keys.mint(sub, **claims))


def test_kid_must_name_the_configured_key(verifier: TokenVerifier, keys: KeyPair):
    import jwt

    token = keys.mint("alice")
    assert jwt.get_unverified_header(token)["kid"] == keys.kid
    claims = jwt.decode(token, options={"verify_signature": False})
    other_kid = jwt.encode(claims, keys.private_key, algorithm="EdDSA", headers={"kid": "other"})
    with pytest.raises(InvalidToken, match="kid"):
        verifier.verify(other_kid)
    no_kid = jwt.encode(claims, keys.private_key, algorithm="EdDSA")
    assert verifier.verify(no_kid) == "alice"


def test_redaction_leaves_no_usable_token(keys: KeyPair):
    token = keys.mint("alice")
    lines = [
        f"< GET /ws?token={token} HTTP/1.1",
        f"< Authorization: Bearer {token}",
        f"/ws?room=x&token={token}&y=1",
        f"bad token {token[:40]}",
    ]
    for line in lines:
        redacted = redact(line)
        assert token not in redacted and token[:40] not in redacted
        assert "[redacted]" in redacted
    assert redact("GET /healthz HTTP/1.1") == "GET /healthz HTTP/1.1"


def test_redaction_keeps_a_challenges_parameters_and_takes_credentials():
    challenges = [
        'WWW-Authenticate: Bearer realm="chatlab"',
        'WWW-Authenticate: Bearer realm="chatlab", error="invalid_token"',
        "WWW-Authenticate: Bearer error=invalid_token",
        'WWW-Authenticate: Basic realm="chatlab"',
    ]
    for line in challenges:
        assert redact(line) == line
    credentials = {  # RFC 7235's token68: "=" only at the end
        "Authorization: Bearer abc.def-ghi==": "Authorization: Bearer [redacted]",
        "Authorization: Bearer opaque-token_1~/+": "Authorization: Bearer [redacted]",
        "Authorization: Basic dXNlcjpwYXNz": "Authorization: Basic [redacted]",
    }
    for line, redacted in credentials.items():
        assert redact(line) == redacted


def test_redaction_filter_covers_args_and_exceptions(keys: KeyPair):
    token = keys.mint("alice")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactTokens())
    logger = logging.getLogger("tests.redaction")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("< %s %s", "GET", f"/ws?token={token}")
        try:
            raise ValueError(f"Authorization: Bearer {token}")
        except ValueError:
            logger.exception("handshake failed")
    finally:
        logger.removeHandler(handler)
    text = stream.getvalue()
    assert "GET /ws?token=[redacted]" in text and "ValueError" in text
    assert token.split(".")[1] not in text


# ---- clock skew: JWT_LEEWAY_S --------------------------------------------------------------


def _verifier_from(keys: KeyPair, **settings: str) -> TokenVerifier:
    """The verifier ``python -m chat_server`` builds from these settings (and the key file)."""
    return load_verifier(
        Settings.from_mapping({"JWT_PUBLIC_KEY": str(keys.public_path), **settings})
    )


@pytest.mark.parametrize(
    "claims",
    [
        {"iat": 2},  # an auth host two seconds ahead: a fresh token
        {"nbf": 2},
        {"exp": -2},  # an auth host two seconds behind: a token just past its exp here
    ],
    ids=repr,
)
def test_clock_skew_within_the_leeway_is_taken(keys: KeyPair, claims: dict[str, int]):
    now = int(time.time())
    token = keys.mint("alice", **{name: now + offset for name, offset in claims.items()})
    assert _verifier_from(keys).verify(token) == "alice"  # JWT_LEEWAY_S defaults to 5
    with pytest.raises(InvalidToken):
        _verifier_from(keys, JWT_LEEWAY_S="0").verify(token)


@pytest.mark.parametrize("claims", [{"iat": 30}, {"nbf": 30}, {"exp": -30}], ids=repr)
def test_clock_skew_past_the_leeway_is_refused(keys: KeyPair, claims: dict[str, int]):
    now = int(time.time())
    token = keys.mint("alice", **{name: now + offset for name, offset in claims.items()})
    with pytest.raises(InvalidToken):
        _verifier_from(keys).verify(token)
