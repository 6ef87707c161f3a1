"""Token verification at the handshake: the chat server only *verifies* JWTs.

Keys come from ``JWT_PUBLIC_KEY`` (one PEM, loaded once at start) or, when
``JWT_JWKS_URL`` is set, from the auth service's JWK set: fetched at start (no set
reachable stops the server with exit 2) and refreshed in the background on
a worker thread, never on the handshake path; a token's key is picked by its
``kid``. ``JWT_JWKS_URL`` may name several auth replicas: the keys trusted are those
of every set that answered the last refresh (replicas sharing a keyring serve the
same set; one that is down or behind does not take keys away from the others').
Each handshake costs one signature check (PyJWT on ``cryptography``),
with ``exp``, ``iss``, ``aud`` and ``sub`` required and only the configured
algorithm accepted (never ``none``, never HS* with a public key, because the
algorithm list has exactly one asymmetric entry). Once a token verifies, its
claims are held to the contract strictly: ``exp``, ``iat`` and ``nbf`` must be
numbers (PyJWT alone takes ``"exp": "9999999999"``), ``sub`` must follow the
username rule (3-32 of ``A-Za-z0-9_.-``: it is shown to other users), and with a
single Ed25519 ``JWT_PUBLIC_KEY`` a token's ``kid``, when it has one, must be that
key's (computed as the auth service does: base64url of the first 8 bytes of
SHA-256 of the raw key).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import ssl
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.hazmat.primitives.serialization import (
    load_pem_public_key,
)

from chat_server.errors import ChatError
from chat_server.settings import SettingError, Settings
from chatlab.keys import key_id
from chatlab.supervision import RESTART, supervisor
from chatlab.tls import client_context

_KEY_TYPES = {
    "EdDSA": (ed25519.Ed25519PublicKey, ed448.Ed448PublicKey),
    "ES": (ec.EllipticCurvePublicKey,),
    "RS": (rsa.RSAPublicKey,),
    "PS": (rsa.RSAPublicKey,),
}


log = logging.getLogger("chat_server.auth")

#: the contract's username rule, which a token's ``sub`` must follow
USERNAME = re.compile(r"[A-Za-z0-9_.\-]{3,32}")
#: claims that must be numbers (seconds since the epoch) when present
NUMERIC_CLAIMS = ("exp", "iat", "nbf")


class InvalidToken(ChatError):
    """A token that does not open a chat connection; ``str()`` is the one-line reason."""


class TokenVerifier:
    """Verifies chat tokens against one public key; returns the user (``sub``).

    ``kid``: the key's id, which a token's ``kid`` header must match when it has one
    (None: any, for keys without an id). ``leeway_s`` (``JWT_LEEWAY_S``): how far the
    auth host's clock may be from this one's, allowed on ``exp``, ``nbf`` and ``iat``.
    """

    def __init__(
        self,
        public_key: object,
        algorithm: str,
        issuer: str,
        audience: str,
        keys_by_kid: JwksKeys | None = None,
        *,
        kid: str | None = None,
        leeway_s: float = 0.0,
    ) -> None:
        self._key = public_key
        self._leeway_s = leeway_s
        self._kid = kid
        self._keys_by_kid = keys_by_kid
        self._algorithms = [algorithm]
        self._issuer = issuer
        self._audience = audience
        self._jwt = jwt.PyJWT(options={"require": ["exp", "iss", "aud", "sub"]})

    @property
    def jwks(self) -> JwksKeys | None:
        """The JWK set the keys come from (None with a single PEM key)."""
        return self._keys_by_kid

    def health(self) -> str:
        """What ``/healthz`` adds about the keys: the JWK set's age (nothing for a PEM key)."""
        return "" if self._keys_by_kid is None else self._keys_by_kid.health()

    def start_refresh(self) -> asyncio.Task[None] | None:
        """Start refreshing the JWK set in the background (None with a single PEM key)."""
        if self._keys_by_kid is None:
            return None
        # the refresh survives any failed fetch itself; should it end anyway, it restarts
        return supervisor().start("chat-jwks-refresh", self._keys_by_kid.refresh_forever, RESTART)

    def verify(self, token: str) -> str:
        """Return the token's ``sub`` if it is valid now, else raise :class:`InvalidToken`."""
        if self._keys_by_kid is not None:
            key = self._keys_by_kid.key_for(token)
        else:
            key = self._key
            if self._kid is not None:
                self._check_kid(token)
        try:
            claims = self._jwt.decode(
                token,
                key,  # type: ignore[arg-type]
                algorithms=self._algorithms,
                issuer=self._issuer,
                audience=self._audience,
                leeway=self._leeway_s,
            )
        except jwt.ExpiredSignatureError:
            raise InvalidToken("token expired") from None
        except jwt.InvalidAlgorithmError:
            raise InvalidToken(
                f"token algorithm not allowed (only {self._algorithms[0]})"
            ) from None
        except jwt.InvalidSignatureError:
            raise InvalidToken("token signature does not verify") from None
        except jwt.InvalidAudienceError:
            raise InvalidToken("token audience is not this server") from None
        except jwt.InvalidIssuerError:
            raise InvalidToken("token issuer is not trusted") from None
        except jwt.MissingRequiredClaimError as exc:
            raise InvalidToken(f"token lacks the {exc.claim} claim") from None
        except jwt.PyJWTError as exc:
            raise InvalidToken(f"invalid token: {exc}") from None
        for name in NUMERIC_CLAIMS:
            value = claims.get(name)
            if value is not None and (type(value) not in (int, float)):
                raise InvalidToken(f"token {name} is not a number")
        sub = claims.get("sub")
        if not isinstance(sub, str) or USERNAME.fullmatch(sub) is None:
            raise InvalidToken("token sub is not a user name (3-32 of A-Za-z0-9_.-)")
        return sub

    def _check_kid(self, token: str) -> None:
        """Refuse a token whose ``kid`` header names another key than the configured one."""
        try:
            kid = jwt.get_unverified_header(token).get("kid")
        except jwt.PyJWTError as exc:
            raise InvalidToken(f"invalid token: {exc}") from None
        if kid is not None and kid != self._kid:
            raise InvalidToken("token key id (kid) is not JWT_PUBLIC_KEY's")


