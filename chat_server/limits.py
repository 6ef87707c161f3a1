"""How many connections this process can really hold: ``MAX_CONNECTIONS`` or the
open-files limit, whichever is smaller.

Each websocket connection is one file descriptor. Past the open-files limit
``accept()`` fails with EMFILE, and clients vanish without an answer: the handshake
never runs, so it cannot refuse with 503, and ``/healthz`` and ``/stats`` stop
answering too. So the server admits at most the open-files limit less
:data:`OPEN_FILES_RESERVE` connections; past that, handshakes get 503 (as past
``MAX_CONNECTIONS``) while the reserve keeps accepting, answering and the store's
files working. No I/O here: the caller reads the limit (after raising it).
"""

from __future__ import annotations

from dataclasses import dataclass

#: descriptors kept for everything but connections: the database and its WAL, logs,
#: listening and metrics sockets, Redis, and sockets accepted only to be answered 503
OPEN_FILES_RESERVE = 256


@dataclass(frozen=True, slots=True)
class ConnectionLimit:
    """The connections admitted, and which limit decided it (for the start-up log)."""

    connections: int
    ruled_by: str
    #: True when the open-files limit, not MAX_CONNECTIONS, rules (worth a warning)
    by_open_files: bool = False


def usable_connections(max_connections: int, open_files: int) -> ConnectionLimit:
    """The smaller of ``MAX_CONNECTIONS`` and ``open_files`` less the reserve (at least 1)."""
    by_files = max(1, open_files - OPEN_FILES_RESERVE)
    if by_files < max_connections:
        return ConnectionLimit(
            by_files,
            f"the open-files limit ({open_files}, less {OPEN_FILES_RESERVE} reserved) "
            f"is below MAX_CONNECTIONS={max_connections}",
            by_open_files=True,
        )
    return ConnectionLimit(
        max_connections,
        f"MAX_CONNECTIONS (the open-files limit {open_files} allows {by_files})",
    )
