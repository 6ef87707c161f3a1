"""One serving process: :meth:`Server.startup`, :meth:`Server.main_loop`, :meth:`Server.shutdown`.

Each resource registers its undo on an :class:`~contextlib.AsyncExitStack` the
moment it is acquired, so whatever start-up got to is released in reverse order,
on a failed start as after a graceful stop: the profiler's last snapshot comes
after the history store closed, which comes after the connections closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable
from contextlib import AsyncExitStack

from chat_server.auth import TokenVerifier
from chat_server.codecs import get_codec, protobuf_backend
from chat_server.core.idempotency import RecentSends
from chat_server.errors import BrokerUnavailable, StoreError
from chat_server.limits import ConnectionLimit
from chat_server.metrics import ChatCollector, MetricsPublisher, MetricsServer
from chat_server.profiling import ServerProfiler
from chat_server.regressions import Regression, load_inline_login
from chat_server.runtime import on_snapshot_signal, on_stop_signals, watch_parent
from chat_server.service import ChatService
from chat_server.settings import SettingError, Settings, redact_url
from chat_server.supervisor import WorkerSeat
from chat_server.tail import start_tail
from chat_server.transport import transport_for
from chat_server.transport.base import CLOSE_GOING_AWAY, ServerTransport
from chat_server.wiring import build_service
from chatlab.supervision import supervisor

log = logging.getLogger("chat_server")

#: seconds past DRAIN_NOTICE_S + DRAIN_GRACE_S + CLOSE_TIMEOUT_S that a stop after a
#: failed task may take
FAILED_STOP_GRACE_S = 10.0


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[int], None], arg: int) -> None:
    """``callback(arg)`` on ``loop`` from any thread (nothing once the loop is closed)."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback, arg)


