"""Admission: each HTTP request on the websocket port, decided without a socket as both
transports decide it (the transports' own tests cross real sockets)."""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

import pytest

from chat_server.auth import TokenVerifier
from chat_server.codecs import get_codec
from chat_server.settings import Settings
from chat_server.transport.base import Admission, Admitted, OutboundStats, Reply
from tests.support import AUDIENCE, ISSUER, KeyPair


class FakeService:
    """What Admission reads of the service."""

    def __init__(self) -> None:
        self.draining = False
        self.connections = 0

    def stats(self) -> dict[str, Any]:
        return {"connections": self.connections}


@pytest.fixture
def service() -> FakeService:
    return FakeService()


@pytest.fixture
def admission(keys: KeyPair, service: FakeService) -> Admission:
    """JSON codec, at most two connections, tokens from the test key pair."""
    settings = Settings.from_mapping({"MAX_CONNECTIONS": "2", "EXPOSE_INTERNALS": "on"})
    verifier = TokenVerifier(keys.private_key.public_key(), "EdDSA", ISSUER, AUDIENCE)
    return Admission(settings, service, verifier, get_codec("orjson"), OutboundStats())  # type: ignore[arg-type]


def _status(decision: Reply | Admitted) -> HTTPStatus:
    assert isinstance(decision, Reply), decision
    return decision.status


def test_healthz_stats_and_other_paths(admission: Admission):
    assert _status(admission.decide("/healthz", None, [])) == HTTPStatus.OK
    stats = admission.decide("/stats", None, [])
    assert isinstance(stats, Reply) and stats.content_type == "application/json"
    assert json.loads(stats.body)["max_outbound_bytes"] == 1048576
    assert _status(admission.decide("/nothing-here", None, [])) == HTTPStatus.NOT_FOUND
    assert _status(admission.decide("/", None, [])) == HTTPStatus.OK  # the web page


def test_token_comes_from_the_bearer_header_or_the_query(admission: Admission, keys: KeyPair):
    token = keys.mint("alice")
    assert admission.decide("/ws", f"Bearer {token}", []) == Admitted("alice", None)
    assert admission.decide(f"/ws?token={token}", None, []) == Admitted("alice", None)
    missing = admission.decide("/ws", f"Basic {token}", [])
    assert _status(missing) == HTTPStatus.UNAUTHORIZED
    assert isinstance(missing, Reply) and len(missing.body.strip().splitlines()) == 1
    expired = admission.decide("/ws", f"Bearer {keys.mint('alice', ttl_s=-120)}", [])
    assert isinstance(expired, Reply) and "expired" in expired.body


def test_401_is_decided_before_400_and_400_names_our_subprotocol(
    admission: Admission, keys: KeyPair
):
    assert _status(admission.decide("/ws", None, ["chatlab.protobuf"])) == HTTPStatus.UNAUTHORIZED
    wrong = admission.decide("/ws", f"Bearer {keys.mint('alice')}", ["chatlab.protobuf"])
    assert _status(wrong) == HTTPStatus.BAD_REQUEST
    assert isinstance(wrong, Reply) and "chatlab.json" in wrong.body
    # offered among others, in one header or several: ours is answered
    bearer = f"Bearer {keys.mint('alice')}"
    for offered in (["chatlab.protobuf, chatlab.json"], ["x", "chatlab.json"]):
        assert admission.decide("/ws", bearer, offered) == Admitted("alice", "chatlab.json")


def test_503_while_draining_or_past_max_connections(
    admission: Admission, service: FakeService, keys: KeyPair
):
    bearer = f"Bearer {keys.mint('alice')}"
    service.connections = 2
    assert _status(admission.decide("/ws", bearer, [])) == HTTPStatus.SERVICE_UNAVAILABLE
    service.connections = 1
    assert isinstance(admission.decide("/ws", bearer, []), Admitted)
    service.draining = True
    assert _status(admission.decide("/ws", bearer, [])) == HTTPStatus.SERVICE_UNAVAILABLE
    assert _status(admission.decide("/healthz", None, [])) == HTTPStatus.OK


def test_connections_per_address_count_the_client_a_trusted_proxy_names(
    keys: KeyPair, service: FakeService
):
    settings = Settings.from_mapping(
        {"MAX_CONNECTIONS_PER_ADDRESS": "1", "TRUSTED_PROXIES": "10.0.0.0/24"}
    )
    verifier = TokenVerifier(keys.private_key.public_key(), "EdDSA", ISSUER, AUDIENCE)
    admission = Admission(settings, service, verifier, get_codec("orjson"), OutboundStats())  # type: ignore[arg-type]
    bearer = f"Bearer {keys.mint('alice')}"

    def decide(peer: str, *forwarded: str) -> Reply | Admitted:
        return admission.decide("/ws", bearer, [], peer=peer, forwarded_for=forwarded)

    behind = decide("10.0.0.5", "203.0.113.7")
    assert isinstance(behind, Admitted) and behind.client == "203.0.113.7"
    admission.addresses.opened(behind.client)
    chain = decide("10.0.0.9", "198.51.100.1, 203.0.113.7")  # the right-most is the client
    assert _status(chain) == HTTPStatus.SERVICE_UNAVAILABLE
    # a peer that is no listed proxy is its own client, whatever header it sends
    forged = decide("192.0.2.1", "198.51.100.1")
    assert isinstance(forged, Admitted) and forged.client == "192.0.2.1"
    admission.addresses.opened(forged.client)
    assert _status(decide("192.0.2.1", "198.51.100.2")) == HTTPStatus.SERVICE_UNAVAILABLE
    assert admission.addresses.refusals == 2
    admission.addresses.closed("203.0.113.7")
    assert isinstance(decide("10.0.0.5", "203.0.113.7"), Admitted)
    assert admission.addresses.count("203.0.113.7") == 0  # forgotten, not kept at zero


def test_healthz_answers_503_draining_once_stopping(admission: Admission, keys: KeyPair):
    admission.stopping = True
    draining = admission.decide("/healthz", None, [])
    assert _status(draining) == HTTPStatus.SERVICE_UNAVAILABLE
    assert isinstance(draining, Reply) and "draining" in draining.body
    # the listener still serves meanwhile: upgrades are admitted as before
    assert isinstance(admission.decide("/ws", f"Bearer {keys.mint('alice')}", []), Admitted)
