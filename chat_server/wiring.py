"""Build the chat service from settings: every part chosen once, here, by object.

``BROKER`` picks the history store, the broker and the delivery together:
``memory`` is SQLite history, the in-process broker and local delivery (one
process); ``redis`` is Redis Streams history, the Redis broker on one shared client
and shared delivery (many processes or machines), on one Redis or, with
``REDIS_CLUSTER=on``, a Redis Cluster. The core gets the chosen broker as its one
seam (:class:`~chat_server.core.chat.RoomSeam`: last seq, room opened, members,
presence); REGRESSION's changes come from
:class:`~chat_server.regressions.Regression`. Which backend was chosen is asked here
to build it, and once more only by the server, to name the setting at fault when the
start fails: the service holds objects that keep one contract each.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from chat_server.broker.base import Broker
from chat_server.broker.memory import MemoryBroker
from chat_server.codecs.base import Codec
from chat_server.core.chat import ChatCore, EncodingPerRecipientCore
from chat_server.core.idempotency import RecentSends
from chat_server.delivery.base import Delivery
from chat_server.delivery.local import LocalDelivery
from chat_server.metrics import Counters
from chat_server.overload import LoadShedder
from chat_server.regressions import Regression
from chat_server.service import ChatService, Worker
from chat_server.settings import Settings
from chat_server.store.base import HistoryStore
from chat_server.store.sqlite import SqliteHistoryStore, WriterThreadHook


@dataclass(frozen=True)
class _Backend:
    """What ``BROKER`` chooses: the store, the broker (also the core's seam), the delivery."""

    store: HistoryStore
    broker: Broker
    #: builds the delivery once the core exists
    delivery: Callable[[ChatCore, Counters], Delivery]
    #: closed after the store and broker (the Redis client both share)
    release: tuple[Callable[[], Awaitable[None]], ...] = ()


def build_service(
    settings: Settings,
    codec: Codec,
    regression: Regression | None = None,
    *,
    worker_index: int | None = None,
    writer_hook: WriterThreadHook | None = None,
) -> ChatService:
    """The service ``settings`` describe, not started yet (``await service.start()``).

    ``regression`` is ``Regression.of(settings)`` when the caller has it already;
    ``worker_index`` is this process' place among ``WORKERS`` (None when it runs
    alone); ``writer_hook`` (``PROFILE=cprofile``) runs on the SQLite writer thread.
    """
    worker = Worker(worker_index, f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}")
    if regression is None:
        regression = Regression.of(settings)
    counters = Counters(
        LoadShedder(settings.overload_lag_ms / 1000, settings.overload_interval_ms / 1000)
    )
    if settings.broker == "redis":
        backend = _redis_backend(settings, worker, regression, counters)
    else:
        backend = _sqlite_backend(settings, regression, counters, writer_hook)
    broker = backend.broker
    core_class = EncodingPerRecipientCore if regression.encode_per_recipient else ChatCore
    core = core_class(
        codec,
        broker,
        max_body_chars=settings.max_body_chars,
        max_protocol_errors=settings.max_protocol_errors,
        rate_limit_per_s=settings.rate_limit_per_s,
        rate_limit_burst=settings.rate_limit_burst,
        max_rooms_per_connection=settings.max_rooms_per_connection,
    )

    return ChatService(
        codec=codec,
        core=core,
        store=backend.store,
        broker=broker,
        delivery=backend.delivery(core, counters),
        counters=counters,
        recent_sends=RecentSends(round(settings.send_ref_window_s * 1000), settings.send_ref_max),
        worker=worker,
        max_history_bytes=settings.max_history_bytes,
        blocking_send_s=regression.blocking_send_s,
        busy_send_s=regression.busy_send_s,
        release=backend.release,
    )


def _sqlite_backend(
    settings: Settings,
    regression: Regression,
    counters: Counters,
    writer_hook: WriterThreadHook | None,
) -> _Backend:
    """BROKER=memory: SQLite history and the in-process broker (one process)."""
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
    return _Backend(
        store=store,
        broker=MemoryBroker(store),
        delivery=LocalDelivery,
    )


def _redis_backend(
    settings: Settings, worker: Worker, regression: Regression, counters: Counters
) -> _Backend:
    """BROKER=redis: Redis history and broker on one client (many processes or machines)."""
    # imported only when chosen: the redis client is not loaded for one process
    from chat_server.broker.redis import RedisBroker  # noqa: PLC0415
    from chat_server.delivery.shared import SharedDelivery  # noqa: PLC0415
    from chat_server.redis_nodes import ClusterSlots, NodeGates, OneRedis  # noqa: PLC0415
    from chat_server.redis_rooms import connect_redis  # noqa: PLC0415
    from chat_server.store.redis import RedisHistoryStore  # noqa: PLC0415

    client = connect_redis(settings.redis_url, cluster=settings.redis_cluster)
    release = [client.aclose]
    gates = NodeGates(settings.redis_node_connections, settings.redis_pool_wait_s)
    if settings.redis_cluster:
        slots = ClusterSlots(client, settings.redis_url, gates)  # type: ignore[arg-type]
        topology: ClusterSlots | OneRedis = slots
        release.append(slots.close)
    else:
        topology = OneRedis(client, gates)  # type: ignore[arg-type]
    store = RedisHistoryStore(
        client=client,
        writer=worker.id,
        queue_max=settings.store_queue_max,
        batch_max=regression.store_batch_max(settings),
        history_max=settings.history_max,
        commit_seconds=counters.commit_seconds,
        send_ref_window_s=settings.send_ref_window_s,
        topology=topology,
        ack_replicas=settings.ack_replicas,
    )
    broker = RedisBroker(
        client=client, topology=topology, worker=worker.id, lease_s=settings.presence_lease_s
    )
    return _Backend(
        store=store,
        broker=broker,
        delivery=lambda core, counters: SharedDelivery(core, counters, broker),
        release=tuple(release),
    )
