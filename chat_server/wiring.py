"""Build the chat service from settings: every part chosen once, here, by object.

``BROKER`` picks the history store and the broker together: ``memory`` is SQLite
history with the in-process broker (one process), ``redis`` is Redis Streams history
with the Redis broker on one shared client (many processes or machines). The core
gets the seams of the chosen broker; REGRESSION's changes come from
:class:`~chat_server.regressions.Regression`. Nothing downstream asks which was
chosen: the service holds objects that keep one contract each.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING

from chat_server.broker.memory import MemoryBroker
from chat_server.codecs.base import Codec
from chat_server.core.chat import ChatCore, EncodingPerRecipientCore
from chat_server.core.idempotency import RecentSends
from chat_server.metrics import Counters
from chat_server.regressions import Regression
from chat_server.service import ChatService, Worker
from chat_server.settings import Settings
from chat_server.shared import SharedRooms
from chat_server.store.sqlite import SqliteHistoryStore, WriterThreadHook

if TYPE_CHECKING:
    from chat_server.broker.base import Broker


def build_service(
    settings: Settings,
    codec: Codec,
    *,
    worker_index: int | None = None,
    writer_hook: WriterThreadHook | None = None,
) -> ChatService:
    """The service ``settings`` describe, not started yet (``await service.start()``).

    ``worker_index`` is this process' place among ``WORKERS`` (None when it runs
    alone); ``writer_hook`` (``PROFILE=cprofile``) runs on the SQLite writer thread.
    """
    worker = Worker(worker_index, f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}")
    regression = Regression.of(settings)
    counters = Counters()
    recent_sends = RecentSends(round(settings.send_ref_window_s * 1000), settings.send_ref_max)
    if settings.broker == "redis":
        return _shared_service(
            settings,
            codec,
            worker=worker,
            regression=regression,
            counters=counters,
            recent_sends=recent_sends,
        )
    store = SqliteHistoryStore(
        path=settings.chat_db,
        synchronous=settings.chat_db_synchronous,
        queue_max=settings.store_queue_max,
        batch_max=regression.store_batch_max(settings),
        history_max=settings.history_max,
        writer_hook=writer_hook,
        commit_on=settings.store_commit_place,
        checkpoint_pages=settings.chat_db_checkpoint_pages,
        checkpointer_idle=settings.chat_db_checkpointer == "idle",
        commit_interval_ms=settings.chat_db_commit_interval_ms,
        wal_max_bytes=settings.chat_db_wal_max_bytes,
        commit_seconds=counters.commit_seconds,
    )
    broker = MemoryBroker()
    core = _core(
        settings,
        codec,
        regression=regression,
        last_seq=store.last_seq,
        broker=broker,
        room_closed=broker.unsubscribe,
    )
    return ChatService(
        codec=codec,
        core=core,
        store=store,
        broker=broker,
        counters=counters,
        recent_sends=recent_sends,
        worker=worker,
        max_history_bytes=settings.max_history_bytes,
        blocking_send_s=regression.blocking_send_s,
    )


def _shared_service(
    settings: Settings,
    codec: Codec,
    *,
    worker: Worker,
    regression: Regression,
    counters: Counters,
    recent_sends: RecentSends,
) -> ChatService:
    """BROKER=redis: Redis history and broker on one client, and the shared rooms' rules."""
    # imported only when chosen: the redis client is not loaded for one process
    from chat_server.broker.redis import RedisBroker  # noqa: PLC0415
    from chat_server.redis_rooms import connect_redis  # noqa: PLC0415
    from chat_server.store.redis import RedisHistoryStore  # noqa: PLC0415

    client = connect_redis(settings.redis_url)
    store = RedisHistoryStore(
        client=client,
        writer=worker.id,
        queue_max=settings.store_queue_max,
        batch_max=regression.store_batch_max(settings),
        history_max=settings.history_max,
        commit_seconds=counters.commit_seconds,
        send_ref_window_s=settings.send_ref_window_s,
    )
    broker = RedisBroker(client=client, worker=worker.id, lease_s=settings.presence_lease_s)
    service: ChatService | None = None

    # the core is built before the service and its shared rooms, which must hear when it
    # closes a room (to unsubscribe and release the room's waiting acks): this looks them
    # up at that moment, which is always after the service exists
    def room_closed(room: str) -> None:
        assert service is not None and service.shared is not None
        service.shared.room_closed(room)

    core = _core(
        settings,
        codec,
        regression=regression,
        last_seq=broker.last_seq,
        broker=broker,
        room_closed=room_closed,
    )
    service = ChatService(
        codec=codec,
        core=core,
        store=store,
        broker=broker,
        counters=counters,
        recent_sends=recent_sends,
        worker=worker,
        max_history_bytes=settings.max_history_bytes,
        blocking_send_s=regression.blocking_send_s,
        release=(client.aclose,),
        shared=lambda owner: SharedRooms(
            core,
            broker,
            counters,
            join_now=owner.join_now,
            dispatch=owner.dispatch,
            spawn=owner.spawn,
        ),
    )
    return service


def _core(
    settings: Settings,
    codec: Codec,
    *,
    regression: Regression,
    last_seq: Callable[[str], int],
    broker: Broker,
    room_closed: Callable[[str], None],
) -> ChatCore:
    """The core over the broker's seams (REGRESSION=encode_per_recipient: its own kind)."""
    core_class = EncodingPerRecipientCore if regression.encode_per_recipient else ChatCore
    return core_class(
        codec,
        last_seq,
        max_body_chars=settings.max_body_chars,
        max_protocol_errors=settings.max_protocol_errors,
        rate_limit_per_s=settings.rate_limit_per_s,
        rate_limit_burst=settings.rate_limit_burst,
        room_opened=broker.subscribe,
        room_closed=room_closed,
        remote_members=broker.members,
        presence_changed=broker.presence_changed,
    )
