"""The driver itself: open the connections, warm up, run (or climb) the steps, close."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import math
import sys
import time
from collections import deque
from dataclasses import asdict
from time import perf_counter_ns
from typing import NamedTuple

import numpy as np
import psutil
from picows import WSCloseCode, WSHandshakeError, WSMsgType, ws_connect

from bench.lab.driver.climb import next_climb_rate, worth_a_rerun
from bench.lab.driver.clock import WakeTimer
from bench.lab.driver.config import DriverConfig, parse_args
from bench.lab.driver.connections import (
    DEFLATE_OFFER,
    MAX_FRAME_BYTES,
    Connection,
    DeflateConnection,
    SetupError,
)
from bench.lab.driver.frames import decode_frame, frame_kind_reader, send_frame
from bench.lab.driver.latency import parse_times, take_values
from bench.lab.driver.step import BEHIND_NS, LATE_NS, StepRecorder, runq_wait_ns, summary_line
from bench.lab.machine import (
    CpuSplit,
    cores_busy_s,
    cpu_split,
    is_busy,
    steal_s,
    tree_cpu_s,
)
from bench.lab.pairs import core_step_load
from bench.lab.results import Step, TimePoint
from chat_server.codecs import get_codec
from chat_server.messages import Join
from chat_server.runtime import pin_cpus, raise_open_files_limit
from chatlab.loops import loop_factory
from chatlab.tls import shared_client_context

log = logging.getLogger("bench.lab.driver")

#: --retry: how long after an ``unavailable`` a send goes again
RETRY_AFTER_S = 0.2
#: sends made in one go before the scheduler lets received frames in
MAX_BATCH = 512
#: the scheduler wakes at most this often: sends due sooner leave together, this much late
MIN_WAKE_INTERVAL_NS = 200_000
#: arrivals are counted this often (each a pause of well under a millisecond) ...
FLUSH_INTERVAL_NS = 100_000_000
#: ... and a timeline point closes this often
POINT_INTERVAL_NS = 1_000_000_000
#: how long closing the connections may take at the end
CLOSE_TIMEOUT_S = 2.0
#: climb: after a broken step, wait until nothing has arrived for this long (the server
#: caught up) before the next step, but no longer than SETTLE_MOST_S
SETTLE_QUIET_S, SETTLE_MOST_S = 0.3, 8.0

EXIT_OK, EXIT_CONNECT_FAILED = 0, 1  # a bad argument: 2, from argparse


class Counters(NamedTuple):
    """The counters a step's window is read from, at one end of it."""

    clock_s: float
    server_s: float | None  # the server tree's CPU seconds
    proxy_s: float | None  # the proxy tree's CPU seconds (None: no proxy)
    # ours and other processes', each by its own counters; the host's; and what ran on
    # the server's cores besides the server, its idle neighbours and a proxy in front of
    # it (CpuSplit.on_cores_s)
    split: CpuSplit
    core_steal_s: float | None  # the server's cores' steal (None: not read)
    idle_s: float  # the idle neighbours' CPU seconds


