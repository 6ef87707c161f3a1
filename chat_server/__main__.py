"""``python -m chat_server``: build Settings, then serve until SIGTERM/SIGINT.

Exit status: 0 after a graceful stop, 2 for a bad setting (one line naming the
variable, the value and what is allowed), 1 for any other failure at start.

With ``WORKERS`` above 1 this process becomes the supervisor
(:mod:`chat_server.supervisor`), which starts the workers as ``python -m
chat_server`` again, marked by ``CHATLAB_WORKER``; the server's own modules are
imported only in the processes that serve. ``WORKERS=1`` serves in this process.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import sys
from typing import TYPE_CHECKING

from chat_server.limits import ConnectionLimit, usable_connections
from chat_server.settings import SettingError, Settings, redact_url, settings_help
from chat_server.supervisor import WorkerSeat
from chatlab.log_redaction import redact_tokens_in_logs
from chatlab.settings import add_env_file_option

if TYPE_CHECKING:
    from chat_server.auth import TokenVerifier

log = logging.getLogger("chat_server")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line: everything else is a setting (see the epilog)."""
    parser = argparse.ArgumentParser(
        prog="python -m chat_server",
        description="chatlab's websocket chat server (contract: docs/protocol.md).",
        epilog=settings_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--check", action="store_true", help="validate the settings and the key, then exit"
    )
    add_env_file_option(parser)
    return parser.parse_args(argv)


