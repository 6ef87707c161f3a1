"""The HTTP API (contract: ``docs/protocol.md``, "Auth service") as a Starlette app.

Why Starlette on uvicorn: it is ASGI, so the same app runs under any ASGI server;
it is a handful of small modules (routing, requests, responses) of the kind
well-kept Python projects have, with no ORM or settings system to fight; and uvicorn's
:class:`~uvicorn.Server` runs inside an event loop we create (``EVENT_LOOP``), so a
second listener can share that loop later. Neither we nor this module parse HTTP:
uvicorn (h11) does.

Guarantees: every error body is ``{"error": code, "detail": text}`` (404 and 405
too); a body over :data:`MAX_BODY_BYTES` is refused with 413 before it is read in
full; password work happens only in :class:`~auth_service.passwords.PasswordPool`
and database work only in the user store (SQLite on its own thread, PostgreSQL through
its asyncio driver), never blocking the loop;
an unknown username and a wrong password get the same 401 body after the same
amount of hashing. ``/refresh`` and ``/logout`` hash no password: a session's rules
live in :mod:`auth_service.sessions`, and neither a refresh token nor its hash is
logged (a session's family id may be).
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from typing import Any, Final

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from auth_service.connections import ConnectionGuard
from auth_service.errors import AuthCode, AuthError, Unavailable
from auth_service.metrics import AuthMetrics, MeasuredPasswords, RequestMetrics
from auth_service.passwords import InlinePasswords, PasswordPool
from auth_service.ratelimit import KnownAddresses, TokenBuckets
from auth_service.sessions import (
    REFRESH_COOKIE,
    Outcome,
    Refreshed,
    RevokeReason,
    Session,
    Sessions,
    well_formed,
)
from auth_service.settings import Settings
from auth_service.tokens import KeySource, TokenIssuer
from auth_service.users import Users, username_key
from chatlab.forwarded import FORWARDED_FOR, TrustedProxies, client_address

log = logging.getLogger("auth_service.app")

#: the largest request body accepted (the contract's 4 KiB)
MAX_BODY_BYTES: Final = 4096
USERNAME_RULE: Final = re.compile(r"[A-Za-z0-9_.-]{3,32}")
PASSWORD_MIN_CHARS: Final = 8
PASSWORD_MAX_CHARS: Final = 256
_INVALID_CREDENTIALS: Final = "unknown username or wrong password"
#: the API's paths (and the ``route`` label values of its metrics)
ROUTES: Final = (
    "/register",
    "/login",
    "/refresh",
    "/logout",
    "/.well-known/jwks.json",
    "/healthz",
    "/metrics",
)
#: the routes a refresh token is presented to: its cookie is scoped to each (a cookie
#: has one path), so the browser sends it to nothing else
COOKIE_PATHS: Final = ("/refresh", "/logout")
_INVALID_TOKEN: Final = "the refresh token is unknown, expired, revoked or reused: log in"


#: addresses remembered per username as ones it logged in from (see Limits)
KNOWN_ADDRESSES_PER_USER: Final = 8
#: how long a successful login's address stays known for its username: 30 days
KNOWN_ADDRESS_S: Final = 30 * 86400


@dataclass(frozen=True)
class Limits:
    """The service's rate limits (docs/protocol.md, "Login limits").

    Failed logins are counted twice, both charged before the password is checked (so
    concurrent guesses cannot pass a burst) and given back when it was right: per
    (username, client address), which an attacker elsewhere cannot drain; and per
    username over every address, a ceiling on guessing from many addresses that the
    addresses a username logged in from lately (``known_addresses``) pass. So an
    attacker guessing at a username slows itself and any new address, never its owner
    at an address they logged in from. Besides: attempts per client address.
    """

    failed_logins_per_user: TokenBuckets
    logins_per_client: TokenBuckets
    registrations_per_client: TokenBuckets
    failed_logins_per_user_client: TokenBuckets
    known_addresses: KnownAddresses
    #: refreshes and logouts per client address (REFRESH_RATE_PER_CLIENT_PER_MIN)
    refreshes_per_client: TokenBuckets
    #: TRUSTED_PROXIES: whose X-Forwarded-For names the client (chatlab.forwarded)
    trusted_proxies: TrustedProxies = ()

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        """The limits with the settings' rates and bursts."""
        keys_max = settings.rate_limit_keys_max
        return cls(
            TokenBuckets(
                settings.login_rate_per_user_per_min, settings.login_burst_per_user, keys_max
            ),
            TokenBuckets(
                settings.login_rate_per_client_per_min, settings.login_burst_per_client, keys_max
            ),
            TokenBuckets(
                settings.register_rate_per_client_per_min,
                settings.register_burst_per_client,
                keys_max,
            ),
            TokenBuckets(
                settings.login_rate_per_user_client_per_min,
                settings.login_burst_per_user_client,
                keys_max,
            ),
            KnownAddresses(KNOWN_ADDRESSES_PER_USER, KNOWN_ADDRESS_S, keys_max),
            TokenBuckets(
                settings.refresh_rate_per_client_per_min,
                settings.refresh_burst_per_client,
                keys_max,
            ),
            settings.trusted_proxies,
        )

    def client(self, request: Request) -> str:
        """The request's client address: its peer's, or behind a proxy in
        ``TRUSTED_PROXIES`` the one its ``X-Forwarded-For`` names
        (:func:`chatlab.forwarded.client_address`)."""
        if request.client is None:
            return "unknown"
        return client_address(
            request.client.host, request.headers.getlist(FORWARDED_FOR), self.trusted_proxies
        )


