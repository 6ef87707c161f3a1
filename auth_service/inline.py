"""The chat server's REGRESSION=auth_inline: ``POST /login`` served on the chat server's loop.

The deliberate mistake the lab measures (the seed report's starting point; the seed
report is the report this project started from, whose server measured 6,500 → 18,000
messages/s on its own machine at p90/p95/p99 481/570/768 ms, see ``README.md``): a
second listener on ``AUTH_INLINE_PORT`` in the chat server's process and event
loop, verifying passwords with argon2 inline against the auth service's user
database and signing tokens with the auth service's key, so every login stalls
every chat connection for the length of an argon2 verification. Users are
registered through the auth service first; its settings (``AUTH_DB`` or
``AUTH_DB_URL``, ``JWT_PRIVATE_KEY``, argon2 parameters, rate limits) are read from the same
``.env`` and environment. The chat server imports this module by name
(:func:`chat_server.regressions.load_inline_login`) only in this mode; it imports
nothing of the chat server, so neither package imports the other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

import uvicorn

from auth_service.app import build_api, create_app, server_config
from auth_service.backend import Backend, open_backend
from auth_service.passwords import Argon2Params, InlinePasswords
from auth_service.settings import Settings as AuthSettings
from chatlab.supervision import supervisor

log = logging.getLogger("chat_server.inline_login")


class _EmbeddedServer(uvicorn.Server):
    """uvicorn sharing the chat server's loop: the chat server owns the signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class InlineLogin:
    """The second listener; :meth:`start` it on the running loop, :meth:`stop` it at shutdown."""

    def __init__(self, host: str, port: int, env_file: str | None) -> None:
        self.host = host
        self.port = port
        self.env_file = env_file
        self._server: _EmbeddedServer | None = None
        self._task: asyncio.Task[None] | None = None
        self._backend: Backend | None = None

    async def start(self) -> None:
        """Open the auth service's users and keys, then listen.

        Raises SettingError (naming the auth setting) when they are not there, and
        OSError when the port cannot be bound.
        """
        auth = AuthSettings.load(env_file=self.env_file)
        # the users and keys the auth service made (its files, or its PostgreSQL)
        self._backend = await open_backend(auth, create_keys=False)
        passwords = InlinePasswords(Argon2Params.from_settings(auth))
        await passwords.start()
        api = build_api(
            auth, passwords, self._backend.users, self._backend.sessions, self._backend.keys
        )
        config = server_config(create_app(api), self.host, self.port)
        self._server = _EmbeddedServer(config)
        # REPORT: this server ends with the chat server; a failure is logged and counted
        self._task = supervisor().spawn(self._server.serve(), "auth-inline")
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it
                raise OSError(f"cannot listen on port {self.port}")
            await asyncio.sleep(0.01)
        log.warning(
            "REGRESSION=auth_inline: POST /login on http://%s:%d hashes with argon2 on the "
            "chat server's event loop",
            self.host,
            self.port,
        )

    async def stop(self) -> None:
        """Stop listening and close the user database."""
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await self._task
        if self._backend is not None:
            await self._backend.close()
