"""``python -m bench.lab.driver``: the lab's fast open-loop load driver (picows on uvloop).

It opens ``--connections`` websockets to a chat server or to the bare relay, puts
them in rooms of ``--room-size`` and sends ``send`` frames at fixed total rates
(``--rates``, one step each), measuring fan-out latency at every room member.

Open loop: one scheduler sends what the clock says is due, round-robin over the
connections, whatever the server does; a wake-up that comes late sends its
backlog at once with the original scheduled times, so the driver's own lateness
counts in the latency too (no coordinated omission), and is reported as
``late_sends`` (more than 1 ms behind) and ``max_send_lag_ms``.

Each frame's body is ``~ts=`` and the scheduled send time (``time.perf_counter_ns``,
19 digits), then ``x`` padding up to ``--body-chars``. Frames are spliced from one
frame per connection encoded once with the real codec, so a protobuf length never
changes; a receiver finds the marker in the raw bytes (JSON or protobuf alike) and
never decodes a ``message``. Latency is receive time minus scheduled time, in an HDR
histogram of microseconds (1 us to 60 s, 3 significant digits).

Deliveries count to the step whose send phase scheduled them, during the step and
its ``--drain-s``; one later than that is lost to the step (``error_detail``
``after_drain``, not counted in ``errors``). With ``--continuous`` (steps back to back,
``--drain-s 0``: a rate change at one instant) a delivery counts instead to the step and
the timeline second it arrives in, whichever step sent it, so a backlog one rate left
shows in the next step's latency. Errors are error frames by code,
unexpected closes (``closed 1013``) and sends dropped because a connection's
unsent bytes passed a bound (``send_buffer_full``). Acks (chat) are matched to
sends in order per connection for ``ack_latency_ms`` (approximate when errors
replace acks). Timeline points are seconds since the driver started, or since
``--t0-monotonic`` (a caller's ``time.monotonic()``), which also sets each step's
``started_s`` on that clock.

With ``--retry`` (chat only) every send carries a ``ref``: its 19 scheduled-time
digits, unique over the run. A send answered ``unavailable`` is sent again after
:data:`RETRY_AFTER_S` with the same ``ref``, body and scheduled time, and a connection
the server dropped is opened again and sends again everything it had not seen acked,
as a careful client does (the server answers a repeat of a stored send with its
original ack: nothing is stored twice). Each step counts them in ``retries``
(``after_unavailable``, ``after_reconnect``, ``reconnects``). It is off by default:
a ``ref`` makes each send an idempotency lookup on the server, part of what a
capacity figure would then measure.

The driver's own garbage collector never runs inside a step: everything alive once
the connections are open is frozen (``gc.freeze()``, never walked again), and
automatic collection is off from each step's start to the end of its drain, with a
collection just before the step. With CPython's default thresholds a full collection
over 2,000 connections' objects takes tens of milliseconds, which an open-loop
driver would count as latency (late receive times, late sends).

A step is ``generator_limited`` when the driver used more than 90 % of one core
during its send phase, when more than 1 % of its sends left more than 5 ms late,
when one left more than 50 ms late, or when it waited, runnable, for its core more
than 10 % of the time (Linux schedstat: another process or the kernel ran there):
its figures then measure the driver too.

Exit status: 0 when every step ran, 1 when the connections could not be opened
(or joined), 2 for a bad argument.
"""

from bench.lab.driver.climb import next_climb_rate, worth_a_rerun
from bench.lab.driver.config import DriverConfig, parse_args
from bench.lab.driver.connections import DEFLATE_OFFER, negotiated_deflate
from bench.lab.driver.frames import DIGITS, MARKER, MIN_BODY_CHARS, send_frame
from bench.lab.driver.latency import LatencyHistogram
from bench.lab.driver.run import Driver, main

# the package's modules import one another directly, never this file, so re-exporting
# them here makes no circle; ``python -m bench.lab.driver`` runs :func:`main`
__all__ = [
    "DEFLATE_OFFER",
    "DIGITS",
    "MARKER",
    "MIN_BODY_CHARS",
    "Driver",
    "DriverConfig",
    "LatencyHistogram",
    "main",
    "negotiated_deflate",
    "next_climb_rate",
    "parse_args",
    "send_frame",
    "worth_a_rerun",
]