async def serve(
    settings: Settings,
    verifier: TokenVerifier,
    env_file: str | None = None,
    seat: WorkerSeat | None = None,
    limit: ConnectionLimit | None = None,
) -> int:
    """Run the server until a stop signal, then drain in the contract's order.

    As a worker (``seat`` given) it accepts on the supervisor's socket, reports
    ready once it serves, and stops if the supervisor disappears. With
    ``PROFILE=cprofile`` it profiles itself from before it listens to after the
    store closed (:mod:`chat_server.profiling`).
    """
    from chat_server.codecs import get_codec, protobuf_backend  # noqa: PLC0415
    from chat_server.errors import BrokerUnavailable, StoreError  # noqa: PLC0415
    from chat_server.metrics import (  # noqa: PLC0415
        ChatCollector,
        MetricsPublisher,
        MetricsServer,
    )
    from chat_server.regressions import Regression, load_inline_login  # noqa: PLC0415
    from chat_server.runtime import (  # noqa: PLC0415
        on_snapshot_signal,
        on_stop_signals,
        watch_parent,
    )
    from chat_server.tail import start_tail  # noqa: PLC0415
    from chat_server.transport import transport_for  # noqa: PLC0415
    from chat_server.transport.base import CLOSE_GOING_AWAY  # noqa: PLC0415
    from chat_server.wiring import build_service  # noqa: PLC0415

    try:
        transport_class = transport_for(settings)
    except SettingError as exc:
        print(f"chat_server: {exc}", file=sys.stderr)
        return 2
    worker_index = None if seat is None else seat.index
    profiler = None
    if settings.profile == "cprofile":
        from chat_server.profiling import ServerProfiler  # noqa: PLC0415

        try:
            profiler = ServerProfiler.create(settings, worker_index)
        except SettingError as exc:
            print(f"chat_server: {exc}", file=sys.stderr)
            return 2
    codec = get_codec(settings.serializer)
    regression = Regression.of(settings)
    service = build_service(
        settings,
        codec,
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
        print(f"chat_server: bad setting {name}={value!r}: {exc}", file=sys.stderr)
        return 2
    # the inline login listens before /healthz answers, so a ready server is all ready
    inline_login = None
    if regression.inline_login:
        inline_login = load_inline_login(settings, env_file)
        try:
            await inline_login.start()
        except (SettingError, OSError) as exc:
            print(f"chat_server: REGRESSION=auth_inline: {exc}", file=sys.stderr)
            await service.close()
            return 2 if isinstance(exc, SettingError) else 1
    # before /healthz answers, so that a SIGUSR1 sent once it does never kills the server
    if profiler is not None:
        profiler.start()
        on_snapshot_signal(profiler.request_snapshot)
    else:
        on_snapshot_signal(lambda: log.warning("SIGUSR1: no profile snapshot, PROFILE is off"))
    listen_socket = None if seat is None else seat.listening_socket()
    transport = transport_class(settings, service, verifier, codec, listen_socket)
    if seat is not None:
        transport.admission.unready = seat.ready_board().unready
    metrics: MetricsServer | MetricsPublisher | None = None
    if settings.metrics_port and seat is None:
        metrics = MetricsServer(
            settings.host,
            settings.metrics_port,
            ChatCollector(transport.metrics_snapshot, service.counters),
        )
    elif settings.metrics_port:  # the supervisor serves the port, with what workers publish
        metrics = MetricsPublisher(
            transport.metrics_snapshot, service.counters, settings.store_batch_max
        )
    try:
        if metrics is not None:
            await metrics.start()
        await transport.start()
    except OSError as exc:
        print(
            f"chat_server: cannot listen on {settings.host}:{settings.port}: {exc.strerror}",
            file=sys.stderr,
        )
        if inline_login is not None:
            await inline_login.stop()
        if metrics is not None:
            await metrics.close()
        await service.close()
        return 1
    counters = service.counters
    stop = asyncio.Event()
    on_stop_signals(stop.set)
    watcher = None if seat is None else watch_parent(seat.supervisor_pid, stop.set)
    jwks_refresh = verifier.start_refresh()
    backend = f" ({protobuf_backend()} backend)" if settings.serializer == "protobuf" else ""
    log.info(
        "chat_server listening on ws://%s:%d/ws %s%s",
        settings.host,
        transport.port,
        settings.summary(),
        backend,
    )
    _log_connection_limit(limit)
    if regression.name != "off":
        log.warning(
            "REGRESSION=%s is ON: this server makes a deliberate mistake for the lab; "
            "never use it for real traffic",
            regression.name,
        )
    # after the line naming the toggles, which the README promises comes first
    start_tail(
        counters.gc,
        counters.loop_lag,
        lambda: counters.frames_in,
        settings.gc_policy,
        settings.gc_full_interval_s,
    )
    if seat is not None:
        seat.report_ready()
    await stop.wait()
    if watcher is not None:
        watcher.cancel()
    log.info("stop signal: refusing sends, committing, then closing with 1001")
    transport.stop_accepting()
    if inline_login is not None:
        await inline_login.stop()
    await service.drain()
    # clients in mid-burst learn, through `unavailable`, which sends were not accepted
    await asyncio.sleep(settings.drain_grace_s)
    await service.drain()
    await transport.close_all(CLOSE_GOING_AWAY, "server shutting down")
    await service.close()
    if metrics is not None:
        await metrics.close()
    if jwks_refresh is not None:
        jwks_refresh.cancel()
    if profiler is not None:
        await profiler.stop()
    counters.loop_lag.stop()
    counters.gc.uninstall()
    log.info("chat_server stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = parse_args(argv)
    try:
        settings = Settings.load(env_file=args.env_file)
    except SettingError as exc:
        print(f"chat_server: {exc}", file=sys.stderr)
        return 2
    seat = WorkerSeat.decode(settings.worker_seat)
    if settings.workers > 1 and seat is None and not args.check:
        from chat_server.supervisor import Supervisor  # noqa: PLC0415

        _configure_logging(settings, seat)
        return Supervisor(settings, args.env_file).run()
    from chat_server.auth import load_verifier  # noqa: PLC0415
    from chat_server.runtime import pin_cpus, raise_open_files_limit  # noqa: PLC0415
    from chatlab.loops import loop_factory  # noqa: PLC0415

    try:
        verifier = load_verifier(settings)
    except SettingError as exc:
        print(f"chat_server: {exc}", file=sys.stderr)
        return 2
    _configure_logging(settings, seat)
    if args.check:
        print(f"settings ok: {settings.summary()}")
        return 0
    pin_cpus(settings.cpu_affinity)
    settings, limit = _admit_what_fits(settings, raise_open_files_limit(settings.max_connections))
    with asyncio.Runner(loop_factory=loop_factory(settings.event_loop)) as runner:
        return runner.run(serve(settings, verifier, args.env_file, seat, limit))


def _admit_what_fits(settings: Settings, open_files: int) -> tuple[Settings, ConnectionLimit]:
    """``settings`` with ``max_connections`` cut to what the open-files limit allows, and
    which limit rules (logged once the server listens: a start that fails says one line)."""
    limit = usable_connections(settings.max_connections, open_files)
    if limit.connections < settings.max_connections:
        return dataclasses.replace(settings, max_connections=limit.connections), limit
    return settings, limit


def _log_connection_limit(limit: ConnectionLimit | None) -> None:
    if limit is None:
        return
    level = logging.WARNING if limit.by_open_files else logging.INFO
    log.log(level, "connections: at most %d, set by %s", limit.connections, limit.ruled_by)


def _configure_logging(settings: Settings, seat: WorkerSeat | None) -> None:
    """Log to stderr at ``LOG_LEVEL``; a worker's lines name its index and pid."""
    who = "%(name)s" if seat is None else f"w{seat.index}[%(process)d] %(name)s"
    logging.basicConfig(
        level=settings.log_level.upper(),
        format=f"%(asctime)s %(levelname)s {who}: %(message)s",
        stream=sys.stderr,
    )
    redact_tokens_in_logs()
    if settings.log_level != "debug":
        # one line per connection from the websocket library is noise under load
        for library in ("websockets", "picows"):
            logging.getLogger(f"chat_server.transport.{library}").setLevel(logging.WARNING)


if __name__ == "__main__":
    sys.exit(main())
