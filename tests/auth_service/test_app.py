"""The HTTP API against a real auth service: bodies, status codes and tokens."""

from __future__ import annotations

import http.client
from collections.abc import Iterator

import jwt
import pytest

from chat_server.settings import Settings as ChatSettings
from chatlab.harness import AUDIENCE, ISSUER, AuthProcess

PASSWORD = "correct horse"


def _assert_error(reply, status: int, code: str) -> dict:
    assert reply.status == status, reply
    assert reply.headers["content-type"] == "application/json"
    body = reply.json()
    assert set(body) == {"error", "detail"}, body
    assert body["error"] == code
    assert isinstance(body["detail"], str) and body["detail"]
    return body


def test_register_answers_201_with_the_username(shared_auth: AuthProcess, username: str):
    reply = shared_auth.register(username, PASSWORD)
    assert reply.status == 201
    assert reply.json() == {"username": username}


def test_username_is_taken_whatever_its_case(shared_auth: AuthProcess, username: str):
    assert shared_auth.register(username, PASSWORD).status == 201
    _assert_error(shared_auth.register(username, PASSWORD), 409, "username_taken")
    _assert_error(shared_auth.register(username.upper(), "another password"), 409, "username_taken")


@pytest.mark.parametrize(
    ("name", "password"),
    [
        ("ab", PASSWORD),  # username too short
        ("a" * 33, PASSWORD),  # too long
        ("with space", PASSWORD),
        ("slash/name", PASSWORD),
        ("émile", PASSWORD),  # not ASCII
        ("newline\n", PASSWORD),
        ("", PASSWORD),
        ("fine_name", "seven77"),  # password too short
        ("fine_name", "x" * 257),  # too long
    ],
)
def test_username_and_password_rules_give_400(shared_auth: AuthProcess, name: str, password: str):
    _assert_error(shared_auth.register(name, password), 400, "bad_request")


def test_the_rules_bounds_are_allowed(shared_auth: AuthProcess, username: str):
    assert shared_auth.register(username[:3] + "._-", "x" * 8).status == 201
    assert shared_auth.register("Z" * 32, "y" * 256).status in (201, 409)


MALFORMED = {
    "not json": b"username=alice",
    "array": b'["alice", "password"]',
    "number username": b'{"username": 12345, "password": "password1"}',
    "null password": b'{"username": "alice", "password": null}',
    "missing password": b'{"username": "alice"}',
    "empty": b"",
    "bad utf-8": b'{"username": "\xff\xfe", "password": "password1"}',
    "lone surrogate": b'{"username": "alice", "password": "\\ud800abcdefgh"}',
}


@pytest.mark.parametrize("path", ["/register", "/login"])
@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_body_is_400(shared_auth: AuthProcess, path: str, case: str):
    _assert_error(shared_auth.post(path, body=MALFORMED[case]), 400, "bad_request")


@pytest.mark.parametrize("path", ["/register", "/login"])
def test_body_over_4_kib_is_413(shared_auth: AuthProcess, path: str):
    body = b'{"username": "alice", "password": "' + b"p" * 4096 + b'"}'
    _assert_error(shared_auth.post(path, body=body), 413, "too_large")
    # exactly 4 KiB is read (and then refused for the password's length)
    prefix, suffix = b'{"username": "alice", "password": "', b'"}'
    body = prefix + b"p" * (4096 - len(prefix) - len(suffix)) + suffix
    assert len(body) == 4096
    expected = (400, "bad_request") if path == "/register" else (401, "invalid_credentials")
    _assert_error(shared_auth.post(path, body=body), *expected)


def test_chunked_body_over_4_kib_is_413(shared_auth: AuthProcess):
    def chunks() -> Iterator[bytes]:
        yield b'{"username": "alice", "password": "'
        for _ in range(10):
            yield b"p" * 1000
        yield b'"}'

    conn = http.client.HTTPConnection("127.0.0.1", shared_auth.port, timeout=10)
    try:
        conn.request("POST", "/register", body=chunks(), encode_chunked=True)
        response = conn.getresponse()
        assert response.status == 413
        assert b'"too_large"' in response.read()
    finally:
        conn.close()


def test_login_returns_a_bearer_token_that_verifies(shared_auth: AuthProcess, username: str):
    assert shared_auth.register(username, PASSWORD).status == 201
    reply = shared_auth.login(username, PASSWORD)
    assert reply.status == 200
    body = reply.json()
    assert body["token_type"] == "Bearer"
    assert body["expires_in"] == 600
    token = body["access_token"]

    header = jwt.get_unverified_header(token)
    assert header["alg"] == "EdDSA"
    (jwk,) = shared_auth.jwks()["keys"]
    assert header["kid"] == jwk["kid"]

    # with the PEM the chat server reads
    public_key = shared_auth.public_path.read_bytes()
    claims = jwt.decode(token, public_key, algorithms=["EdDSA"], issuer=ISSUER, audience=AUDIENCE)
    assert set(claims) == {"sub", "iss", "aud", "iat", "exp", "jti"}
    assert claims["sub"] == username
    assert claims["exp"] - claims["iat"] == 600
    # and with the JWK set, picked by kid
    key = jwt.PyJWK(jwk).key
    assert jwt.decode(token, key, algorithms=["EdDSA"], audience=AUDIENCE) == claims
    # every login is a new token
    other = jwt.decode(
        shared_auth.token(username, PASSWORD), public_key, algorithms=["EdDSA"], audience=AUDIENCE
    )
    assert other["jti"] != claims["jti"]


def test_the_chat_servers_defaults_match_the_tokens(shared_auth: AuthProcess):
    chat = ChatSettings.from_mapping({})
    assert (chat.jwt_issuer, chat.jwt_audience, chat.jwt_algorithm) == (ISSUER, AUDIENCE, "EdDSA")


def test_login_ignores_case_and_sub_is_the_registered_name(shared_auth: AuthProcess, username: str):
    registered = username.capitalize()
    assert shared_auth.register(registered, PASSWORD).status == 201
    token = shared_auth.token(username.upper(), PASSWORD)
    assert jwt.decode(token, options={"verify_signature": False})["sub"] == registered


def test_wrong_password_and_unknown_user_get_the_same_401(shared_auth: AuthProcess, username: str):
    assert shared_auth.register(username, PASSWORD).status == 201
    wrong = shared_auth.login(username, "not the password")
    unknown = shared_auth.login(username + "x", PASSWORD)
    _assert_error(wrong, 401, "invalid_credentials")
    assert wrong.body == unknown.body
    assert wrong.status == unknown.status
    # a name that cannot exist is answered the same
    assert shared_auth.login("x", PASSWORD).body == wrong.body


def test_jwks_keys_carry_kid_alg_and_use(shared_auth: AuthProcess):
    reply = shared_auth.get("/.well-known/jwks.json")
    assert reply.status == 200
    (key,) = reply.json()["keys"]
    assert key["kty"] == "OKP" and key["crv"] == "Ed25519"
    assert key["alg"] == "EdDSA" and key["use"] == "sig"
    assert len(key["kid"]) == 11 and key["x"]
    assert "d" not in key  # never the private part


def test_healthz_is_200(shared_auth: AuthProcess):
    assert shared_auth.get("/healthz").status == 200


def test_unknown_path_and_wrong_method_are_json_errors(shared_auth: AuthProcess):
    _assert_error(shared_auth.get("/nowhere"), 404, "not_found")
    reply = shared_auth.get("/login")
    _assert_error(reply, 405, "method_not_allowed")
    assert reply.headers["allow"] == "POST"
    _assert_error(shared_auth.post("/healthz", {}), 405, "method_not_allowed")
