"""``python -m auth_service``: build Settings, then serve until SIGTERM/SIGINT; or rotate-key,
migrate-users, revoke-sessions, or wait for a service started in the background.

Exit status: 0 after a graceful stop, a rotation, a migration, a revocation or a wait
that saw the service answer, 2 for a bad setting (one line naming the variable, the value and what
is allowed: also a private key whose mode is looser than 0600, or an ``AUTH_DB_URL``
that cannot be reached at start), 1 for any other failure at start (such as a port in
use) or a wait that timed out.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import resource
import signal
import ssl
import sys
import time
import urllib.request
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn

from auth_service.app import build_api, create_app, server_config
from auth_service.backend import open_backend, open_database, sessions_only
from auth_service.connections import ConnectionGuard
from auth_service.errors import Unavailable
from auth_service.keys_postgres import rotate_keyring
from auth_service.passwords import Argon2Params, PasswordPool
from auth_service.settings import SettingError, Settings, settings_help
from auth_service.tokens import RETIRED_KEY_LEEWAY_S, KeyFiles, rotate_key
from auth_service.users import UserStore
from auth_service.users_postgres import PostgresUsers
from chatlab.log_redaction import redact_tokens_in_logs
from chatlab.loops import loop_factory
from chatlab.settings import add_env_file_option, warn_misspelt_environment
from chatlab.tls import MINIMUM_VERSION, client_context

log = logging.getLogger("auth_service")

#: seconds uvicorn waits for requests in progress after a stop signal
GRACEFUL_SHUTDOWN_S = 10
#: seconds ``wait`` waits for the service to answer (a start takes about one)
WAIT_S = 30
#: users copied per transaction by migrate-users
MIGRATE_BATCH = 500
#: descriptors kept for the process beside its connections (listening socket, log, the
#: hashing pool's pipes, SQLite; the PostgreSQL pool's AUTH_DB_POOL_MAX come on top)
OPEN_FILES_RESERVE = 64


def connections_that_fit(wanted: int, reserve: int) -> int:
    """``wanted`` (``AUTH_MAX_CONNECTIONS``), cut to the open-files limit less ``reserve``
    (the soft limit raised first as far as the hard one allows); a cut is logged."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted + reserve if hard == resource.RLIM_INFINITY else min(wanted + reserve, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    fits = max(1, soft - reserve)
    if fits < wanted:
        log.warning(
            "AUTH_MAX_CONNECTIONS=%d cut to %d: the open-files limit is %d (%d kept for the "
            "process)",
            wanted,
            fits,
            soft,
            reserve,
        )
    return min(wanted, fits)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line: everything else is a setting (see the epilog)."""
    parser = argparse.ArgumentParser(
        prog="python -m auth_service",
        description="chatlab's auth service: users, argon2id passwords, EdDSA JWTs "
        "(contract: docs/protocol.md).",
        epilog=settings_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "command",
        nargs="?",
        choices=("serve", "rotate-key", "migrate-users", "revoke-sessions", "wait"),
        default="serve",
        help="serve (default); rotate-key: make a new signing key, keep serving the old "
        "public key in the JWK set until its tokens have expired (with AUTH_DB_URL the new "
        "key signs AUTH_KEY_ACTIVATION_S later, on every replica); migrate-users: copy the "
        "users of the SQLite file AUTH_DB into the PostgreSQL of AUTH_DB_URL (names already "
        "there are kept; running it again copies nothing twice); revoke-sessions USERNAME: "
        "end every session (refresh token family) of that user, in any case, and print how "
        "many (access tokens already issued live on until they expire); wait: until the service "
        f"these settings describe answers GET /healthz (at most {WAIT_S} s; by then its "
        "keys are written, so a chat server started next finds JWT_PUBLIC_KEY)",
    )
    parser.add_argument(
        "username", nargs="?", help="with revoke-sessions: the user whose sessions end"
    )
    parser.add_argument(
        "--revoke",
        action="store_true",
        help="with rotate-key: a key has leaked; the new key signs at once and every older "
        "key leaves the JWK set now (their tokens stop opening chat; users log in again)",
    )
    add_env_file_option(parser)
    return parser.parse_args(argv)


class _StopSignals:
    """SIGTERM/SIGINT stop the server gracefully, whenever they come.

    uvicorn handles both while it serves; these handlers cover the time before
    (while the pool starts) and after (uvicorn raises the signal again on return,
    into the handler it found, which is this one), so a stop is always exit 0.
    """

    def __init__(self) -> None:
        self.requested = False
        self.server: uvicorn.Server | None = None
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def attach(self, server: uvicorn.Server) -> None:
        self.server = server
        server.should_exit = self.requested

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        if self.server is not None:
            self.server.should_exit = True


async def serve(settings: Settings) -> int:
    """Open the users and keys, start the hashing pool, serve until a stop signal, then close."""
    stop = _StopSignals()
    try:
        backend = await open_backend(settings)
    except SettingError as exc:
        print(f"auth_service: {exc}", file=sys.stderr)
        return 2
    backend.start_pruning()
    params = Argon2Params.from_settings(settings)
    passwords = PasswordPool(params, settings.hash_pool_size, settings.hash_queue_max)
    try:
        await passwords.start()
        api = build_api(settings, passwords, backend.users, backend.sessions, backend.keys)
        guard = ConnectionGuard(
            settings.header_timeout_s,
            settings.body_timeout_s,
            connections_that_fit(
                settings.max_connections, OPEN_FILES_RESERVE + settings.auth_db_pool_max
            ),
        )
        config = server_config(
            create_app(api, settings.cors_origins),
            settings.host,
            settings.port,
            guard,
            settings.idle_timeout_s,
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
            **tls_options(settings),
        )
        server = uvicorn.Server(config)
        stop.attach(server)
        log.info(
            "auth_service on %s://%s:%d %s kid=%s",
            "https" if settings.tls_cert_file else "http",
            settings.host,
            settings.port,
            settings.summary(),
            backend.signing_kid(),
        )
        await server.serve()
    finally:
        await passwords.close()
        await backend.close()
    log.info("auth_service stopped")
    return 0


def rotate(settings: Settings, revoke: bool = False) -> int:
    """``rotate-key``: a new signing key; say what the chat server needs to follow it."""
    if settings.auth_db_url:
        return asyncio.run(_rotate_in_database(settings, revoke))
    files = KeyFiles.from_settings(settings)
    try:
        keyring, old_kid = rotate_key(files, settings.token_ttl_s, revoke=revoke)
    except SettingError as exc:
        print(f"auth_service: {exc}", file=sys.stderr)
        return 2
    kept_s = settings.token_ttl_s + RETIRED_KEY_LEEWAY_S
    jwks_url = f"{'https' if settings.tls_cert_file else 'http'}://{settings.host}:{settings.port}/.well-known/jwks.json"
    kept = (
        "is revoked: it left the JWK set now"
        if revoke
        else f"stays in the JWK set for {kept_s} s, until its last tokens have expired"
    )
    print(
        f"new signing key {keyring.kid} in {files.private_key} (mode 0600) and "
        f"{files.public_key}; the old key {old_kid} {kept} (keyring: {files.keyring})"
    )
    print("a running auth service signs with the new key within a second")
    print(
        f"the chat server must take its keys from JWT_JWKS_URL={jwks_url} to accept "
        "tokens of both keys; with only JWT_PUBLIC_KEY it keeps trusting the old key only "
        "(the one it loaded at start) until it restarts, and then the new key only"
    )
    return 0


async def _rotate_in_database(settings: Settings, revoke: bool) -> int:
    """``rotate-key`` with ``AUTH_DB_URL``: a key in the shared keyring, signing later."""
    try:
        database = await open_database(settings)
    except SettingError as exc:
        print(f"auth_service: {exc}", file=sys.stderr)
        return 2
    try:
        new, old_kid = await rotate_keyring(
            database, settings.token_ttl_s, settings.auth_key_activation_s, revoke=revoke
        )
    except Unavailable as exc:
        print(f"auth_service: rotate-key: {exc.detail}; nothing changed", file=sys.stderr)
        return 1
    finally:
        await database.close()
    kept_s = settings.token_ttl_s + RETIRED_KEY_LEEWAY_S
    if revoke:
        print(
            f"new signing key {new.kid} signs now on every replica (within a second); every "
            f"older key, {old_kid} among them, left the keyring: their tokens stop opening "
            "chat as soon as each chat server refreshes its JWK set (JWKS_REFRESH_S)"
        )
        return 0
    active = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(new.active_at))
    print(
        f"new signing key {new.kid} is in every replica's JWK set within a second and signs "
        f"from {active} (in {settings.auth_key_activation_s} s, AUTH_KEY_ACTIVATION_S); "
        f"the key signing until then, {old_kid}, stays in the JWK set {kept_s} s longer, "
        f"until its last tokens have expired (keyring: {database.where()})"
    )
    print(
        "chat servers must take their keys from JWT_JWKS_URL (every replica's "
        "/.well-known/jwks.json) with JWKS_REFRESH_S under "
        f"{max(0, settings.auth_key_activation_s - 5)} s, so that each knows the new key "
        "before the first token it signs arrives"
    )
    return 0


def migrate_users(settings: Settings) -> int:
    """``migrate-users``: copy the SQLite file's users into PostgreSQL (idempotent)."""
    try:
        if not settings.auth_db_url:
            raise SettingError(
                "AUTH_DB_URL", "", "set it to the PostgreSQL that receives the users"
            )
        if not Path(settings.auth_db).is_file():
            raise SettingError("AUTH_DB", settings.auth_db, "no such SQLite file to copy from")
        return asyncio.run(_migrate_users(settings))
    except SettingError as exc:
        print(f"auth_service: {exc}", file=sys.stderr)
        return 2


