"""The auth service's ``/register``, ``/login`` and ``/refresh`` for the load test, over one
or more replicas.

Nothing here imports Locust (see :mod:`loadtest.client`).
"""

from __future__ import annotations

import itertools
import json
import random
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jwt

from chatlab.tls import shared_client_context
from loadtest.client import LOGIN, REFRESH, REGISTER, RETRIED_STATUSES, AuthError

#: where the next call starts in the list of replicas: shared by every client of this
#: process (a Locust user makes its own), so calls go round robin; a random start, so
#: that processes do not all begin at the first
_NEXT_REPLICA = itertools.count(random.randrange(1 << 16))


#: a grant is refreshed once this share of its access token's life has passed (the page
#: refreshes at the same point): early enough that a refresh refused 429/503 and retried
#: after its ``Retry-After`` still lands before the token expires
REFRESH_AT_SHARE = 0.8


@dataclass(frozen=True)
class Grant:
    """An access token, when it expires and when to refresh it (wall clock, ``time.time()``),
    and the refresh token that renews it (None: none, as for a token from a file).

    Plain values only, so that the Locust master can send it to its workers as a dict.
    """

    access_token: str
    expires_at: float | None = None
    refresh_at: float | None = None
    refresh_token: str | None = None

    @classmethod
    def from_reply(cls, body: dict[str, Any], now: float | None = None) -> Grant:
        """The grant a ``/login`` or ``/refresh`` answer (``200``) carries; AuthError when it
        carries no access token."""
        token = body.get("access_token")
        if not isinstance(token, str):
            raise AuthError(200, "no access_token in the reply")
        now = time.time() if now is None else now
        life_s = body.get("expires_in")
        refresh = body.get("refresh_token")
        if not isinstance(life_s, int | float):
            return cls.from_token(token, refresh if isinstance(refresh, str) else None)
        return cls(
            token,
            now + life_s,
            now + REFRESH_AT_SHARE * life_s,
            refresh if isinstance(refresh, str) else None,
        )

    @classmethod
    def from_token(cls, token: str, refresh_token: str | None = None) -> Grant:
        """A grant for a bare access token (``--token-file``): its expiry read from the JWT's
        ``exp`` claim, unverified (the chat server verifies it); None when it has none."""
        try:
            claims = jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError:
            return cls(token, None, None, refresh_token)
        exp, iat = claims.get("exp"), claims.get("iat")
        if not isinstance(exp, int | float):
            return cls(token, None, None, refresh_token)
        life_s = exp - iat if isinstance(iat, int | float) and iat < exp else 0.0
        return cls(token, float(exp), exp - (1 - REFRESH_AT_SHARE) * life_s, refresh_token)

    def refresh_due(self, now: float | None = None) -> bool:
        """True when this grant can be refreshed and its time to do so has come."""
        if self.refresh_token is None or self.refresh_at is None:
            return False
        return (time.time() if now is None else now) >= self.refresh_at


def auth_urls(text: str | Sequence[str]) -> tuple[str, ...]:
    """The replicas' base URLs from ``--auth-url`` (comma-separated) or a list."""
    parts = text.split(",") if isinstance(text, str) else text
    urls = tuple(part.strip().rstrip("/") for part in parts if part.strip())
    if not urls:
        raise ValueError("no auth service URL")
    return urls