class StartFailed(Exception):
    """Start-up could not finish: ``message`` is the one line to print, ``status`` the
    exit status (2 for a setting, 1 for anything else)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class Server:
    """Serve ``settings`` until a stop signal, then shut down in the contract's order.

    As a worker (``seat`` given) it accepts on the supervisor's socket, reports
    ready once it serves, and stops if the supervisor disappears. With
    ``PROFILE=cprofile`` it profiles itself from before it listens to after the
    store closed (:mod:`chat_server.profiling`). ``limit`` is what ruled
    ``MAX_CONNECTIONS`` (logged once it listens).
    """

    def __init__(
        self,
        settings: Settings,
        verifier: TokenVerifier,
        *,
        env_file: str | None = None,
        seat: WorkerSeat | None = None,
        limit: ConnectionLimit | None = None,
    ) -> None:
        self.settings = settings
        self.verifier = verifier
        self.env_file = env_file
        self.seat = seat
        self.limit = limit
        self.regression = Regression.of(settings)
        self.stop = asyncio.Event()
        #: 0, or the status a failed Stop-policy task asked for (chatlab.supervision)
        self.exit_status = 0

    async def run(self) -> int:
        """Start, serve until stopped, shut down; the exit status."""
        loop = asyncio.get_running_loop()
        supervisor().on_fatal(lambda status: _call_soon(loop, self._stop_failed, status))
        try:
            async with AsyncExitStack() as stack:
                try:
                    transport, service = await self.startup(stack)
                except StartFailed as exc:
                    print(f"chat_server: {exc}", file=sys.stderr)
                    return exc.status
                await self.main_loop()
                await self.shutdown(transport, service)
        finally:
            supervisor().on_fatal(None)
        if self.exit_status:
            log.error("chat_server stopped: a task it cannot run without failed (see above)")
        else:
            log.info("chat_server stopped")
        return self.exit_status

    def _stop_failed(self, status: int) -> None:
        """Stop as on SIGTERM because work the process needs failed, and exit ``status``;
        a stop that hangs (the failed work held what it waits for) ends by exiting
        ``status`` at once :data:`FAILED_STOP_GRACE_S` past the drain's own bounds."""
        self.exit_status = status
        self.stop.set()
        settings = self.settings
        bound_s = (
            settings.drain_notice_s
            + settings.drain_grace_s
            + settings.close_timeout_s
            + FAILED_STOP_GRACE_S
        )
        timer = threading.Timer(bound_s, os._exit, args=(status,))
        timer.daemon = True
        timer.start()

    async def startup(self, stack: AsyncExitStack) -> tuple[ServerTransport, ChatService]:
        """Open the service and listen; each step's undo goes on ``stack``.

        Raises :class:`StartFailed` naming the setting (status 2) or the failure (1).
        """
        settings, seat = self.settings, self.seat
        try:
            transport_class = transport_for(settings)
        except SettingError as exc:
            raise StartFailed(str(exc), 2) from exc
        worker_index = None if seat is None else seat.index
        profiler = None
        if settings.profile == "cprofile":
            try:
                profiler = ServerProfiler.create(settings, worker_index)
            except SettingError as exc:
                raise StartFailed(str(exc), 2) from exc
            # the last snapshot comes after the store closed: its undo runs last
            stack.push_async_callback(profiler.stop)
        codec = get_codec(settings.serializer)
        service = build_service(
            settings,
            codec,
            self.regression,
            worker_index=worker_index,
            writer_hook=None if profiler is None else profiler.writer_hook,
        )
        try:
            await service.start()
        except (StoreError, BrokerUnavailable) as exc:
            name, value = (
                ("REDIS_URL", redact_url(settings.redis_url))
                if settings.broker == "redis"
                else ("CHAT_DB", settings.chat_db)
            )
            raise StartFailed(f"bad setting {name}={value!r}: {exc}", 2) from exc
        stack.push_async_callback(service.close)
        # the inline login listens before /healthz answers, so a ready server is all ready
        if self.regression.inline_login:
            inline_login = load_inline_login(settings, self.env_file)
            try:
                await inline_login.start()
            except (SettingError, OSError) as exc:
                status = 2 if isinstance(exc, SettingError) else 1
                raise StartFailed(f"REGRESSION=auth_inline: {exc}", status) from exc
            stack.push_async_callback(inline_login.stop)
        # before /healthz answers, so that a SIGUSR1 sent once it does never kills the server
        if profiler is not None:
            profiler.start()
            on_snapshot_signal(profiler.request_snapshot)
        else:
            on_snapshot_signal(lambda: log.warning("SIGUSR1: no profile snapshot, PROFILE is off"))
        listen_socket = None if seat is None else seat.listening_socket()
        transport = transport_class(settings, service, self.verifier, codec, listen_socket)
        if seat is not None:
            transport.admission.unready = seat.ready_board().unready
        metrics: MetricsServer | MetricsPublisher | None = None
        if settings.metrics_port and seat is None:
            metrics = MetricsServer(
                settings.host,
                settings.metrics_port,
                ChatCollector(transport.metrics_snapshot, service.counters, self.verifier.jwks),
            )
        elif settings.metrics_port:  # the supervisor serves the port, with what workers publish
            metrics = MetricsPublisher(
                transport.metrics_snapshot,
                service.counters,
                settings.store_batch_max,
                jwks=self.verifier.jwks,
            )
        try:
            if metrics is not None:
                await metrics.start()
                stack.push_async_callback(metrics.close)
            await transport.start()
        except OSError as exc:
            where = f"{settings.host}:{settings.port}"
            raise StartFailed(f"cannot listen on {where}: {exc.strerror}", 1) from exc
        stack.push_async_callback(transport.close_all, CLOSE_GOING_AWAY, "server shutting down")
        on_stop_signals(self.stop.set)
        if seat is not None:
            watcher = watch_parent(seat.supervisor_pid, self.stop.set)
            stack.callback(watcher.cancel)
        jwks_refresh = self.verifier.start_refresh()
        if jwks_refresh is not None:
            stack.callback(jwks_refresh.cancel)
        self._log_listening(transport.port, service.recent_sends)
        # after the line naming the toggles, which the README promises comes first
        counters = service.counters
        start_tail(
            counters.gc,
            counters.loop_lag,
            lambda: counters.frames_in,
            settings.gc_policy,
            settings.gc_full_interval_s,
        )
        # after the quiet collector's listener: a full collection it runs at a tick counts
        # in the next tick's lag (one late tick, which never sheds), not as time the loop
        # was held since this one (which would refuse the sends handled after it)
        counters.loop_lag.listeners.append(counters.overload.observe)
        stack.callback(counters.gc.uninstall)
        stack.callback(counters.loop_lag.stop)
        return transport, service

    async def main_loop(self) -> None:
        """Tell the supervisor this worker is ready, then serve until a stop signal."""
        if self.seat is not None:
            self.seat.report_ready()
        await self.stop.wait()

    async def shutdown(self, transport: ServerTransport, service: ChatService) -> None:
        """Answer ``/healthz`` 503 for ``DRAIN_NOTICE_S`` while still serving, then stop
        accepting, commit and deliver what was accepted, keep the connections open
        ``DRAIN_GRACE_S`` more; the start-up stack then closes them with 1001 and releases
        the rest."""
        transport.announce_stop()
        if self.settings.drain_notice_s:
            log.info(
                "stop signal: /healthz answers 503 for %g s before the listener closes",
                self.settings.drain_notice_s,
            )
            # a proxy checking /healthz takes this process out before connections are refused
            await asyncio.sleep(self.settings.drain_notice_s)
        log.info("stop signal: refusing sends, committing, then closing with 1001")
        transport.stop_accepting()
        await service.drain()
        # sends still arriving are answered `unavailable`, so clients in mid-burst learn
        # which of theirs were not accepted before their connection closes
        await asyncio.sleep(self.settings.drain_grace_s)

    def _log_listening(self, port: int, remembered: RecentSends) -> None:
        """The line naming the toggles (the first the README promises), then what ruled the
        connection limit, the sends with a ref remembered from the store, a regression's
        warning."""
        settings = self.settings
        backend = f" ({protobuf_backend()} backend)" if settings.serializer == "protobuf" else ""
        log.info(
            "chat_server listening on %s://%s:%d/ws %s%s",
            "wss" if settings.tls_cert_file else "ws",
            settings.host,
            port,
            settings.summary(),
            backend,
        )
        if self.limit is not None:
            level = logging.WARNING if self.limit.by_open_files else logging.INFO
            log.log(
                level,
                "connections: at most %d, set by %s",
                self.limit.connections,
                self.limit.ruled_by,
            )
        if remembered:
            log.info(
                "remembering %d sends with a ref from the last %d ms",
                len(remembered),
                remembered.window_ms,
            )
        if self.regression.name != "off":
            log.warning(
                "REGRESSION=%s is ON: this server makes a deliberate mistake for the lab; "
                "never use it for real traffic",
                self.regression.name,
            )
