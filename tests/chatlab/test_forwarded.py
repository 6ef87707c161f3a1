"""chatlab.forwarded: whose address a request is, driven with plain strings."""

from __future__ import annotations

import pytest

from chatlab.forwarded import client_address, parse_address, trusted_proxies

PROXIES = trusted_proxies("10.0.0.0/24, 192.0.2.1, fd00::/8")


def test_a_trusted_proxys_header_names_the_client():
    assert client_address("10.0.0.5", ["203.0.113.7"], PROXIES) == "203.0.113.7"
    # several headers are one list, in order
    assert client_address("10.0.0.5", ["198.51.100.1", "203.0.113.7"], PROXIES) == "203.0.113.7"


def test_anyone_elses_header_is_ignored():
    assert client_address("198.51.100.1", ["203.0.113.7"], PROXIES) == "198.51.100.1"
    assert client_address("10.0.0.5", ["203.0.113.7"], ()) == "10.0.0.5"  # none listed


def test_the_walk_stops_at_the_first_address_that_is_no_listed_proxy():
    # a forged left part cannot move the client: the right-most untrusted address wins
    forged = "1.2.3.4, 203.0.113.7, 192.0.2.1"
    assert client_address("10.0.0.5", [forged], PROXIES) == "203.0.113.7"
    # every hop a listed proxy: the farthest one is the client
    assert client_address("10.0.0.5", ["10.0.0.7, 192.0.2.1"], PROXIES) == "10.0.0.7"


def test_ipv6_peers_and_hops():
    assert client_address("fd00::1", ["2001:db8::5"], PROXIES) == "2001:db8::5"
    assert client_address("fd00::1", ["[2001:db8::5]"], PROXIES) == "2001:db8::5"
    assert client_address("fd00::1", ["2001:DB8:0::5, fd00::2"], PROXIES) == "2001:db8::5"
    # an IPv4 peer on a dual-stack socket is the IPv4 address it carries
    assert client_address("::ffff:10.0.0.5", ["203.0.113.7"], PROXIES) == "203.0.113.7"
    assert client_address("10.0.0.5", ["203.0.113.7:51234"], PROXIES) == "203.0.113.7"


@pytest.mark.parametrize("header", ["", " ", "unknown", "203.0.113.7, garbage", "1.2.3.4,,"])
def test_a_header_with_no_address_where_the_walk_stops_leaves_the_peer(header: str):
    assert client_address("10.0.0.5", [header], PROXIES) == "10.0.0.5"


def test_no_header_leaves_the_peer():
    assert client_address("10.0.0.5", [], PROXIES) == "10.0.0.5"


def test_garbage_to_the_left_of_the_client_is_not_read():
    assert client_address("10.0.0.5", ["garbage, 203.0.113.7"], PROXIES) == "203.0.113.7"


def test_parse_address_takes_what_sockets_and_proxies_write():
    assert str(parse_address(" 203.0.113.7 ")) == "203.0.113.7"
    assert parse_address("example.org") is None


@pytest.mark.parametrize("raw", ["10.0.0.1/8", "proxy.example", "10.0.0.0/33", "1.2.3"])
def test_a_bad_entry_is_refused_naming_it(raw: str):
    with pytest.raises(ValueError, match="allowed") as refused:
        trusted_proxies(f"192.0.2.1,{raw}")
    assert raw in str(refused.value)


def test_empty_means_no_proxy():
    assert trusted_proxies("") == () == trusted_proxies(" , ")