class AuthClient:
    """The auth service's ``/register``, ``/login`` and ``/refresh`` (JSON over HTTP), with
    bounded retries.

    ``base_urls`` names one replica or several (comma-separated, or a list). Calls go
    round robin over them; a replica that refuses the connection, drops it or answers
    503 is left for the next one at once, each replica once per attempt. When every
    replica answered 429 or 503, the call is retried after the last ``Retry-After`` and
    up to half as long again (so that callers refused together do not all come back
    together; at most ``max_wait_s``), up to ``max_attempts`` times; when none could be
    reached, it fails at once. ``on_request(name, elapsed_ms, error)`` sees every call's
    end: a success (``error`` None, also for the expected 409 of a taken name) or the
    refusal that is given up on. An answer passed over (a 429 or 503 retried, a replica
    passed for the next) is no failure of the call: ``on_retry(name, status)`` counts it
    apart (``status`` 0: no answer), so a call that then succeeds leaves no failure behind.
    An ``https://`` replica's certificate is verified against ``ca_file`` (PEM CA
    certificates; empty: the system's CAs).
    """

    def __init__(
        self,
        base_urls: str | Sequence[str],
        *,
        timeout_s: float = 30.0,
        max_attempts: int = 5,
        max_wait_s: float = 10.0,
        on_request: Callable[[str, float, Exception | None], None] | None = None,
        on_retry: Callable[[str, int], None] | None = None,
        ca_file: str = "",
    ) -> None:
        self.urls = auth_urls(base_urls)
        #: verifies an https:// replica's certificate: against ``ca_file``, or the system's
        #: CAs; None without one (plain http)
        https = any(u.startswith("https://") for u in self.urls)
        self.ssl_context = shared_client_context(ca_file) if https else None
        self.timeout_s = timeout_s
        self.max_attempts = max_attempts
        self.max_wait_s = max_wait_s
        self.on_request = on_request
        self.on_retry = on_retry

    def register(self, name: str, password: str) -> bool:
        """Register ``name``: True if created, False if it was taken; AuthError otherwise."""
        status, _ = self._call(REGISTER, "/register", _credentials(name, password), (201, 409))
        return status == 201

    def login(self, name: str, password: str, *, quiet_statuses: tuple[int, ...] = ()) -> Grant:
        """Log in (one argon2 verification at the service); the grant, AuthError if refused.

        A refusal whose status is in ``quiet_statuses`` is raised without being reported.
        """
        payload = _credentials(name, password)
        _, body = self._call(LOGIN, "/login", payload, (200,), quiet_statuses)
        return Grant.from_reply(body)

    def refresh(self, refresh_token: str) -> Grant:
        """Spend ``refresh_token`` at ``/refresh`` (body mode; no password, no argon2) for a
        new access token and its successor; AuthError if refused (401 ``invalid_token``:
        the session is gone, log in again).

        A retry presents the same token again: within the service's ``REFRESH_GRACE_S`` that
        answers the same successor, so an answer lost on the way costs no session.
        """
        payload = json.dumps({"refresh_token": refresh_token}).encode()
        _, body = self._call(REFRESH, "/refresh", payload, (200,))
        return Grant.from_reply(body)

    def token(self, name: str, password: str) -> Grant:
        """A grant for ``name``, registering it first if it is unknown (401 on first login).

        The 401 that reveals an unregistered name is not reported as a failure: it is
        how a user's first use is detected. A 401 after registering is.
        """
        try:
            return self.login(name, password, quiet_statuses=(401,))
        except AuthError as exc:
            if exc.status != 401:
                raise
        self.register(name, password)
        return self.login(name, password)

    def _call(
        self,
        name: str,
        path: str,
        payload: bytes,
        ok: tuple[int, ...],
        quiet_statuses: tuple[int, ...] = (),
    ) -> tuple[int, dict[str, Any]]:
        first = next(_NEXT_REPLICA)
        for attempt in range(1, self.max_attempts + 1):
            start = time.perf_counter()
            answer = self._ask_replicas(name, path, payload, first)
            if isinstance(answer, AuthError):  # none could be reached
                self._report(name, start, answer)
                raise answer
            status, body, retry_after = answer
            if status in ok:
                self._report(name, start, None)
                return status, body
            error = AuthError(
                status, str(body.get("error", "unexpected reply")), str(body.get("detail", ""))
            )
            if status in quiet_statuses:
                raise error
            if status in RETRIED_STATUSES and attempt < self.max_attempts:
                if self.on_retry is not None:
                    self.on_retry(name, status)
                jittered_s = _seconds(retry_after) * random.uniform(1.0, 1.5)
                time.sleep(min(jittered_s, self.max_wait_s))
                continue
            self._report(name, start, error)
            raise error
        raise AssertionError("unreachable")  # pragma: no cover

    def _ask_replicas(
        self, name: str, path: str, payload: bytes, first: int
    ) -> tuple[int, dict[str, Any], str | None] | AuthError:
        """One attempt: each replica in turn from ``first`` until one answers other than 503
        (or the last answers); an AuthError when none could be reached."""
        answer: tuple[int, dict[str, Any], str | None] | AuthError | None = None
        for offset in range(len(self.urls)):
            if answer is not None and self.on_retry is not None:
                self.on_retry(name, 0 if isinstance(answer, AuthError) else answer[0])
            url = self.urls[(first + offset) % len(self.urls)]
            answer = self._post(url + path, payload)
            if not isinstance(answer, AuthError) and answer[0] != 503:
                return answer
        assert answer is not None
        return answer

    def _post(self, url: str, payload: bytes) -> tuple[int, dict[str, Any], str | None] | AuthError:
        request = urllib.request.Request(
            url, data=payload, headers={"Content-Type": "application/json"}, method="POST"
        )
        retry_after: str | None = None
        try:
            with urllib.request.urlopen(
                request, timeout=self.timeout_s, context=self.ssl_context
            ) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
            retry_after = exc.headers.get("Retry-After")
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            return AuthError(None, f"auth service unreachable: {type(reason).__name__}")
        return status, _json_object(raw), retry_after

    def _report(self, name: str, start: float, error: Exception | None) -> None:
        if self.on_request is not None:
            self.on_request(name, (time.perf_counter() - start) * 1000, error)


def _credentials(name: str, password: str) -> bytes:
    return json.dumps({"username": name, "password": password}).encode()


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _seconds(retry_after: str | None) -> float:
    try:
        return max(float(retry_after or 1), 0.0)
    except ValueError:
        return 1.0
