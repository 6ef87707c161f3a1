"""How many connections this process can really hold, and when it may accept one more.

Each websocket connection is one file descriptor. A process that reaches its
open-files limit fails ``accept()`` with EMFILE: the client vanishes without an
answer, and ``/healthz``, the store and the logs lose their descriptors too. So two
rules, both pure functions of the limit:

- **Admitted connections** (:func:`usable_connections`): the smaller of
  ``MAX_CONNECTIONS`` and the open-files limit less :func:`open_files_reserve`,
  ``max(64, limit // 8)``. Past it the handshake answers 503, as past
  ``MAX_CONNECTIONS``. The reserve holds the process' own descriptors (about 20:
  the database and its WAL, logs, the loop's, the listening socket) and the sockets
  answered without an upgrade (``/healthz``, ``/stats``, 503s) while they are
  answered. 64 at the least, because those are a fixed few whatever the limit; an
  eighth above 512, because a flood of refused clients grows with the connections.
- **Accepting** (:func:`may_accept`): the server's own accept loop
  (:mod:`chat_server.transport.accept`) takes a connection only while more than
  :data:`SPARE_DESCRIPTORS` would stay free, so ``accept()`` never meets EMFILE and
  what the process opens later (a metrics scrape, a Redis reconnect) finds one.
  Beyond that connections wait in the listen backlog until refused ones are gone.

No I/O here: the caller reads the limit (after raising it) and counts descriptors.
"""

from __future__ import annotations

from dataclasses import dataclass

#: the least reserve: the process' own descriptors (about 20) and the answers in flight
OPEN_FILES_RESERVE_MIN = 64
#: above 8 * OPEN_FILES_RESERVE_MIN the reserve is this fraction of the limit
OPEN_FILES_RESERVE_DIVISOR = 8
#: descriptors the accept loop never takes: what the process opens while it serves
SPARE_DESCRIPTORS = 8


@dataclass(frozen=True, slots=True)
class ConnectionLimit:
    """The connections admitted, and which limit decided it (for the start-up log)."""

    connections: int
    ruled_by: str
    #: True when the open-files limit, not MAX_CONNECTIONS, rules (worth a warning)
    by_open_files: bool = False


def open_files_reserve(open_files: int) -> int:
    """Descriptors kept from admitted connections: ``max(64, open_files // 8)``."""
    return max(OPEN_FILES_RESERVE_MIN, open_files // OPEN_FILES_RESERVE_DIVISOR)


def open_files_wanted(connections: int) -> int:
    """The smallest open-files limit whose :func:`usable_connections` admits ``connections``."""
    divisor = OPEN_FILES_RESERVE_DIVISOR
    wanted = max(connections + OPEN_FILES_RESERVE_MIN, -(-connections * divisor // (divisor - 1)))
    while wanted - open_files_reserve(wanted) < connections:
        wanted += 1
    while wanted - 1 - open_files_reserve(wanted - 1) >= connections:
        wanted -= 1
    return wanted


def usable_connections(max_connections: int, open_files: int) -> ConnectionLimit:
    """The smaller of ``MAX_CONNECTIONS`` and ``open_files`` less the reserve (at least 1)."""
    reserve = open_files_reserve(open_files)
    by_files = max(1, open_files - reserve)
    if by_files < max_connections:
        return ConnectionLimit(
            by_files,
            f"the open-files limit ({open_files}, less {reserve} reserved) "
            f"is below MAX_CONNECTIONS={max_connections}",
            by_open_files=True,
        )
    return ConnectionLimit(
        max_connections,
        f"MAX_CONNECTIONS (the open-files limit {open_files} allows {by_files})",
    )


def may_accept(open_descriptors: int, open_files: int) -> bool:
    """True when one more accepted socket leaves :data:`SPARE_DESCRIPTORS` free."""
    return open_descriptors + 1 <= open_files - SPARE_DESCRIPTORS