async def _migrate_users(settings: Settings) -> int:
    source = await UserStore.open(settings.auth_db)
    try:
        users = await source.all()
    finally:
        await source.close()
    database = await open_database(settings)
    added, kept = 0, []
    try:
        target = PostgresUsers(database)
        for start in range(0, len(users), MIGRATE_BATCH):
            batch_added, batch_kept = await target.copy_in(users[start : start + MIGRATE_BATCH])
            added, kept = added + batch_added, kept + batch_kept
    except Unavailable as exc:
        print(
            f"auth_service: migrate-users: {exc.detail} after {added} users; run it again "
            "(it copies nothing twice)",
            file=sys.stderr,
        )
        return 1
    finally:
        await database.close()
    print(
        f"copied {added} of {len(users)} users from sqlite:{settings.auth_db} to {database.where()}"
    )
    if kept:
        shown = ", ".join(kept[:20]) + (" ..." if len(kept) > 20 else "")
        print(f"{len(kept)} names were already there and were left as they are: {shown}")
    return 0


def revoke_sessions(settings: Settings, username: str | None) -> int:
    """``revoke-sessions USERNAME``: revoke every live family of the user; print how many."""
    if not username:
        print("auth_service: revoke-sessions needs a USERNAME", file=sys.stderr)
        return 2
    try:
        revoked = asyncio.run(_revoke_sessions(settings, username))
    except SettingError as exc:
        print(f"auth_service: {exc}", file=sys.stderr)
        return 2
    except Unavailable as exc:
        print(f"auth_service: revoke-sessions: {exc.detail}; nothing changed", file=sys.stderr)
        return 1
    print(
        f"revoked {revoked} sessions of {username!r} in {settings.database()}: their refresh "
        "tokens are refused from now on; access tokens already issued stay valid until they "
        f"expire (at most TOKEN_TTL_S={settings.token_ttl_s} s)"
    )
    return 0


