"""The server's own accept loop, and the gate every accepted connection passes first.

A server from ``loop.create_server`` accepts as fast as connections come. At the
open-files limit ``accept()`` fails with EMFILE: asyncio logs a traceback on every
try, and uvloop (libuv) accepts and closes each pending connection to drain the
backlog, so those clients get no answer at all. :class:`Acceptor` accepts itself
instead, on a non-blocking listening socket watched with ``loop.add_reader``, and
only while :func:`~chat_server.limits.may_accept` says a descriptor stays free for
the connection and its answer; the rest wait in the listen backlog, answered (101,
or 503 past the admitted connections) as descriptors free up. Each accepted socket
goes, with its peer's address as ``accept()`` gave it, to the transport through
``loop.connect_accepted_socket``, public on both asyncio and uvloop; with
``TLS_CERT_FILE`` set it is given the server's ``ssl.SSLContext`` there, so the loop's
own SSL transport (asyncio's or uvloop's) carries the connection, and the TLS
handshake is bounded by what is left of :data:`HANDSHAKE_TIMEOUT_S` (a client that
never finishes it, or speaks plain text to the TLS port, is dropped). A socket in
its handshake is counted like any other accepted one (it holds its descriptor from
``accept()`` on).

:class:`MethodGate` is the first protocol of every connection: a ``GET`` goes on
to the transport's own protocol (which then owns the socket, so the gate is off
the per-frame path); any other method is answered 405 here, body or no body,
since neither library's handshake parser answers it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import resource
import socket
import ssl
import time
from collections.abc import Callable

from chat_server.limits import may_accept

log = logging.getLogger("chat_server.transport")

#: uvicorn's default backlog: a burst of connects waits here, not in SYN retries
LISTEN_BACKLOG = 2048
#: accepts per readiness callback, so that a burst does not hold the loop (asyncio
#: itself accepts up to its backlog, 100, per callback)
ACCEPT_BATCH = 64
#: while no descriptor is free, seconds between counts of the open ones
RECHECK_S = 0.05
#: at most one warning per this many seconds while the limit holds connections back
WARN_EVERY_S = 10.0
#: seconds a client has to send its request (websockets' own open_timeout)
HANDSHAKE_TIMEOUT_S = 10.0
#: errors of accept() that mean "no descriptor or memory now" (after any error the accept
#: loop waits RECHECK_S, then tries again)
_OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
_FD_DIR = "/proc/self/fd"

#: builds a connection's protocol given its peer's address (the IP, as ``accept()`` gives it)
PeerProtocolFactory = Callable[[str], asyncio.BaseProtocol]


def listening_socket(host: str, port: int, backlog: int = LISTEN_BACKLOG) -> socket.socket:
    """A non-blocking TCP socket listening on the first address ``host`` resolves to."""
    family, _, _, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def count_open_descriptors() -> int:
    """The file descriptors this process has open (0 where the system does not say).

    Linux 6.2 and later give the count as the size of ``/proc/self/fd``; before, it
    is listed (the listing's own descriptor left out).
    """
    try:
        size = os.stat(_FD_DIR).st_size
        return size if size else len(os.listdir(_FD_DIR)) - 1
    except OSError:
        return 0


class Acceptor:
    """Accepts connections on ``sock`` while descriptors remain, each into the protocol
    ``factory`` builds for its peer's address.

    Open descriptors are counted from ``/proc`` only when the running estimate
    (the last count plus the sockets accepted since) says the limit is near, so
    accepting costs one ``accept()`` and a task that sets the connection up.
    """

    def __init__(
        self,
        sock: socket.socket,
        factory: PeerProtocolFactory,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.sock = sock
        self._factory = factory
        self._ssl = ssl_context
        self._fd = sock.fileno()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._open_files = 0
        self._open_estimate = 0
        self._reading = False
        self._closed = False
        self._recheck: asyncio.TimerHandle | None = None
        self._setting_up: set[asyncio.Task[None]] = set()
        self._next_warning = 0.0

    def start(self) -> None:
        """Accept from now on (the open-files limit is read now, after start-up raised it)."""
        self._loop = asyncio.get_running_loop()
        self._open_files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.sock.setblocking(False)
        self._open_estimate = count_open_descriptors()
        self._watch()

    def close(self) -> None:
        """Stop accepting and close the listening socket; accepted connections stay."""
        if self._closed:
            return
        self._closed = True
        self._unwatch()
        if self._recheck is not None:
            self._recheck.cancel()
        self.sock.close()

    def _watch(self) -> None:
        if not self._reading and not self._closed:
            assert self._loop is not None
            self._loop.add_reader(self._fd, self._accept_ready)
            self._reading = True

    def _unwatch(self) -> None:
        if self._reading:
            assert self._loop is not None
            self._loop.remove_reader(self._fd)
            self._reading = False

    def _room(self) -> bool:
        if may_accept(self._open_estimate, self._open_files):
            return True
        self._open_estimate = count_open_descriptors()
        return may_accept(self._open_estimate, self._open_files)

    def _accept_ready(self) -> None:
        loop = self._loop
        assert loop is not None
        for _ in range(ACCEPT_BATCH):
            if not self._room():
                self._hold("the open-files limit is near")
                return
            try:
                conn, address = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue  # the client gave up while it waited in the backlog
            except OSError as exc:
                if exc.errno in _OUT_OF_RESOURCES:
                    # another thread opened files since the count: count again before the next
                    self._open_estimate = self._open_files
                # one warning, not a traceback per connection waiting
                self._hold(f"accept() failed: {exc.strerror}")
                return
            self._open_estimate += 1
            conn.setblocking(False)
            with contextlib.suppress(OSError):
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            task = loop.create_task(self._set_up(conn, address[0]))
            self._setting_up.add(task)
            task.add_done_callback(self._setting_up.discard)

    async def _set_up(self, conn: socket.socket, peer: str) -> None:
        assert self._loop is not None
        factory = self._factory

        def protocol() -> asyncio.BaseProtocol:
            return factory(peer)

        try:
            if self._ssl is None:
                await self._loop.connect_accepted_socket(protocol, conn)
            else:
                await self._loop.connect_accepted_socket(
                    protocol, conn, ssl=self._ssl, ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S
                )
        except OSError as exc:
            # the client left before its transport was made, or its TLS handshake failed
            # (ssl.SSLError) or did not finish in time (TimeoutError): both are OSError
            log.debug("accepted connection lost at set-up: %s", exc)
            conn.close()

    def _hold(self, why: str) -> None:
        """Leave connections in the backlog until a count finds a descriptor free."""
        self._unwatch()
        now = time.monotonic()
        if now >= self._next_warning:
            self._next_warning = now + WARN_EVERY_S
            log.warning(
                "%s (open-files limit %d): new connections wait in the backlog until some close",
                why,
                self._open_files,
            )
        if self._recheck is None and not self._closed:
            assert self._loop is not None
            self._recheck = self._loop.call_later(RECHECK_S, self._check_again)

    def _check_again(self) -> None:
        self._recheck = None
        if self._closed:
            return
        if self._room():
            self._watch()
        else:
            assert self._loop is not None
            self._recheck = self._loop.call_later(RECHECK_S, self._check_again)


class MethodGate(asyncio.Protocol):
    """A connection's first bytes, before the websocket library sees them.

    A ``GET`` request goes on to the protocol ``make_protocol`` builds for ``peer`` (the
    address the connection was accepted from), with the bytes read so far; that protocol
    then owns the transport. Any other method gets ``refuse(method, target)``'s answer
    (405). After it the write side is shut and what the client still sends (a body) is
    read and dropped until it closes or :data:`HANDSHAKE_TIMEOUT_S` passes, so the
    answer is not lost to a TCP reset. A client that sends nothing within
    :data:`HANDSHAKE_TIMEOUT_S` of its accept (a TLS handshake included: the gate is
    made at the accept, before it) is dropped.
    """

    __slots__ = (
        "_deadline",
        "_head",
        "_make_protocol",
        "_peer",
        "_refuse",
        "_refused",
        "_timer",
        "_transport",
    )

    def __init__(
        self, make_protocol: PeerProtocolFactory, refuse: Callable[[str, str], bytes], peer: str
    ) -> None:
        self._make_protocol = make_protocol
        self._peer = peer
        self._refuse = refuse
        self._head = b""
        self._transport: asyncio.Transport | None = None
        self._refused = False
        self._timer: asyncio.TimerHandle | None = None
        self._deadline = asyncio.get_running_loop().time() + HANDSHAKE_TIMEOUT_S

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._timer = asyncio.get_running_loop().call_at(self._deadline, transport.abort)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        head = self._head = self._head + data
        if len(head) < 4 and b" " not in head:
            return
        transport = self._transport
        assert transport is not None and self._timer is not None
        if head.startswith(b"GET "):
            self._timer.cancel()
            hand_over(transport, self._make_protocol(self._peer), head)
            return
        if b"\n" not in head and len(head) < 8192:
            return  # wait for the whole request line
        line = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
        self._refused = True
        self._head = b""
        transport.write(self._refuse(line[0], line[1] if len(line) > 1 else "/"))
        if not shut_write(transport):
            return
        self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(HANDSHAKE_TIMEOUT_S, transport.close)

    def eof_received(self) -> bool:
        if self._transport is not None:
            self._transport.close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._transport = None


def shut_write(transport: asyncio.WriteTransport) -> bool:
    """Shut the write side after what is buffered (True); a TLS transport, which has no
    half-close, is closed instead, after what is buffered (False)."""
    if transport.can_write_eof():
        transport.write_eof()
        return True
    transport.close()
    return False


def hand_over(transport: asyncio.Transport, protocol: asyncio.BaseProtocol, head: bytes) -> None:
    """Make ``protocol`` the transport's, as if it had been from the start and read ``head``."""
    transport.set_protocol(protocol)
    protocol.connection_made(transport)
    if isinstance(protocol, asyncio.BufferedProtocol):
        while head and not transport.is_closing():
            buffer = protocol.get_buffer(len(head))
            n = min(len(buffer), len(head))
            buffer[:n] = head[:n]
            protocol.buffer_updated(n)
            head = head[n:]
    else:
        protocol.data_received(head)  # type: ignore[attr-defined]