class Driver:
    """Connections, the scheduler and the per-second bookkeeping of one run."""

    def __init__(self, config: DriverConfig) -> None:
        self.config = config
        self.codec = get_codec(config.serializer)
        self.msg_type = WSMsgType.BINARY if self.codec.binary else WSMsgType.TEXT
        self.acks = config.target == "chat"
        self.frame_kind = frame_kind_reader(self.codec)
        # t_s = 0 on the perf_counter_ns clock: the caller's t0, or now
        self.origin_ns = perf_counter_ns()
        if config.t0_monotonic is not None:
            self.origin_ns -= int((time.monotonic() - config.t0_monotonic) * 1e9)
        self.process = psutil.Process()
        # whose CPU a step's window reads (bench.lab.machine): the server's tree, and
        # what is not "other processes" (the lab's tree, or the server's and this one)
        self.server = psutil.Process(config.server_pid) if config.server_pid else None
        self.lab = psutil.Process(config.lab_pid) if config.lab_pid else None
        self.proxy = psutil.Process(config.proxy_pid) if config.proxy_pid else None
        # wss://: one TLS client context for every connection (each would load the CAs)
        self.ssl_context = (
            shared_client_context(config.ca_file) if config.url.startswith("wss://") else None
        )
        self.neighbours = [psutil.Process(pid) for pid in config.neighbour_pids]
        # since the last flush (a tenth of a second's worth): each delivery's scheduled
        # time (DIGITS ASCII digits) and receive time; each ack's latency in microseconds
        # (lists: appending an int to one costs a third of appending it to an array)
        self.delivery_digits = bytearray()
        self.delivery_received_ns: list[int] = []
        self.ack_us: list[int] = []
        # every connection's wire bytes (Connection.wire_bytes) summed at the last flush
        self.wire_bytes_flushed = 0
        # deliveries scheduled before this count to earlier steps (or to the warmup)
        self.window_start_ns = 2**63
        self.connections: list[Connection] = []
        self.open_connections: list[Connection] = []
        self.closing = False
        self.current: StepRecorder | None = None
        self.finished: list[tuple[StepRecorder, Step]] = []
        self.next_connection = 0
        self.timer: WakeTimer  # made in run(): it needs the running loop
        # --retry: the connection now serving each index, sends to repeat (when, index,
        # scheduled time), and the reopenings under way
        self.by_index: dict[int, Connection] = {}
        self.retries_due: deque[tuple[int, int, int]] = deque()
        self._reopening: set[asyncio.Task[None]] = set()
        self.gc_runs = 0  # collections of this process' GC so far (Step.generator_gc_runs)
        gc.callbacks.append(self._count_collection)

    def _count_collection(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.gc_runs += 1

    # connections ---------------------------------------------------------------------------

    def _room(self, index: int) -> tuple[str, int]:
        """Connection ``index``'s room and how many connections share it."""
        config = self.config
        k = index // config.room_size
        members = min(config.room_size, config.connections - k * config.room_size)
        return f"{config.room_prefix}-{k}", members

    async def _open(self, index: int, gate: asyncio.Semaphore) -> Connection:
        config = self.config
        room, members = self._room(index)
        frame, digits, ref_digits = send_frame(self.codec, room, config.body_chars, config.retry)
        kind = DeflateConnection if config.deflate else Connection
        conn = kind(self, index, members, frame, digits, ref_digits=ref_digits)
        url = config.url
        headers: dict[str, str] = {}
        if config.deflate:
            headers["Sec-WebSocket-Extensions"] = DEFLATE_OFFER
        if config.target == "relay":
            url += ("&" if "?" in url else "?") + f"room={room}"
        else:
            headers["Authorization"] = f"Bearer {config.tokens[index % len(config.tokens)]}"
            headers["Sec-WebSocket-Protocol"] = self.codec.subprotocol
        async with gate:
            try:
                async with asyncio.timeout(config.connect_timeout_s):
                    await ws_connect(
                        lambda: conn,
                        url,
                        extra_headers=headers,
                        websocket_handshake_timeout=config.connect_timeout_s,
                        max_frame_size=MAX_FRAME_BYTES,
                        ssl_context=self.ssl_context,
                    )
                    if config.target == "chat":
                        await conn.wait_for("welcome")
                        conn.send(self.msg_type, self.codec.encode_client(Join(room=room)))
                        await conn.wait_for("joined")
            except WSHandshakeError as exc:
                status = exc.response.status if exc.response is not None else "?"
                body = (exc.raw_body or b"").decode(errors="replace").strip()
                raise SetupError(f"connection {index}: HTTP {status} {body or exc}") from None
            except (OSError, TimeoutError) as exc:
                raise SetupError(f"connection {index}: {exc!r}") from None
        return conn

    async def connect_all(self) -> None:
        """Open (and for chat join) every connection; raise SetupError if any fails."""
        gate = asyncio.Semaphore(64)
        opened = await asyncio.gather(
            *(self._open(i, gate) for i in range(self.config.connections)),
            return_exceptions=True,
        )
        self.connections = [c for c in opened if isinstance(c, Connection)]
        failures = [c for c in opened if isinstance(c, BaseException)]
        if failures:
            await self.close_all()
            raise SetupError(f"{len(failures)} of {len(opened)} failed; first: {failures[0]}")
        self.open_connections = list(self.connections)
        self.by_index = {c.index: c for c in self.connections}

    def connection_lost(self, conn: Connection) -> None:
        """picows: ``conn`` is gone; unless we are closing, that is an error (and with
        ``--retry`` the connection is opened again)."""
        if conn in self.open_connections:
            self.open_connections = [c for c in self.open_connections if c is not conn]
        if not self.closing and self.current is not None:
            self.count_error(f"closed {conn.close_code or 'abnormally'}")
        if self.config.retry and not self.closing and self.by_index.get(conn.index) is conn:
            task = asyncio.ensure_future(self._reopen(conn))
            self._reopening.add(task)
            task.add_done_callback(self._reopening.discard)

    # --retry ------------------------------------------------------------------------------

    def retry_later(self, index: int, scheduled_ns: int) -> None:
        """Send connection ``index``'s send of ``scheduled_ns`` again after RETRY_AFTER_S."""
        self.retries_due.append((perf_counter_ns() + int(RETRY_AFTER_S * 1e9), index, scheduled_ns))

    def resend(self, conn: Connection, scheduled_ns: int, why: str) -> None:
        """Send again, with its ref and scheduled time, a send not acked."""
        assert conn.ref_digits is not None
        frame = conn.frame
        digits = b"%019d" % scheduled_ns
        frame[conn.digits] = digits
        frame[conn.ref_digits] = digits
        conn.send(self.msg_type, frame)
        conn.ack_sent_ns.append(scheduled_ns)
        if self.current is not None:
            self.current.retries[why] += 1

    async def retry_loop(self) -> None:
        """Every 50 ms, send again what ``unavailable`` answered (on the index's open
        connection; later if it is being reopened)."""
        while True:
            await asyncio.sleep(0.05)
            now = perf_counter_ns()
            due = self.retries_due
            for _ in range(len(due)):
                if due[0][0] > now:
                    break
                _, index, scheduled_ns = due.popleft()
                conn = self.by_index.get(index)
                if conn is not None and conn in self.open_connections:
                    self.resend(conn, scheduled_ns, "after_unavailable")
                else:
                    due.append((now + int(RETRY_AFTER_S * 1e9), index, scheduled_ns))

    async def _reopen(self, old: Connection) -> None:
        """Open connection ``old.index`` again (until closing) and resend what it had
        not seen acked."""
        gate = asyncio.Semaphore(1)
        while not self.closing:
            try:
                conn = await self._open(old.index, gate)
                break
            except SetupError:
                await asyncio.sleep(0.2)
        else:
            return
        self.by_index[old.index] = conn
        self.connections.append(conn)
        self.open_connections = [*self.open_connections, conn]
        if self.current is not None:
            self.current.retries["reconnects"] += 1
        pending, old.ack_sent_ns = list(old.ack_sent_ns), deque()
        for scheduled_ns in pending:
            self.resend(conn, scheduled_ns, "after_reconnect")

    async def close_all(self) -> None:
        """Close every connection (1000), waiting at most :data:`CLOSE_TIMEOUT_S`."""
        self.closing = True
        transports = [c.transport for c in self.connections if c.transport is not None]
        for transport in transports:
            transport.send_close(WSCloseCode.OK)
        waits = [asyncio.ensure_future(t.wait_disconnected()) for t in transports]
        if waits:
            _, pending = await asyncio.wait(waits, timeout=CLOSE_TIMEOUT_S)
            for wait in pending:
                wait.cancel()
        for transport in transports:
            transport.disconnect(graceful=False)

    # receiving -----------------------------------------------------------------------------

    def count_error(self, key: str) -> None:
        """Count one error in the current step (or the first step, during the warmup)."""
        if self.current is not None:
            self.current.errors[key] += 1

    def error_of(self, payload: bytes) -> tuple[str, str | None]:
        """The ``code`` and ``ref`` of an error frame."""
        try:
            error = decode_frame(self.codec, payload)
        except Exception:  # an undecodable error frame is still an error
            return "undecodable error", None
        return str(getattr(error, "code", "error")), getattr(error, "ref", None)

    def _count_after_drain(self, scheduled_ns: np.ndarray) -> None:
        """Deliveries scheduled before the current step: after their own step's drain."""
        for recorder, step in self.finished:
            late = int(
                ((scheduled_ns >= recorder.start_ns) & (scheduled_ns < recorder.end_ns)).sum()
            )
            if late:
                step.error_detail["after_drain"] = step.error_detail.get("after_drain", 0) + late

    # sending -------------------------------------------------------------------------------

    async def send_schedule(self, rate: float, recorder: StepRecorder) -> None:
        """Send ``rate``/s from ``recorder.start_ns`` to ``recorder.end_ns``, each at its time.

        Round-robin over the open connections; a late wake-up sends the backlog with the
        original scheduled times; ``recorder`` gets the counts at each wake-up.
        """
        interval_ns = 1e9 / rate
        start_ns = recorder.start_ns
        total = math.ceil((recorder.end_ns - start_ns) / interval_ns)
        msg_type = self.msg_type
        k = 0
        i = self.next_connection
        sent = expected = late = behind = 0
        max_lag = recorder.max_lag_ns
        timer = self.timer
        while k < total:
            conns = self.open_connections
            if not conns:
                return
            n = len(conns)
            batch = 0
            now = perf_counter_ns()
            due = start_ns + int(k * interval_ns)
            while due <= now and batch < MAX_BATCH:
                conn = conns[i % n]
                i += 1
                k += 1
                batch += 1
                if conn.paused and conn.buffer_full():
                    self.count_error("send_buffer_full")
                else:
                    frame = conn.frame
                    digits = b"%019d" % due
                    frame[conn.digits] = digits
                    if conn.ref_digits is not None:
                        frame[conn.ref_digits] = digits
                    conn.send(msg_type, frame)
                    conn.ack_sent_ns.append(due)
                    sent += 1
                    expected += conn.members
                    lag = now - due
                    if lag > LATE_NS:
                        late += 1
                        if lag > BEHIND_NS:
                            behind += 1
                        max_lag = max(max_lag, lag)
                if k == total:
                    break
                due = start_ns + int(k * interval_ns)
                now = perf_counter_ns()
            recorder.sent += sent
            recorder.expected += expected
            recorder.late_sends += late
            recorder.behind_sends += behind
            recorder.max_lag_ns = max_lag
            sent = expected = late = behind = 0
            self.next_connection = i % n
            if batch >= MAX_BATCH:
                await asyncio.sleep(0)
            elif k < total:
                await timer.sleep_until(max(due, now + MIN_WAKE_INTERVAL_NS))

    # steps ---------------------------------------------------------------------------------

    def _flush(self, recorder: StepRecorder) -> None:
        """Count what arrived since the last flush into ``recorder`` (deliveries and acks)."""
        scheduled_ns = parse_times(bytes(self.delivery_digits))
        del self.delivery_digits[:]
        received_ns = take_values(self.delivery_received_ns)
        in_window = scheduled_ns >= self.window_start_ns
        if not in_window.all():
            self._count_after_drain(scheduled_ns[~in_window])
        deliveries_us = (received_ns[in_window] - scheduled_ns[in_window]) // 1000
        recorder.point_latency.add(deliveries_us)
        recorder.delivered += len(deliveries_us)
        recorder.wire_deliveries += len(scheduled_ns)
        wire_bytes = sum(c.wire_bytes for c in self.connections)
        recorder.wire_bytes += wire_bytes - self.wire_bytes_flushed
        self.wire_bytes_flushed = wire_bytes
        recorder.ack_latency.add(take_values(self.ack_us))

    def _time_point(self, recorder: StepRecorder, since_ns: int, now_ns: int) -> None:
        """Close the timeline point since ``since_ns``: its rates and percentiles."""
        point = recorder.point_latency
        delivered = point.count
        seconds = (now_ns - since_ns) / 1e9
        recorder.timeline.append(
            TimePoint(
                t_s=round((now_ns - self.origin_ns) / 1e9, 3),
                users=len(self.open_connections),
                sent_per_s=round((recorder.sent - recorder.sent_at_point) / seconds, 1),
                delivered_per_s=round(delivered / seconds, 1),
                p50_ms=point.value_at_percentile(50) / 1000 if delivered else None,
                p99_ms=point.value_at_percentile(99) / 1000 if delivered else None,
                max_ms=point.percentiles_ms()["max"] if delivered else None,
            )
        )
        recorder.sent_at_point = recorder.sent
        point.merge_into(recorder.latency)

    async def run_step(
        self, rate: float, recorder: StepRecorder, drain_s: float, *, recorded: bool = True
    ) -> None:
        """Send at ``rate`` for the step, then drain; the recorder holds the results.

        Arrivals are counted every :data:`FLUSH_INTERVAL_NS` (short pauses, not one long
        one a second), a timeline point closes every :data:`POINT_INTERVAL_NS`. With
        ``recorded`` False (the warmup) no delivery counts: they all arrive outside the
        window of a recorded step.
        """
        gc.collect()  # the last step's garbage, before this one's window
        gc.disable()
        runs_before = self.gc_runs
        try:
            await self._run_step(rate, recorder, drain_s, recorded=recorded)
        finally:
            gc.enable()
            recorder.gc_runs = self.gc_runs - runs_before

    async def _run_step(
        self, rate: float, recorder: StepRecorder, drain_s: float, *, recorded: bool
    ) -> None:
        # the window's counters first, then the clock starts: reading them takes tens of
        # ms (every process' counters), which inside the step held back its first sends
        # (every cost step's worst send lag was ~20 ms) and bunched them
        window_before = self._window_counters()
        start_ns = perf_counter_ns()
        if recorded and not (self.config.continuous and self.window_start_ns < 2**63):
            self.window_start_ns = start_ns  # --continuous: the first recorded step's start
        recorder.start_ns = start_ns
        if self.config.t0_monotonic is not None:
            recorder.started_s = round((start_ns - self.origin_ns) / 1e9, 3)
        end_ns = recorder.end_ns = start_ns + int(recorder.duration_s * 1e9)
        stop_ns = end_ns + int(drain_s * 1e9)
        self.current = recorder
        cpu_before = self.process.cpu_times()
        cores = self.config.cores
        cores_before = cores_busy_s(cores) if cores else None
        runq_before_ns = runq_wait_ns()
        sender = asyncio.ensure_future(self.send_schedule(rate, recorder))
        every = range(start_ns + FLUSH_INTERVAL_NS, stop_ns, FLUSH_INTERVAL_NS)
        flushes = sorted({*every, end_ns, stop_ns})
        point_ns = start_ns
        for flush_ns in flushes:
            await asyncio.sleep(max(0, flush_ns - perf_counter_ns()) / 1e9)
            if flush_ns == end_ns:
                await sender
                cpu_after = self.process.cpu_times()
                used_s = (cpu_after.user - cpu_before.user) + (cpu_after.system - cpu_before.system)
                elapsed_ns = perf_counter_ns() - start_ns
                recorder.cpu_percent = 100 * used_s / (elapsed_ns / 1e9)
                if cores and cores_before is not None:
                    busy_s = cores_busy_s(cores) - cores_before
                    recorder.core_busy_percent = 100 * busy_s / (elapsed_ns / 1e9) / len(cores)
                runq_after_ns = runq_wait_ns()
                if runq_before_ns is not None and runq_after_ns is not None:
                    recorder.runq_wait_share = (runq_after_ns - runq_before_ns) / elapsed_ns
            if flush_ns == stop_ns:
                # the window closes after the drain: the server's CPU then holds the work
                # of every frame the step counts as delivered, those still in flight when
                # the sends stopped too (at 1-s steps and tens of ms of latency, cutting
                # it at the send phase's end moved CPU per frame by several per cent)
                self._close_window(recorder, window_before, self._window_counters())
            self._flush(recorder)
            if (flush_ns - start_ns) % POINT_INTERVAL_NS == 0 or flush_ns in (end_ns, stop_ns):
                now_ns = perf_counter_ns()
                self._time_point(recorder, point_ns, now_ns)
                point_ns = now_ns
            if flush_ns <= end_ns:
                recorder.send_points = len(recorder.timeline)
        await sender

    def _window_counters(self) -> Counters:
        """Now: the clock, the server tree's CPU seconds (None when not told its pid), the
        CPU split between the lab's tree (or the server's and this driver's) and every
        other process, with the host's counters and what else ran on the server's cores
        (every process but the server and its idle neighbours, by its own counters), the
        cores' steal seconds, and the idle neighbours' CPU."""
        server = tree_cpu_s(self.server) if self.server is not None else None
        proxy = tree_cpu_s(self.proxy) if self.proxy is not None else None
        ours = [self.lab] if self.lab is not None else [self.server, self.proxy, self.process]
        cores = self.config.server_cores or ()
        beside = [p for p in (self.server, self.proxy) if p is not None]
        return Counters(
            time.monotonic(),
            server,
            proxy,
            cpu_split(ours, cores, [*beside, *self.neighbours]),
            steal_s(cores) if cores else None,
            sum(tree_cpu_s(p) for p in self.neighbours),
        )

    @staticmethod
    def _close_window(recorder: StepRecorder, before: Counters, after: Counters) -> None:
        """The send phase's window into ``recorder``: its seconds, the server's CPU,
        other processes' CPU and the host's steal; what else ran on the server's cores,
        their steal, and its idle neighbours' CPU."""
        recorder.window_s = after.clock_s - before.clock_s
        if before.server_s is not None and after.server_s is not None:
            recorder.server_cpu_s = after.server_s - before.server_s
        if before.proxy_s is not None and after.proxy_s is not None:
            recorder.proxy_cpu_s = after.proxy_s - before.proxy_s
        recorder.others_cpu_s = max(0.0, after.split.others_s - before.split.others_s)
        recorder.steal_s = max(0.0, after.split.host.steal_s - before.split.host.steal_s)
        if before.core_steal_s is not None and after.core_steal_s is not None:
            recorder.server_core_others_s = max(
                0.0, after.split.on_cores_s - before.split.on_cores_s
            )
            recorder.idle_cpu_s = after.idle_s - before.idle_s
            recorder.server_core_steal_s = max(0.0, after.core_steal_s - before.core_steal_s)

    def core_busy(self, step: Step) -> bool:
        """Whether something else kept the server's cores busy over ``step``'s window
        (:func:`bench.lab.pairs.core_step_load`; unknown: not busy)."""
        return is_busy(core_step_load(step))

    async def run(self) -> int:
        """Connect, warm up, run every step, close; return the exit status."""
        self.timer = WakeTimer()
        try:
            await self.connect_all()
        except SetupError as exc:
            print(f"driver: could not open the connections: {exc}", file=sys.stderr)
            self.timer.close()
            return EXIT_CONNECT_FAILED
        log.info("%d connections open", len(self.connections))
        gc.collect()
        gc.freeze()  # the connections' objects: no collection walks them again
        retrying = asyncio.ensure_future(self.retry_loop()) if self.config.retry else None
        try:
            await self._run_steps()
        finally:
            self.current = None
            if retrying is not None:
                retrying.cancel()
            for task in list(self._reopening):
                task.cancel()
            await self.close_all()
            self.timer.close()
        return EXIT_OK

    async def _run_steps(self) -> None:
        config = self.config
        steps: list[Step] = []
        first = StepRecorder(
            f"rate {config.rates[0]:g}/s", config.rates[0], config.step_s, config.connections
        )
        warm_rate = (config.cost_rates or config.rates)[0]
        if config.warmup_s > 0:
            warmup = StepRecorder("warmup", warm_rate, config.warmup_s, config.connections)
            warmup.errors = first.errors  # errors while warming up count to the first step
            self.current = warmup
            await self.run_step(warm_rate, warmup, drain_s=0, recorded=False)
        for rate in config.cost_rates:
            recorder = StepRecorder(
                f"cost {rate:g}/s", rate, config.cost_step_s, config.connections
            )
            recorder.cost = True
            await self.recorded_step(rate, recorder, steps)
        if config.climb_slo is not None:
            held = await self._climb(config.climb_slo, first, steps)
            if held > 0 and config.sustain_s > 0:
                await self._sustain(round(held * config.sustain_share), steps)
            return
        for index, rate in enumerate(config.rates):
            await self.recorded_step(rate, first if index == 0 else None, steps)

    async def recorded_step(
        self, rate: float, recorder: StepRecorder | None, steps: list[Step]
    ) -> Step:
        """Run one recorded step at ``rate``; its Step, appended to ``steps`` and written."""
        config = self.config
        if recorder is None:
            recorder = StepRecorder(f"rate {rate:g}/s", rate, config.step_s, config.connections)
        await self.run_step(rate, recorder, config.drain_s)
        step = recorder.result()
        step.body_chars = config.body_chars
        step.frame_bytes = len(self.connections[0].frame) if self.connections else 0
        step.deflate = bool(self.connections) and all(
            getattr(c, "deflate", None) is not None for c in self.connections
        )
        if step.deflate:
            step.deflate_params = self.connections[0].deflate_params
        self.finished.append((recorder, step))
        steps.append(step)
        print(summary_line(step), file=sys.stderr, flush=True)
        self.write(steps)
        return step

    async def _sustain(self, rate: float, steps: list[Step]) -> None:
        """After a climb: one step of ``--sustain-s`` at ``rate`` (a share of the knee),
        whether the knee holds sustained or was only a burst's."""
        config = self.config
        await self._settle()
        recorder = StepRecorder(f"sustain {rate:g}/s", rate, config.sustain_s, config.connections)
        recorder.sustain = True
        await self.recorded_step(rate, recorder, steps)

    async def _climb(self, slo: dict[str, float], first: StepRecorder, steps: list[Step]) -> float:
        """Find the knee: multiply the rate by ``factor`` while the SLO holds, then bisect
        (geometrically) between the last held and the first broken rate until they are
        within ``resolution``. A stalled step (:func:`stalled_points`) that held, or that
        broke only in its stalled seconds, is run once more and the re-run decides; a step
        whose server core something else kept busy (:meth:`core_busy`) is run again, at
        most ``busy_reruns`` times, and the last is kept (the ladder flags it). A step
        that held while the driver was saturated (its core full, or waiting for it) ends the
        climb: the knee is beyond it. Returns the highest rate that held (0: none)."""
        config = self.config
        held, broke = 0.0, math.inf
        rate = config.rates[0]
        recorder: StepRecorder | None = first
        while True:
            rate = round(rate)
            step = await self.recorded_step(rate, recorder, steps)
            recorder = None
            if step.stall_s and worth_a_rerun(step, slo):
                step.superseded = True
                await self._settle()
                step = await self.recorded_step(rate, None, steps)
                step.rerun = True
                self.write(steps)
            for _ in range(config.busy_reruns):
                if not self.core_busy(step):
                    break
                # something else ran on the server's core: this step's latency measured
                # it too; measure again before it decides the knee (kept after the last)
                step.superseded = True
                await self._settle()
                step = await self.recorded_step(rate, None, steps)
                step.busy_rerun = True
                self.write(steps)
            if step.holds(slo):
                held = max(held, rate)
                if step.generator_saturated:
                    return held  # the driver, not the target, is the limit: higher says nothing
            else:
                broke = min(broke, rate)
                await self._settle()
            following = next_climb_rate(rate, held, broke, config)
            if following is None:
                return held
            rate = following

    async def _settle(self) -> None:
        """Wait until nothing has arrived for :data:`SETTLE_QUIET_S` (at most
        :data:`SETTLE_MOST_S`): a step after an overload starts on a server that caught up."""
        deadline = perf_counter_ns() + int(SETTLE_MOST_S * 1e9)
        while perf_counter_ns() < deadline:
            before = len(self.delivery_received_ns) + len(self.ack_us)
            await asyncio.sleep(SETTLE_QUIET_S)
            if len(self.delivery_received_ns) + len(self.ack_us) == before:
                return

    def write(self, steps: list[Step]) -> None:
        """Write ``--json-out`` (atomically), if asked."""
        path = self.config.json_out
        if path is None:
            return
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps([asdict(s) for s in steps], indent=1))
        tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    """Run the driver with the command line's options; return the exit status."""
    config = parse_args(argv)
    logging.getLogger("picows").setLevel(logging.WARNING)  # it logs every connection at INFO
    # picows' transports warn once per write to a peer that reset, until its close is handled
    logging.getLogger("aiofastnet").setLevel(logging.ERROR)
    pin_cpus(config.cores)
    raise_open_files_limit(config.connections)
    with asyncio.Runner(loop_factory=loop_factory(config.event_loop)) as runner:
        return runner.run(Driver(config).run())


if __name__ == "__main__":
    sys.exit(main())