async def _revoke_sessions(settings: Settings, username: str) -> int:
    async with sessions_only(settings) as sessions:
        return await sessions.revoke_user(username, time.time())


def tls_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's options for HTTPS with ``TLS_CERT_FILE``/``TLS_KEY_FILE`` (none without):
    its own context from the pair, TLS 1.2 the oldest version spoken."""
    if not settings.tls_cert_file:
        return {}

    def at_least_tls12(
        config: uvicorn.Config, default: Callable[[], ssl.SSLContext]
    ) -> ssl.SSLContext:
        context = default()
        context.minimum_version = MINIMUM_VERSION
        return context

    return {
        "ssl_certfile": settings.tls_cert_file,
        "ssl_keyfile": settings.tls_key_file,
        "ssl_context_factory": at_least_tls12,
    }


def _own_certificate(cert_file: str) -> ssl.SSLContext:
    """A client context that trusts exactly the certificate the service serves (``wait``
    reaches it on loopback, whose address a certificate seldom names)."""
    context = client_context(cert_file)
    context.check_hostname = False
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return context


def wait(settings: Settings, timeout_s: float = WAIT_S) -> int:
    """``wait``: 0 once the service at ``AUTH_HOST:AUTH_PORT`` answers ``/healthz``, else 1.

    It answers only once its keys are written and its pool runs, so whatever is
    started after a wait finds both.
    """
    # a service listening on every address is reached on loopback
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(settings.host, settings.host)
    if ":" in host:
        host = f"[{host}]"
    scheme = "https" if settings.tls_cert_file else "http"
    url = f"{scheme}://{host}:{settings.port}/healthz"
    context = _own_certificate(settings.tls_cert_file) if settings.tls_cert_file else None
    deadline = time.monotonic() + timeout_s
    while True:
        with suppress(OSError), urllib.request.urlopen(url, timeout=1, context=context):
            print(f"auth service answering on {url}")
            return 0
        if time.monotonic() > deadline:
            print(
                f"auth_service wait: no answer from {url} in {timeout_s:g} s "
                "(not started, or it stopped: its log says why)",
                file=sys.stderr,
            )
            return 1
        time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = parse_args(argv)
    try:
        settings = Settings.load(env_file=args.env_file)
    except SettingError as exc:
        print(f"auth_service: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    redact_tokens_in_logs()  # uvicorn's access and error lines
    warn_misspelt_environment(log)
    if args.command == "rotate-key":
        return rotate(settings, revoke=args.revoke)
    if args.command == "migrate-users":
        return migrate_users(settings)
    if args.command == "revoke-sessions":
        return revoke_sessions(settings, args.username)
    if args.command == "wait":
        return wait(settings)
    with asyncio.Runner(loop_factory=loop_factory(settings.event_loop)) as runner:
        return runner.run(serve(settings))


if __name__ == "__main__":
    sys.exit(main())
