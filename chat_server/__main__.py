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

from chat_server.limits import ConnectionLimit, usable_connections
from chat_server.runtime import pin_cpus, raise_open_files_limit
from chat_server.settings import SettingError, Settings, settings_help
from chat_server.supervisor import Supervisor, WorkerSeat
from chatlab.log_redaction import redact_tokens_in_logs
from chatlab.loops import loop_factory
from chatlab.settings import add_env_file_option, warn_misspelt_environment


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
        _configure_logging(settings, seat)
        return Supervisor(settings, args.env_file).run()
    # the plug-in point between supervisor and server: the supervisor never loads the
    # service, the codecs, the key or Redis (see chat_server.supervisor)
    from chat_server.auth import load_verifier  # noqa: PLC0415
    from chat_server.server import Server  # noqa: PLC0415

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
    server = Server(settings, verifier, env_file=args.env_file, seat=seat, limit=limit)
    with asyncio.Runner(loop_factory=loop_factory(settings.event_loop)) as runner:
        return runner.run(server.run())


def _admit_what_fits(settings: Settings, open_files: int) -> tuple[Settings, ConnectionLimit]:
    """``settings`` with ``max_connections`` cut to what the open-files limit allows, and
    which limit rules (logged once the server listens: a start that fails says one line)."""
    limit = usable_connections(settings.max_connections, open_files)
    if limit.connections < settings.max_connections:
        return dataclasses.replace(settings, max_connections=limit.connections), limit
    return settings, limit


def _configure_logging(settings: Settings, seat: WorkerSeat | None) -> None:
    """Log to stderr at ``LOG_LEVEL``; a worker's lines name its index and pid."""
    who = "%(name)s" if seat is None else f"w{seat.index}[%(process)d] %(name)s"
    logging.basicConfig(
        level=settings.log_level.upper(),
        format=f"%(asctime)s %(levelname)s {who}: %(message)s",
        stream=sys.stderr,
    )
    redact_tokens_in_logs()
    if seat is None:  # a worker's environment is its supervisor's: warned about once
        warn_misspelt_environment(logging.getLogger("chat_server"))
    if settings.log_level != "debug":
        # one line per connection from the websocket library is noise under load
        for library in ("websockets", "picows"):
            logging.getLogger(f"chat_server.transport.{library}").setLevel(logging.WARNING)


if __name__ == "__main__":
    sys.exit(main())