def check_username(username: str) -> None:
    """Raise ``bad_request`` unless ``username`` is 3-32 of ``A-Za-z0-9_.-``."""
    if not USERNAME_RULE.fullmatch(username):
        raise AuthError(AuthCode.BAD_REQUEST, "username: 3 to 32 characters of A-Z a-z 0-9 _ . -")


def check_password(password: str) -> None:
    """Raise ``bad_request`` unless ``password`` is 8-256 characters."""
    if not PASSWORD_MIN_CHARS <= len(password) <= PASSWORD_MAX_CHARS:
        raise AuthError(
            AuthCode.BAD_REQUEST,
            f"password: {PASSWORD_MIN_CHARS} to {PASSWORD_MAX_CHARS} characters",
        )


class AuthAPI:
    """The endpoints, bound to the service's pool, user and session stores, token issuer
    and limits."""

    def __init__(
        self,
        passwords: PasswordPool | InlinePasswords,
        users: Users,
        sessions: Sessions,
        tokens: TokenIssuer,
        limits: Limits,
    ) -> None:
        self.metrics = AuthMetrics(ROUTES)
        self.passwords = MeasuredPasswords(passwords, self.metrics)
        self.users = users
        self.sessions = sessions
        self.tokens = tokens
        self.limits = limits

    async def register(self, request: Request) -> JSONResponse:
        """``POST /register``: 201 ``{"username"}`` once the user is committed."""
        _draw(self.limits.registrations_per_client, self.limits.client(request), "registrations")
        username, password = _credentials(await _json_object(request, '{"username", "password"}'))
        check_username(username)
        check_password(password)
        if await self.users.get(username) is not None:
            raise AuthError(AuthCode.USERNAME_TAKEN, f"the username {username!r} is taken")
        password_hash = await self.passwords.hash(password)
        await self.users.add(username, password_hash)
        return JSONResponse({"username": username}, status_code=201)

    async def login(self, request: Request) -> JSONResponse:
        """``POST /login``: 200 with a Bearer token and a refresh token (in the body, or with
        ``"cookie": true`` in cookies), or 401 with one body for every failure."""
        client = self.limits.client(request)
        _draw(self.limits.logins_per_client, client, "logins")
        document = await _json_object(request, '{"username", "password"}')
        username, password = _credentials(document)
        cookie = document.get("cookie", False) is True
        try:
            check_username(username)
            check_password(password)
        except AuthError:
            # no such user can exist: nothing to hash
            raise AuthError(AuthCode.INVALID_CREDENTIALS, _INVALID_CREDENTIALS) from None
        key = username_key(username)
        taken = self._take_failed_login(key, client)
        try:
            user = await self.users.get(username)
            verdict = await self.passwords.verify(
                None if user is None else user.password_hash, password
            )
        except Unavailable:
            self._give_back(taken, time.monotonic())
            raise
        if user is None or not verdict.ok:
            raise AuthError(AuthCode.INVALID_CREDENTIALS, _INVALID_CREDENTIALS)
        now = time.monotonic()
        self._give_back(taken, now)
        self.limits.known_addresses.remember(key, client, now)
        if verdict.needs_rehash:
            await self._rehash(user.username, password)
        session, revoked = await self.sessions.open_family(user.username, time.time())
        if revoked:
            self.metrics.sessions_revoked.labels(RevokeReason.LIMIT).inc(len(revoked))
            log.info(
                "login of %r revoked its %d oldest sessions (REFRESH_FAMILIES_PER_USER): %s",
                user.username,
                len(revoked),
                " ".join(revoked),
            )
        log.debug("login of %r opened session %s", user.username, session.family_id)
        return self._tokens(session, cookie)

    async def refresh(self, request: Request) -> JSONResponse:
        """``POST /refresh``: the token presented (body, or the cookie) is spent; 200 with a
        new access token and the next refresh token, or 401 ``invalid_token``."""
        _draw(self.limits.refreshes_per_client, self.limits.client(request), "refreshes")
        token, cookie = await _presented_token(request)
        try:
            refreshed = await self._refresh(token)
        except AuthError as exc:
            if not cookie or exc.code is not AuthCode.INVALID_TOKEN:
                raise
            failed = _error(exc.status, exc.code, exc.detail, exc.headers())
            _clear_cookies(failed)
            return failed
        assert refreshed.session is not None
        return self._tokens(refreshed.session, cookie)

    async def _refresh(self, token: str | None) -> Refreshed:
        if token is None or not well_formed(token):
            self.metrics.refreshes.labels(Outcome.INVALID).inc()
            raise AuthError(AuthCode.INVALID_TOKEN, _INVALID_TOKEN)
        refreshed = await self.sessions.refresh(token, time.time())
        self.metrics.refreshes.labels(refreshed.outcome).inc()
        if refreshed.outcome is Outcome.REUSED:
            self.metrics.sessions_revoked.labels(RevokeReason.REUSE).inc()
            log.warning(
                "session %s revoked: a spent refresh token was presented again (reuse)",
                refreshed.family_id,
            )
        elif refreshed.session is not None:
            log.debug("session %s refreshed (%s)", refreshed.family_id, refreshed.outcome)
        if refreshed.session is None:
            raise AuthError(AuthCode.INVALID_TOKEN, _INVALID_TOKEN)
        return refreshed

    async def logout(self, request: Request) -> Response:
        """``POST /logout``: 204, the token's family revoked (if it had a live one) and the
        cookies cleared; an unknown token is answered the same."""
        _draw(self.limits.refreshes_per_client, self.limits.client(request), "logouts")
        token, _ = await _presented_token(request)
        if token is not None and well_formed(token):
            family_id = await self.sessions.revoke_family_of(token, time.time())
            if family_id is not None:
                self.metrics.sessions_revoked.labels(RevokeReason.LOGOUT).inc()
                log.info("session %s ended by logout", family_id)
        answer = Response(status_code=204)
        _clear_cookies(answer)
        return answer

    def _tokens(self, session: Session, cookie: bool) -> JSONResponse:
        """The answer of a login or refresh: the refresh token in the body, or in cookies."""
        body: dict[str, Any] = {
            "access_token": self.tokens.issue(session.username),
            "token_type": "Bearer",
            "expires_in": self.tokens.ttl_s,
            "refresh_token": session.refresh_token,
            "refresh_expires_in": session.expires_in_s,
        }
        if not cookie:
            return JSONResponse(body)
        del body["refresh_token"]
        answer = JSONResponse(body)
        for path in COOKIE_PATHS:
            answer.set_cookie(
                REFRESH_COOKIE,
                session.refresh_token,
                max_age=session.expires_in_s,
                path=path,
                secure=True,
                httponly=True,
                samesite="strict",
            )
        return answer

    def _take_failed_login(self, key: str, client: str) -> list[tuple[TokenBuckets, str]]:
        """Take a failed login's tokens up front (see :class:`Limits`), or raise 429; the
        buckets and keys taken from, to give back when the attempt is no failed login."""
        limits, now = self.limits, time.monotonic()
        pair = f"{key} {client}"
        wait_s = limits.failed_logins_per_user_client.take(pair, now)
        if wait_s > 0:
            raise AuthError(
                AuthCode.RATE_LIMITED,
                "too many failed logins for this username from this address; retry later",
                wait_s,
            )
        taken = [(limits.failed_logins_per_user_client, pair)]
        wait_s = limits.failed_logins_per_user.take(key, now)
        if wait_s == 0:
            taken.append((limits.failed_logins_per_user, key))
        elif not limits.known_addresses.knows(key, client, now):
            self._give_back(taken, now)
            raise AuthError(
                AuthCode.RATE_LIMITED,
                "too many failed logins for this username; retry later, or from an "
                "address it logged in from",
                wait_s,
            )
        return taken

    def _give_back(self, taken: list[tuple[TokenBuckets, str]], now: float) -> None:
        for buckets, key in taken:
            buckets.refund(key, now)

    async def jwks(self, request: Request) -> JSONResponse:
        """``GET /.well-known/jwks.json``: every public key a live token may carry."""
        return JSONResponse(self.tokens.jwks())

    async def healthz(self, request: Request) -> JSONResponse:
        """``GET /healthz``: 200 while the service is serving."""
        return JSONResponse({"status": "ok"})

    async def _rehash(self, username: str, password: str) -> None:
        """Store a hash with the current parameters; skipped (till next login) when saturated."""
        try:
            password_hash = await self.passwords.hash(password)
        except Unavailable:
            log.info("hash of %r not upgraded: hashing is saturated; next login will", username)
            return
        await self.users.set_password_hash(username, password_hash)
        log.info("hash of %r upgraded to the current argon2 parameters", username)