def load_verifier(settings: Settings) -> TokenVerifier:
    """Load the keys (JWK set or ``JWT_PUBLIC_KEY``); a missing or wrong key is a SettingError."""
    if settings.jwt_jwks_url:
        jwks = JwksKeys(
            settings.jwt_jwks_url,
            settings.jwt_algorithm,
            settings.jwks_refresh_s,
            max_age_s=settings.jwks_stale_after_s(),
            ssl_context=client_context(settings.tls_ca_file),
        )
        try:
            jwks.fetch()
        except (OSError, ValueError, jwt.PyJWTError) as exc:
            raise SettingError(
                "JWT_JWKS_URL",
                ",".join(settings.jwt_jwks_url),
                f"cannot load a JWK set from it ({exc})",
            ) from None
        return TokenVerifier(
            None,
            settings.jwt_algorithm,
            settings.jwt_issuer,
            settings.jwt_audience,
            jwks,
            leeway_s=settings.jwt_leeway_s,
        )
    path = Path(settings.jwt_public_key)
    try:
        key = load_pem_public_key(path.read_bytes())
    except OSError as exc:
        raise SettingError(
            "JWT_PUBLIC_KEY",
            settings.jwt_public_key,
            f"cannot read it ({exc.strerror}); start the auth service first, it writes this file",
        ) from None
    except ValueError:
        raise SettingError(
            "JWT_PUBLIC_KEY", settings.jwt_public_key, "not a PEM public key"
        ) from None
    family = "EdDSA" if settings.jwt_algorithm == "EdDSA" else settings.jwt_algorithm[:2]
    if not isinstance(key, _KEY_TYPES[family]):
        raise SettingError(
            "JWT_PUBLIC_KEY",
            settings.jwt_public_key,
            f"the key does not suit JWT_ALGORITHM={settings.jwt_algorithm}",
        )
    return TokenVerifier(
        key,
        settings.jwt_algorithm,
        settings.jwt_issuer,
        settings.jwt_audience,
        kid=_key_id(key),
        leeway_s=settings.jwt_leeway_s,
    )


def _key_id(public_key: object) -> str | None:
    """The auth service's ``kid`` for an Ed25519 key (None for other keys: they have none)."""
    if not isinstance(public_key, ed25519.Ed25519PublicKey):
        return None
    return key_id(public_key)


