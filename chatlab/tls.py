"""TLS both services share: the server's context from ``TLS_CERT_FILE``/``TLS_KEY_FILE``,
and a client's context that verifies against a CA file.

Both are :class:`ssl.SSLContext` built by the standard library's own defaults
(``ssl.create_default_context``: certificate and host name verified on a client), with
TLS 1.2 as the oldest version either side speaks. A setting that names a missing file
or a pair that does not load raises :class:`~chatlab.settings.SettingError` naming the
setting at fault, which each service's entry point turns into exit status 2.
"""

from __future__ import annotations

import functools
import ssl
from pathlib import Path

from chatlab.settings import SettingError, Spec, optional_text

MINIMUM_VERSION = ssl.TLSVersion.TLSv1_2

#: the settings both services serve TLS with, under the same names
TLS_SERVER_SPECS = (
    Spec(
        "TLS_CERT_FILE",
        "tls_cert_file",
        "",
        optional_text,
        "PEM certificate (chain) to serve TLS with on the service's port (the chat server:"
        " wss:// and https://; the auth service: https://; empty: plain); needs"
        " TLS_KEY_FILE. A missing file or a pair that does not load: exit 2",
    ),
    Spec(
        "TLS_KEY_FILE",
        "tls_key_file",
        "",
        optional_text,
        "PEM private key of TLS_CERT_FILE (both set, or neither)",
    ),
)


def check_pair(cert_file: str, key_file: str) -> None:
    """Raise :class:`SettingError` unless both or neither are set and both files exist."""
    if bool(cert_file) != bool(key_file):
        name, value = ("TLS_KEY_FILE", key_file) if cert_file else ("TLS_CERT_FILE", cert_file)
        raise SettingError(name, value, "TLS_CERT_FILE and TLS_KEY_FILE: both set, or neither")
    for name, value in (("TLS_CERT_FILE", cert_file), ("TLS_KEY_FILE", key_file)):
        if value and not Path(value).is_file():
            raise SettingError(name, value, "no such file (a PEM file readable by the service)")


def server_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """The server side's context for the pair (TLS 1.2 and up); :class:`SettingError`
    names ``TLS_CERT_FILE`` when the certificate does not load, ``TLS_KEY_FILE`` when
    the key does not (or does not match the certificate)."""
    check_pair(cert_file, key_file)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = MINIMUM_VERSION
    try:
        context.load_cert_chain(cert_file, key_file)
    except (ssl.SSLError, OSError) as exc:
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_verify_locations(cert_file)
        except (ssl.SSLError, OSError):
            raise SettingError(
                "TLS_CERT_FILE", cert_file, f"not a PEM certificate (chain): {exc}"
            ) from None
        raise SettingError(
            "TLS_KEY_FILE", key_file, f"not the PEM private key of TLS_CERT_FILE: {exc}"
        ) from None
    return context


def client_context(ca_file: str = "") -> ssl.SSLContext:
    """A client's context (TLS 1.2 and up) that verifies the server's certificate and
    name against ``ca_file`` (empty: the system's CAs)."""
    context = ssl.create_default_context(cafile=ca_file or None)
    context.minimum_version = MINIMUM_VERSION
    return context


@functools.cache
def shared_client_context(ca_file: str = "") -> ssl.SSLContext:
    """:func:`client_context` for ``ca_file``, made once per process and shared by every
    client of it: making one loads the CA certificates (~20 ms of CPU), which a load
    generator must not pay per user or per connection."""
    return client_context(ca_file)


def check_ca_file(name: str, ca_file: str) -> ssl.SSLContext:
    """:func:`client_context` for ``ca_file``, or :class:`SettingError` naming ``name``."""
    if ca_file and not Path(ca_file).is_file():
        raise SettingError(name, ca_file, "no such file (a PEM file of CA certificates)")
    try:
        return client_context(ca_file)
    except (ssl.SSLError, OSError) as exc:
        raise SettingError(name, ca_file, f"not a PEM file of CA certificates: {exc}") from None