def build_api(
    settings: Settings,
    passwords: PasswordPool | InlinePasswords,
    users: Users,
    sessions: Sessions,
    keys: KeySource,
) -> AuthAPI:
    """The API over ``users``, ``sessions`` and ``keys``, with the settings' token claims
    and limits."""
    tokens = TokenIssuer(
        keys,
        issuer=settings.jwt_issuer,
        audience=settings.jwt_audience,
        ttl_s=settings.token_ttl_s,
    )
    return AuthAPI(passwords, users, sessions, tokens, Limits.from_settings(settings))


def create_app(api: AuthAPI, cors_origins: tuple[str, ...] = ()) -> Starlette:
    """The Starlette application serving ``api`` with the contract's error bodies.

    Every answer is counted in ``api.metrics`` (``GET /metrics``). Browsers on the
    ``cors_origins`` (the chat server's web page) may call the API across origins:
    Starlette's CORS middleware answers their preflights and marks the answers.
    """
    routes = [
        Route("/register", api.register, methods=["POST"]),
        Route("/login", api.login, methods=["POST"]),
        Route("/refresh", api.refresh, methods=["POST"]),
        Route("/logout", api.logout, methods=["POST"]),
        Route("/.well-known/jwks.json", api.jwks, methods=["GET"]),
        Route("/healthz", api.healthz, methods=["GET"]),
        Route("/metrics", api.metrics.endpoint, methods=["GET"]),
    ]
    handlers: dict[Any, Any] = {
        AuthError: _auth_error,
        HTTPException: _http_error,
        Exception: _internal_error,
    }
    middleware = [Middleware(RequestMetrics, metrics=api.metrics)]
    if cors_origins:
        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=list(cors_origins),
                allow_methods=["GET", "POST"],
                allow_headers=["Content-Type"],
                # the page sends and receives the refresh cookie (credentials: "include")
                allow_credentials=True,
                # the page reads Retry-After from a 429 or 503
                expose_headers=["Retry-After"],
                max_age=600,
            )
        )
    return Starlette(routes=routes, exception_handlers=handlers, middleware=middleware)