class JwksKeys:
    """The auth service's JWK set (one or several replicas'), by ``kid``, refreshed off the loop.

    :meth:`key_for` never does I/O: it reads the last fetched keys. A token whose
    ``kid`` is unknown is refused and wakes an early refresh (at most one per
    ``min_refresh_s``, counted from the last attempt), so a key rotated in between
    refreshes is picked up soon. No answer stops the refresh: whatever a fetch
    raises (an unreachable replica, ``[]``, a truncated body) is logged, the keys
    held are kept, and the fetch is tried again after a backoff from
    ``min_retry_s`` doubling up to ``refresh_s``.

    The set's age (since the last fetch that installed keys) is :meth:`age_s`. Past
    ``max_age_s`` the set is *stale*: the keys held are still accepted (availability;
    docs/protocol.md, "JWK set age", says why), once-per-episode warnings say so,
    ``/healthz`` and the metrics show it.
    """

    def __init__(
        self,
        urls: tuple[str, ...],
        algorithm: str,
        refresh_s: float,
        min_refresh_s: float = 5.0,
        *,
        max_age_s: float = float("inf"),
        min_retry_s: float = 0.5,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.urls = urls
        #: verifies an https:// set's certificate (TLS_CA_FILE); None: the system's CAs
        self.ssl_context = ssl_context
        self.algorithm = algorithm
        self.refresh_s = refresh_s
        self.min_refresh_s = min_refresh_s
        self.max_age_s = max_age_s
        self.min_retry_s = min_retry_s
        self._keys: Mapping[str, object] = {}
        self._last_fetch = 0.0
        self._last_attempt = 0.0
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: refreshes that failed since the last that succeeded
        self.failures_in_a_row = 0
        self._stale_said = False

    def fetch(self, timeout_s: float = 5.0) -> None:
        """Fetch every set and install the keys of those that answered (blocking: call it from
        a thread, or at start); raises when none answered with a usable key."""
        keys: dict[str, object] = {}
        failures: list[str] = []
        for url in self.urls:
            try:
                keys.update(self._fetch_one(url, timeout_s))
            except Exception as exc:  # whatever a replica answers, the others still count
                failures.append(f"{url}: {type(exc).__name__}: {exc}")
        if failures and len(failures) < len(self.urls):
            log.warning("JWK set refresh: keys taken from the others; %s", "; ".join(failures))
        if not keys:
            if failures:
                raise OSError("; ".join(failures))
            raise ValueError(f"the JWK set has no {self.algorithm} key with a kid")
        self._keys = keys
        self._last_fetch = time.monotonic()

    def _fetch_one(self, url: str, timeout_s: float) -> dict[str, object]:
        with urllib.request.urlopen(url, timeout=timeout_s, context=self.ssl_context) as response:
            document = json.loads(response.read())
        if not isinstance(document, dict):
            raise ValueError(f"not a JWK set: a JSON {type(document).__name__}")
        keys: dict[str, object] = {}
        for jwk in jwt.PyJWKSet.from_dict(document):
            if jwk.key_id is None:
                continue
            if jwk.algorithm_name not in (self.algorithm, "UNKNOWN"):
                continue
            keys[jwk.key_id] = jwk.key
        if not keys:
            raise ValueError(f"the JWK set has no {self.algorithm} key with a kid")
        return keys

    @property
    def kids(self) -> list[str]:
        """The key ids currently trusted."""
        return list(self._keys)

    def age_s(self) -> float:
        """Seconds since the last refresh that installed keys."""
        return time.monotonic() - self._last_fetch

    def health(self) -> str:
        """The set's age for ``/healthz``: ``jwks age 12 s``, ``stale`` past ``max_age_s``."""
        age_s = self.age_s()
        if age_s <= self.max_age_s:
            return f"jwks age {age_s:.0f} s"
        return (
            f"jwks stale: age {age_s:.0f} s > JWKS_MAX_AGE_S {self.max_age_s:g} s, "
            f"{self.failures_in_a_row} refreshes failed; accepting the keys held"
        )

    def key_for(self, token: str) -> object:
        """The key named by the token's ``kid``; raise :class:`InvalidToken` when unknown."""
        try:
            kid = jwt.get_unverified_header(token).get("kid")
        except jwt.PyJWTError as exc:
            raise InvalidToken(f"invalid token: {exc}") from None
        key = self._keys.get(kid) if isinstance(kid, str) else None
        if key is None:
            self._wake_early()
            raise InvalidToken("token key id (kid) is not in the auth service's key set")
        return key

    def _wake_early(self) -> None:
        """Refresh now unless an attempt was made in the last ``min_refresh_s`` (any thread)."""
        if self._wake is None or self._loop is None:
            return
        if time.monotonic() - self._last_attempt <= self.min_refresh_s:
            return
        with contextlib.suppress(RuntimeError):  # the loop closed
            self._loop.call_soon_threadsafe(self._wake.set)

    async def refresh_forever(self) -> None:
        """Refresh every ``refresh_s`` (sooner when an unknown kid was seen, or after a
        failure with backoff) until cancelled; never ends on a failed fetch."""
        loop = self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        wait_s = self.refresh_s
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait_s)
            self._wake.clear()
            self._last_attempt = time.monotonic()
            try:
                await loop.run_in_executor(None, self.fetch)
            except Exception as exc:
                self.failures_in_a_row += 1
                wait_s = min(self.refresh_s, self.min_retry_s * 2 ** (self.failures_in_a_row - 1))
                log.warning(
                    "JWK set refresh from %s failed (%d in a row), keeping %s, next try in "
                    "%.1f s: %s",
                    ",".join(self.urls),
                    self.failures_in_a_row,
                    self.kids,
                    wait_s,
                    exc,
                )
                self._say_if_stale()
                continue
            if self.failures_in_a_row or self._stale_said:
                log.warning(
                    "JWK set refreshed again after %d failures: %s",
                    self.failures_in_a_row,
                    self.kids,
                )
            self.failures_in_a_row = 0
            self._stale_said = False
            wait_s = self.refresh_s

    def _say_if_stale(self) -> None:
        if not self._stale_said and self.age_s() > self.max_age_s:
            self._stale_said = True
            log.error(
                "JWK set stale: not refreshed for %.0f s (JWKS_MAX_AGE_S %g); still accepting "
                "the keys held, %s: a key revoked meanwhile is still trusted",
                self.age_s(),
                self.max_age_s,
                self.kids,
            )
