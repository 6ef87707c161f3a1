"""The shared keyring's rule, driven with plain numbers: which key signs, which are served."""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from auth_service.keys_postgres import KeyRow, schedule
from auth_service.tokens import RETIRED_KEY_LEEWAY_S

TTL_S = 100


def _row(kid: str, created_at: int, active_at: int) -> KeyRow:
    return KeyRow(kid, Ed25519PrivateKey.generate(), created_at, active_at)


def _served(rows: list[KeyRow], now_s: float) -> list[str]:
    return [key.kid for key in schedule(rows, now_s, TTL_S).served]


def test_a_published_key_is_served_before_it_signs_then_signs_from_its_activation():
    old, new = _row("old", 0, 0), _row("new", 1000, 1090)
    rows = [new, old]
    before = schedule(rows, 1089, TTL_S)
    assert before.signing == old
    assert [key.kid for key in before.served] == ["old", "new"]  # the signing key first
    assert before.served[1].retired_at is None  # pending: not retired, not signing
    at = schedule(rows, 1090, TTL_S)
    assert at.signing == new
    assert _served(rows, 1090) == ["new", "old"]
    assert at.served[1].retired_at == 1090


def test_a_retired_key_is_served_until_its_last_token_expired_then_expires():
    old, new = _row("old", 0, 0), _row("new", 1000, 1090)
    last_served_s = 1090 + TTL_S + RETIRED_KEY_LEEWAY_S - 1
    assert _served([old, new], last_served_s) == ["new", "old"]
    gone = schedule([old, new], last_served_s + 1, TTL_S)
    assert _served([old, new], last_served_s + 1) == ["new"]
    assert gone.expired == ("old",)


def test_every_replica_orders_keys_alike_whatever_order_it_reads_them_in():
    first, second = _row("b", 5, 10), _row("a", 5, 10)  # same times: the kid decides
    assert schedule([first, second], 20, TTL_S).signing == first
    assert schedule([second, first], 20, TTL_S).signing == first


def test_no_key_signs_before_the_first_activation():
    assert schedule([_row("k", 0, 50)], 49, TTL_S).signing is None
    assert _served([_row("k", 0, 50)], 49) == ["k"]