# ---- helpers ---------------------------------------------------------------------------


def _draw(buckets: TokenBuckets, key: str, what: str) -> None:
    wait_s = buckets.take(key, time.monotonic())
    if wait_s > 0:
        raise AuthError(AuthCode.RATE_LIMITED, f"too many {what}; retry later", wait_s)


async def _json_object(request: Request, shape: str, empty_ok: bool = False) -> dict[str, Any]:
    """The body as a JSON object, or ``bad_request`` / ``too_large``; an empty body is
    ``{}`` when ``empty_ok``."""
    body = await _read_body(request)
    if empty_ok and not body.strip():
        return {}
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise AuthError(AuthCode.BAD_REQUEST, "the body is not JSON (UTF-8)") from None
    if not isinstance(document, dict):
        raise AuthError(AuthCode.BAD_REQUEST, f"the body must be a JSON object {shape}")
    return document


def _credentials(document: dict[str, Any]) -> tuple[str, str]:
    """The body's ``username`` and ``password`` strings, or ``bad_request``."""
    username, password = document.get("username"), document.get("password")
    if not isinstance(username, str) or not isinstance(password, str):
        raise AuthError(AuthCode.BAD_REQUEST, '"username" and "password" must both be strings')
    return username, password


async def _presented_token(request: Request) -> tuple[str | None, bool]:
    """The refresh token of a ``/refresh`` or ``/logout`` request and whether it came by
    cookie: the body's ``refresh_token``, else (an empty body or ``{}``) the cookie."""
    document = await _json_object(request, '{"refresh_token"} or {}', empty_ok=True)
    if "refresh_token" in document:
        token = document["refresh_token"]
        if not isinstance(token, str):
            raise AuthError(AuthCode.BAD_REQUEST, '"refresh_token" must be a string')
        return token, False
    return request.cookies.get(REFRESH_COOKIE), True


