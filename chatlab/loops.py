"""The event-loop choice (``EVENT_LOOP``), made once at start by whichever process runs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """Return a factory for the ``EVENT_LOOP`` named ``asyncio`` or ``uvloop``."""
    if name == "uvloop":
        import uvloop  # noqa: PLC0415  (only imported when chosen)

        return uvloop.new_event_loop
    return asyncio.new_event_loop
