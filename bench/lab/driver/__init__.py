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
``after_drain``, not counted in ``errors``). Errors are error frames by code,
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

from importlib import import_module

#: the public names, by the module of this package that defines each; a name is imported
#: from its module on first use, so this package imports none of its modules and none of
#: them imports it (``python -m bench.lab.driver`` runs :mod:`bench.lab.driver.run`)
_EXPORTS: dict[str, tuple[str, ...]] = {
    "climb": (
        "next_climb_rate",
        "worth_a_rerun",
    ),
    "clock": ("WakeTimer",),
    "config": (
        "DEFAULT_URLS",
        "TARGETS",
        "DriverConfig",
        "load_tokens",
        "parse_args",
    ),
    "connections": (
        "DEFLATE_OFFER",
        "MAX_BUFFERED_BYTES",
        "MAX_FRAME_BYTES",
        "MAX_PENDING_ACKS",
        "Connection",
        "DeflateConnection",
        "SetupError",
        "negotiated_deflate",
    ),
    "frames": (
        "DIGITS",
        "MARKER",
        "MIN_BODY_CHARS",
        "REF_PLACEHOLDER",
        "decode_frame",
        "frame_kind_reader",
        "send_frame",
    ),
    "latency": (
        "HIST_DIGITS",
        "HIST_MAX_US",
        "HIST_MIN_US",
        "LatencyHistogram",
        "parse_times",
    ),
    "run": (
        "CLOSE_TIMEOUT_S",
        "EXIT_CONNECT_FAILED",
        "EXIT_OK",
        "FLUSH_INTERVAL_NS",
        "MAX_BATCH",
        "MIN_WAKE_INTERVAL_NS",
        "POINT_INTERVAL_NS",
        "RETRY_AFTER_S",
        "SETTLE_MOST_S",
        "SETTLE_QUIET_S",
        "Driver",
        "main",
    ),
    "step": (
        "BEHIND_NS",
        "BEHIND_SHARE",
        "CPU_LIMIT_PERCENT",
        "LATE_NS",
        "MAX_LAG_LIMIT_MS",
        "RUNQ_WAIT_LIMIT",
        "StepRecorder",
        "summary_line",
    ),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = list(_MODULE_OF)


def __getattr__(name: str) -> object:
    """A public name of the driver, imported from its module (then kept here)."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's names and the public names of the driver."""
    return sorted({*globals(), *__all__})
