"""Whose request it is: the client's address, taken from ``X-Forwarded-For`` only when the
connection comes from a proxy listed in ``TRUSTED_PROXIES``.

Both services share it. Behind a proxy every connection's peer is the proxy, so a
per-address bound (the auth service's login limits, the chat server's connections
per address) would count every user as one; the proxy says whom it forwards in
``X-Forwarded-For``, a comma-separated list each hop appends its own peer to. Anyone
can send that header, so it is believed only from a listed proxy, and only as far
as the list reaches: :func:`client_address` walks it from the right (the entry the
nearest proxy wrote) past every listed proxy, and the first address that is not one
is the client. That is the rule of uvicorn's ``ProxyHeadersMiddleware`` and of
nginx's ``real_ip_recursive``; it is pure, so tests drive it with plain strings.
"""

from __future__ import annotations

from collections.abc import Iterable
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address, ip_network

from chatlab.settings import Spec

Address = IPv4Address | IPv6Address
TrustedProxies = tuple[IPv4Network | IPv6Network, ...]

#: the header a proxy names the client in (HAProxy's ``option forwardfor``, nginx's
#: ``$proxy_add_x_forwarded_for``)
FORWARDED_FOR = "X-Forwarded-For"


def trusted_proxies(raw: str) -> TrustedProxies:
    """``TRUSTED_PROXIES``: empty (none), or IP addresses and CIDR networks, comma-separated.

    A network with host bits set (``10.0.0.1/8``) is refused: it is likely a typo.
    """
    networks = []
    for entry in (part.strip() for part in raw.split(",")):
        if not entry:
            continue
        try:
            networks.append(ip_network(entry))
        except ValueError as exc:
            raise ValueError(
                "allowed: empty, or IP addresses and CIDR networks, comma-separated, such as"
                f" 10.0.0.5,192.168.0.0/24,fd00::/8 (not {entry!r}: {exc})"
            ) from None
    return tuple(networks)


TRUSTED_PROXIES_SPEC = Spec(
    "TRUSTED_PROXIES",
    "trusted_proxies",
    "",
    trusted_proxies,
    "proxies (IP addresses, CIDR networks; comma-separated) whose X-Forwarded-For names the"
    " client: the right-most address there that is not a listed proxy. Empty: the peer is"
    " the client and every X-Forwarded-For is ignored",
)


def parse_address(text: str) -> Address | None:
    """An IP address as a socket or a proxy writes it (``[::1]``, ``1.2.3.4:5678`` and an
    IPv4-mapped IPv6 address taken as the address they carry); None when it is none."""
    value = text.strip()
    if value.startswith("["):
        value = value[1:].partition("]")[0]
    elif value.count(":") == 1:
        value = value.partition(":")[0]
    try:
        address = ip_address(value)
    except ValueError:
        return None
    if isinstance(address, IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _listed(address: Address, trusted: TrustedProxies) -> bool:
    return any(address in network for network in trusted)


def client_address(peer: str, forwarded_for: Iterable[str], trusted: TrustedProxies) -> str:
    """The client's address: ``peer`` unless it is a listed proxy; then, of the
    ``X-Forwarded-For`` values (every such header, in order), the right-most address that
    is not a listed proxy (the left-most when all are). A header that is absent, empty,
    or holds no address where the walk stops leaves the peer as the client."""
    if not trusted:
        return peer
    peer_address = parse_address(peer)
    if peer_address is None or not _listed(peer_address, trusted):
        return peer
    hops = [part for value in forwarded_for for part in value.split(",")]
    found: Address | None = None
    for hop in reversed(hops):
        found = parse_address(hop)
        if found is None:
            return peer
        if not _listed(found, trusted):
            break
    return peer if found is None else str(found)