def _clear_cookies(answer: Response) -> None:
    """Make the browser forget the refresh cookie on both its paths (``Max-Age=0``)."""
    for path in COOKIE_PATHS:
        answer.delete_cookie(
            REFRESH_COOKIE, path=path, secure=True, httponly=True, samesite="strict"
        )


async def _read_body(request: Request) -> bytes:
    """The request body, refused with ``too_large`` as soon as it passes MAX_BODY_BYTES."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise AuthError(AuthCode.TOO_LARGE, f"the body is over {MAX_BODY_BYTES} bytes")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                raise AuthError(AuthCode.TOO_LARGE, f"the body is over {MAX_BODY_BYTES} bytes")
    except ClientDisconnect:  # gone, or cut off by AUTH_BODY_TIMEOUT_S (answered 408 then)
        raise AuthError(AuthCode.REQUEST_TIMEOUT, "the body did not arrive") from None
    return bytes(body)


def _error(status: int, code: str, detail: str, headers: dict[str, str] | None) -> JSONResponse:
    return JSONResponse({"error": code, "detail": detail}, status_code=status, headers=headers)


async def _auth_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, AuthError)
    return _error(exc.status, exc.code, exc.detail, exc.headers())


_HTTP_CODES: Final = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
}


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        detail = f"no such path: {request.url.path}"
    elif exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        detail = f"{request.method} is not allowed on {request.url.path} (allowed: {allowed})"
    else:
        detail = exc.detail
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    return _error(exc.status_code, code, detail, dict(exc.headers or {}))


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    # Starlette re-raises after this answer, and uvicorn logs the traceback
    return _error(500, "internal", "the service failed", None)


def server_config(
    app: Starlette,
    host: str,
    port: int,
    guard: ConnectionGuard | None = None,
    idle_timeout_s: float = 5,
    **extra: Any,
) -> uvicorn.Config:
    """uvicorn's settings for the API, the same for the service and the inline login.

    No lifespan, no uvicorn logging config (the process's own), no access log or
    ``Server`` header; ``guard`` bounds the time to send a request and the connections
    (:mod:`auth_service.connections`), ``idle_timeout_s`` a kept-alive connection's
    wait for its next request (uvicorn's ``timeout_keep_alive``); ``extra`` adds
    uvicorn options (a graceful-shutdown bound).
    """
    if guard is not None:
        extra["http"] = guard.protocol()
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        lifespan="off",
        log_config=None,
        access_log=False,
        server_header=False,
        # uvicorn rewrites nothing: the client address is resolved once, by the rule both
        # services share (Limits.client, chatlab.forwarded), believing X-Forwarded-For
        # from TRUSTED_PROXIES only; uvicorn's own would trust 127.0.0.1 by default
        proxy_headers=False,
        # uvicorn's Config types it int; it only passes it to loop.call_later
        timeout_keep_alive=idle_timeout_s,  # type: ignore[arg-type]
        **extra,
    )
