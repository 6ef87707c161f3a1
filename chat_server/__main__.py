"""``python -m chat_server``: build Settings, then serve until SIGTERM/SIGINT.

Exit status: 0 after a graceful stop, 2 for a bad setting (one line naming the
variable, the value and what is allowed), 1 for any other failure at start.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from chat_server.auth import TokenVerifier, load_verifier
from chat_server.codecs import get_codec, protobuf_backend
from chat_server.errors import StoreError
from chat_server.runtime import loop_factory, on_stop_signals, pin_cpus, raise_open_files_limit
from chat_server.service import ChatService
from chat_server.settings import SettingError, Settings, settings_help
from chat_server.transport.websockets import CLOSE_GOING_AWAY, WebsocketsTransport

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
    parser.add_argument("--env-file", default=".env", help="settings file (default: .env)")
    return parser.parse_args(argv)


async def serve(settings: Settings, verifier: TokenVerifier, env_file: str | None = None) -> int:
    """Run the server until a stop signal, then drain in the contract's order."""
    codec = get_codec(settings.serializer)
    service = ChatService(settings, codec)
    try:
        await service.start()
    except StoreError as exc:
        print(f"chat_server: bad setting CHAT_DB={settings.chat_db!r}: {exc}", file=sys.stderr)
        return 2
    # the inline login listens before /healthz answers, so a ready server is all ready
    inline_login = None
    if settings.regression == "auth_inline":
        from chat_server.inline_auth import InlineLogin  # noqa: PLC0415 (imports argon2)

        inline_login = InlineLogin(settings, env_file)
        try:
            await inline_login.start()
        except (SettingError, OSError) as exc:
            print(f"chat_server: REGRESSION=auth_inline: {exc}", file=sys.stderr)
            await service.close()
            return 2 if isinstance(exc, SettingError) else 1
    transport = WebsocketsTransport(settings, service, verifier, codec)
    try:
        await transport.start()
    except OSError as exc:
        print(
            f"chat_server: cannot listen on {settings.host}:{settings.port}: {exc.strerror}",
            file=sys.stderr,
        )
        if inline_login is not None:
            await inline_login.stop()
        await service.close()
        return 1
    stop = asyncio.Event()
    on_stop_signals(stop.set)
    jwks_refresh = verifier.start_refresh()
    backend = f" ({protobuf_backend()} backend)" if settings.serializer == "protobuf" else ""
    log.info(
        "chat_server listening on ws://%s:%d/ws %s%s",
        settings.host,
        transport.port,
        settings.summary(),
        backend,
    )
    if settings.regression != "off":
        log.warning(
            "REGRESSION=%s is ON: this server makes a deliberate mistake for the lab; "
            "never use it for real traffic",
            settings.regression,
        )
    await stop.wait()
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
    if jwks_refresh is not None:
        jwks_refresh.cancel()
    log.info("chat_server stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = parse_args(argv)
    try:
        settings = Settings.load(dotenv_path=args.env_file)
        verifier = load_verifier(settings)
    except SettingError as exc:
        print(f"chat_server: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if settings.log_level != "debug":
        logging.getLogger("chat_server.transport.websockets").setLevel(logging.WARNING)
    if args.check:
        print(f"settings ok: {settings.summary()}")
        return 0
    pin_cpus(settings.cpu_affinity)
    raise_open_files_limit(settings.max_connections)
    with asyncio.Runner(loop_factory=loop_factory(settings.event_loop)) as runner:
        return runner.run(serve(settings, verifier, args.env_file))


if __name__ == "__main__":
    sys.exit(main())
