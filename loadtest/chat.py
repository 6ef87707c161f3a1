# ruff: noqa: E402  (the imports follow the sys.path fix below)
"""``locust -f loadtest/chat.py``: chat users, named load profiles and latency thresholds.

Everything Locust users know works (web UI by default, ``--headless``, ``--csv``,
``--html``, ``--processes``); the options this file adds are shown in the web UI
and by ``python -m loadtest.chat --help`` (Locust prints ``--help`` before it loads
a locustfile). The statistics entries are ``fanout`` (a sender's send to each
member's receive; failures: missing or duplicate deliveries), ``ack`` (send to ack;
failures: error frames answering sends, sends never acked), ``connect`` (the
websocket handshake; failures: refused handshakes, unexpected closes, errors before
the join), ``login``, ``refresh`` and ``register`` (auth calls) and ``generator_overload``
(one failure per second in which this generator's CPU passed 90% or its sends fell
behind schedule: the latencies then include the generator's own delay).

Guarantees: every run driven by a profile or a stage table ends by itself, after a
quiet tail in which users stop sending and keep receiving; rooms never span Locust
processes, so each process counts its own rooms' deliveries exactly; with
``--slo`` a broken threshold sets the exit status to 1.
"""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:  # Locust puts only loadtest/ on the path; our packages live one up
    sys.path.insert(0, _ROOT)

import json
import logging
import math
import random
import ssl
import time
import urllib.error
import urllib.request
from contextlib import suppress
from dataclasses import asdict, replace
from typing import Any

import gevent
import psutil
from gevent.event import Event
from gevent.pool import Pool
from locust import LoadTestShape, User, constant, events, task
from locust.env import Environment
from locust.exception import StopUser
from locust.runners import MasterRunner, Runner, WorkerRunner

from chatlab.tls import shared_client_context
from loadtest.auth import AuthClient, Grant, auth_urls
from loadtest.client import (
    CONNECT,
    FANOUT,
    HTTP,
    WS,
    AuthError,
    HandshakeFailed,
    LoadTestFailure,
    RelaySession,
    Session,
    global_index,
    password_for,
    room_name,
    username,
)
from loadtest.options import Options, add_arguments, resolve_options
from loadtest.profiles import Schedule, judge
from loadtest.state import LATE_SEND_THRESHOLD_S, Plan, Process

log = logging.getLogger("loadtest")

DEFAULT_HOST = "ws://127.0.0.1:8000/ws"
#: a process whose CPU passes this (percent of one core) is overloaded
CPU_OVERLOAD_PERCENT = 90.0
#: a user this far behind its schedule starts a new one (at most this much catching up)
BACKLOG_LIMIT_S = 1.0
#: logins in flight at once during prelogin (each costs the auth service an argon2 hash)
PRELOGIN_CONCURRENCY = 8
#: seconds a user waits before reconnecting after a failure
RECONNECT_PAUSE_S = 1.0
#: seconds to wait for ``joined`` after connecting
JOIN_TIMEOUT_S = 10.0
#: seconds the prelogin gate waits for every user to connect before opening anyway
GATE_TIMEOUT_S = 30.0

OVERLOAD = "generator_overload"
GEN = "GEN"
_PLAN_MESSAGE = "chatlab_plan"
_PHASE_MESSAGE = "chatlab_phase"
_ABORT_MESSAGE = "chatlab_abort"
#: the exit status of a run stopped because it could not be run (the auth service unreachable)
ABORT_EXIT_CODE = 2


class GeneratorOverload(LoadTestFailure):
    """This load generator could not keep up: its numbers include its own delay."""


# ---- options: loadtest.options, added to Locust's command line -------------------

events.init_command_line_parser.add_listener(add_arguments)


# ---- this process's state (loadtest.state) ----------------------------------------------

PROCESS = Process()
_worker_snapshots: dict[str, dict[str, Any]] = {}
_final: dict[str, Any] = {}
_ran: list[bool] = []
#: why this run was stopped before its table ended (empty: it was not)
_aborted: list[str] = []


def _fire(environment: Environment) -> Any:
    return environment.events.request.fire


def _auth_client(environment: Environment, options: Options) -> AuthClient:
    fire = _fire(environment)

    def on_request(name: str, elapsed_ms: float, error: Exception | None) -> None:
        fire(
            request_type=HTTP,
            name=name,
            response_time=elapsed_ms,
            response_length=0,
            exception=error,
            context={},
        )

    def on_retry(name: str, status: int) -> None:
        PROCESS.ledger.auth_retried += 1

    return AuthClient(
        options.auth_url, on_request=on_request, on_retry=on_retry, ca_file=options.ca_file
    )


def _ws_context(url: str, options: Options) -> ssl.SSLContext | None:
    """The process's one TLS context for a ``wss://`` chat server (verified against
    ``--ca-file``); None for ``ws://``."""
    return shared_client_context(options.ca_file) if url.startswith("wss://") else None


def _unreachable(auth_url: str, ca_file: str = "") -> str | None:
    """None when the auth service (one of its replicas) answers ``GET /healthz``; else why
    none does (an https replica is verified against ``ca_file``)."""
    why = "no URL"
    for url in auth_urls(auth_url):
        context = shared_client_context(ca_file) if url.startswith("https://") else None
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=5, context=context):
                return None
        except urllib.error.HTTPError:
            return None  # it answered
        except OSError as exc:
            why = type(getattr(exc, "reason", exc)).__name__
    return why


def _abort_run(environment: Environment, reason: str) -> None:
    """Stop the whole run at once, saying ``reason`` (once); its exit status is 2.

    A worker asks the master, which stops every process.
    """
    if _aborted:
        return
    _aborted.append(reason)
    log.error("%s", reason)
    runner = environment.runner
    if isinstance(runner, WorkerRunner):
        runner.send_message(_ABORT_MESSAGE, reason)
        return
    environment.process_exit_code = ABORT_EXIT_CODE
    if runner is not None:
        gevent.spawn(runner.quit)  # not from a user's greenlet, which quit would kill


def _auth_unreachable_reason(options: Options, why: str) -> str:
    return (
        f"auth service unreachable at {options.auth_url} ({why}): start it first "
        "(make loadtest-services), or point --auth-url at it; stopping the run"
    )


# ---- the user ------------------------------------------------------------------------


class ChatUser(User):
    """One chat user: a token, one connection, one room; sends at the profile's pace.

    The user's greenlet sends; a receiver greenlet reads every frame. A connection
    that fails or is closed by the server is reported and reopened after
    :data:`RECONNECT_PAUSE_S`. The user logs in once: when its access token nears
    expiry (:data:`~loadtest.auth.REFRESH_AT_SHARE` of its life), and after a handshake
    refused with 401, it spends its refresh token at ``/refresh`` instead; only a
    refresh refused 401 (the session is gone) makes it log in again.
    """

    host = DEFAULT_HOST
    wait_time = constant(0)

    def on_start(self) -> None:
        """Take a slot (which names the user and its room)."""
        self.slot = PROCESS.slots.acquire()
        self.grant: Grant | None = None
        #: a refresh running beside the connection (the connection outlives its token)
        self.renewing: gevent.Greenlet | None = None
        self.session: Session | None = None
        self.receiver: gevent.Greenlet | None = None
        #: sessions opened so far (names each session's refs), and the sends the last
        #: one left unacked (retried with their refs by the next)
        self.sessions = 0
        self.unacked: dict[str, str] = {}

    @task
    def chat(self) -> None:
        """Connect, join, send at the profile's pace until stopped; reconnect after a failure."""
        while True:
            if _aborted:
                raise StopUser()
            session = self._open_session()
            if session is None:
                gevent.sleep(RECONNECT_PAUSE_S)
                continue
            self._send_until_closed(session)
            self._end_session()
            gevent.sleep(RECONNECT_PAUSE_S)

    def on_stop(self) -> None:
        """Account for the session's tail and close it; free the slot."""
        if getattr(self, "session", None) is not None:
            self.session.finish(PROCESS.tail_settled())  # type: ignore[union-attr]
            self._end_session()
        if getattr(self, "renewing", None) is not None:
            self.renewing.kill(block=False)  # type: ignore[union-attr]
        if hasattr(self, "slot"):
            PROCESS.slots.release(self.slot)

    def _renew(self) -> bool:
        """Spend the refresh token for a new grant; True when one came.

        A refresh refused 401 (the session expired or was revoked) drops the grant, so
        the next connect logs in; one given up on otherwise (429/503 still there after its
        attempts) keeps it and tries again a second later. Both are reported as failures.
        """
        options = PROCESS.options
        grant = self.grant
        assert options is not None and grant is not None and grant.refresh_token is not None
        try:
            self.grant = _auth_client(self.environment, options).refresh(grant.refresh_token)
        except AuthError as exc:  # reported by the auth client
            if exc.status is None:  # no answer at all: every other user would fail too
                _abort_run(self.environment, _auth_unreachable_reason(options, str(exc)))
            if exc.status == 401:
                self.grant = None
            else:
                self.grant = replace(grant, refresh_at=time.time() + RECONNECT_PAUSE_S)
            return False
        return True

    def _renew_beside(self) -> None:
        """Refresh in a greenlet of its own when due, so that sends keep their schedule."""
        if self.grant is None or not self.grant.refresh_due():
            return
        if self.renewing is None or self.renewing.dead:
            self.renewing = gevent.spawn(self._renew)

    def _open_session(self) -> Session | None:
        process = PROCESS
        options = process.options
        assert options is not None
        plan = process.plan
        name = username(options.user_prefix, global_index(self.slot, plan.processes, plan.index))
        room = room_name(options.user_prefix, plan.index, self.slot, options.room_size)
        fire = _fire(self.environment)
        if options.target == "relay":
            session: Session = RelaySession(process.codec, process.ledger, fire, name, room)
        else:
            self.sessions += 1
            session = Session(
                process.codec, process.ledger, fire, name, room, ref_prefix=f"{self.sessions}."
            )
            session.carry_over(self.unacked)
            if self.grant is None and name in plan.tokens:
                self.grant = Grant(**plan.tokens[name])
            if self.renewing is not None:
                self.renewing.join()  # a refresh in flight spends the token: wait for its grant
            if self.grant is not None and self.grant.refresh_due():
                self._renew()  # near expiry (or refused at the last handshake)
            if self.grant is None:
                try:
                    self.grant = _auth_client(self.environment, options).token(
                        name, password_for(name)
                    )
                except AuthError as exc:  # reported by the auth client
                    if exc.status is None:  # no answer at all: every other user would fail too
                        _abort_run(self.environment, _auth_unreachable_reason(options, str(exc)))
                    return None
        joined = Event()
        session.on_joined = joined.set
        try:
            host = self.host or DEFAULT_HOST
            session.connect(
                host,
                self.grant.access_token if self.grant is not None else "",
                deflate=options.deflate,
                ssl_context=_ws_context(host, options),
            )
        except LoadTestFailure as exc:
            if isinstance(exc, HandshakeFailed) and exc.status == 401 and self.grant is not None:
                if self.grant.refresh_token is not None:  # expired or refused: refresh next time
                    self.grant = replace(self.grant, refresh_at=0.0)
                elif not options.token_file:
                    self.grant = None  # no refresh token: log in again next time
            return None
        self.session = session
        self.receiver = gevent.spawn(session.receive_forever)
        try:
            session.join()
        except OSError:
            self._end_session()  # closed at once: the receiver reported why
            return None
        if not joined.wait(JOIN_TIMEOUT_S):
            session._fail(CONNECT, LoadTestFailure("no joined reply"))
            self._end_session()
            return None
        process.connected += 1
        return session

    def _send_until_closed(self, session: Session) -> None:
        process = PROCESS
        options = process.options
        assert options is not None and session.conn is not None
        conn = session.conn
        low, high = options.pause_s
        process.gate.wait()
        next_at = time.monotonic() + random.uniform(0, high)
        while not conn.ended:
            self._renew_beside()
            if not process.sending.is_set():
                process.sending.wait(1.0)
                next_at = time.monotonic() + random.uniform(0, high)
                continue
            delay = next_at - time.monotonic()
            if delay > 0:
                gevent.sleep(delay)
                continue
            process.ledger.note_send_lateness(-delay)
            try:
                if session.retry_due:
                    session.resend_due()
                session.send_chat()
            except OSError:
                break  # the receiver reports why the connection ended
            next_at += random.uniform(low, high)
            now = time.monotonic()
            if now - next_at > BACKLOG_LIMIT_S:
                next_at = now  # this far behind: drop the backlog rather than burst

    def _end_session(self) -> None:
        session, self.session = self.session, None
        if session is None:
            return
        if session.join_seq is not None and session.conn is not None:
            PROCESS.connected -= 1
        self.unacked = session.unacked_sends()
        session.close()
        if self.receiver is not None:
            self.receiver.kill(block=False)
            self.receiver = None


# ---- the shape ---------------------------------------------------------------------


class ChatShape(LoadTestShape):
    """The run's stage table on Locust's clock; tells every process when the run goes quiet."""

    def __init__(self) -> None:
        super().__init__()
        self.hold = False
        self._schedule: Schedule | None = None
        self._quiet = False

    def reset_time(self) -> None:
        """Restart the table from its first stage (and re-read the options)."""
        super().reset_time()
        self._schedule = None
        self._quiet = False

    def tick(self) -> tuple[int, float] | None:
        """The current stage's (users, spawn rate), or None when the table is over."""
        if self.hold:  # tokens are being fetched: the table has not started yet
            self.reset_time()
        if self._schedule is None:
            assert self.runner is not None
            self._schedule = resolve_options(self.runner.environment.parsed_options).schedule
        step = self._schedule.at(self.get_run_time())
        if step is None:
            return None
        if step.quiet != self._quiet:
            self._quiet = step.quiet
            assert self.runner is not None
            self.runner.send_message(_PHASE_MESSAGE, {"quiet": step.quiet})
        return step.users, step.spawn_rate


# ---- events: start, phases, monitoring, end ----------------------------------------------


@events.init.add_listener
def _on_init(environment: Environment, **_kwargs: Any) -> None:
    try:
        resolve_options(environment.parsed_options)
    except ValueError as exc:
        log.error("bad option: %s", exc)
        sys.exit(2)
    runner = environment.runner
    if runner is None:
        return
    if not isinstance(runner, MasterRunner):
        runner.register_message(_PLAN_MESSAGE, _on_plan)
        runner.register_message(_PHASE_MESSAGE, _on_phase)
    else:
        runner.register_message(_ABORT_MESSAGE, _on_abort)


def _on_plan(environment: Environment, msg: Any, **_kwargs: Any) -> None:
    data = msg.data
    PROCESS.plan = Plan(data["processes"], data["index"], data["tokens"])


def _on_phase(environment: Environment, msg: Any, **_kwargs: Any) -> None:
    PROCESS.set_quiet(msg.data["quiet"])


def _on_abort(environment: Environment, msg: Any, **_kwargs: Any) -> None:
    _abort_run(environment, str(msg.data))


@events.test_start.add_listener
def _on_test_start(environment: Environment, **_kwargs: Any) -> None:
    options = resolve_options(environment.parsed_options)
    runner = environment.runner
    _final.clear()
    _ran[:] = [True]
    _aborted.clear()
    if not isinstance(runner, WorkerRunner) and options.target == "chat" and not options.token_file:
        why = _unreachable(options.auth_url, options.ca_file)
        if why is not None:  # before any user starts: one line, not a failed login per user
            _abort_run(environment, _auth_unreachable_reason(options, why))
            return
    PROCESS.reset(options)  # on the master too: it counts its own prelogin's auth retries
    if isinstance(runner, MasterRunner):
        _worker_snapshots.clear()
        _make_plans(environment, runner, options)
        return
    PROCESS.runner = runner
    if not isinstance(runner, WorkerRunner):
        _make_plans(environment, runner, options)
    PROCESS.monitor = gevent.spawn(_watch_generator, environment)


def _make_plans(environment: Environment, runner: Runner, options: Options) -> None:
    """Name every process's users and, for prelogin or a token file, get their tokens first."""
    if isinstance(runner, MasterRunner):
        workers = sorted(runner.clients.values(), key=lambda c: runner.get_worker_index(c.id))
        targets = [(runner.get_worker_index(c.id), c.id) for c in workers]
    else:
        targets = [(0, None)]
    processes = max(len(targets), 1)
    indexes = [index for index, _ in targets]
    if len(set(indexes)) != len(indexes) or max(indexes, default=0) >= processes:
        # worker indexes are not 0..N-1 (a worker left and came back): renumber densely
        targets = [(i, client_id) for i, (_, client_id) in enumerate(targets)]
    per_process = math.ceil(options.schedule.peak_users / processes)
    names = {
        index: [
            username(options.user_prefix, global_index(slot, processes, index))
            for slot in range(per_process)
        ]
        for index, _ in targets
    }
    tokens = _tokens(environment, options, [n for group in names.values() for n in group])
    shape = environment.shape_class
    for index, client_id in targets:
        plan = {
            "processes": processes,
            "index": index,
            "tokens": {n: tokens[n] for n in names[index] if n in tokens},
        }
        if client_id is None:
            PROCESS.plan = Plan(processes, index, plan["tokens"])
        else:
            runner.send_message(_PLAN_MESSAGE, plan, client_id)
    if shape is not None and not isinstance(runner, MasterRunner):
        shape.reset_time()  # the table starts once the tokens are there


def _tokens(
    environment: Environment, options: Options, names: list[str]
) -> dict[str, dict[str, Any]]:
    """Grants for ``names`` (as dicts, to be sent to workers): from ``--token-file`` (no
    refresh token: such a user is refused at its first handshake past the token's ``exp``,
    and keeps being refused), or logged in now for prelogin, or none."""
    if options.target != "chat":
        return {}
    if options.token_file:
        with open(options.token_file, encoding="utf-8") as f:
            table = json.load(f)
        return {n: asdict(Grant.from_token(table[n])) for n in names if n in table}
    if options.auth_mode != "prelogin":
        return {}
    shape = environment.shape_class
    if isinstance(shape, ChatShape):
        shape.hold = True
    auth = _auth_client(environment, options)
    tokens: dict[str, dict[str, Any]] = {}

    def fetch(name: str) -> None:
        with suppress(LoadTestFailure):  # reported; that user logs in itself when it starts
            tokens[name] = asdict(auth.token(name, password_for(name)))

    started = time.monotonic()
    try:
        Pool(PRELOGIN_CONCURRENCY).map(fetch, names)
    finally:
        if isinstance(shape, ChatShape):
            shape.hold = False
    log.info(
        "prelogin: %d of %d tokens in %.1f s", len(tokens), len(names), time.monotonic() - started
    )
    return tokens


@events.spawning_complete.add_listener
def _on_spawning_complete(user_count: int, **_kwargs: Any) -> None:
    if not PROCESS.gate.is_set() and PROCESS.options is not None:
        gevent.spawn(_open_gate_when_connected)


def _open_gate_when_connected() -> None:
    """Prelogin: let users send once every user of this process has joined (or after a timeout)."""
    deadline = time.monotonic() + GATE_TIMEOUT_S
    runner = PROCESS.runner
    while time.monotonic() < deadline and runner is not None:
        if PROCESS.connected >= runner.user_count:
            break
        gevent.sleep(0.05)
    else:
        log.warning("prelogin: opening the gate with %d users connected", PROCESS.connected)
    PROCESS.gate.set()


def _watch_generator(environment: Environment) -> None:
    """Every second: sample this process's CPU and late sends; report an overload as a failure."""
    proc = psutil.Process()
    proc.cpu_percent(None)
    fire = _fire(environment)
    late_seen = 0
    while True:
        gevent.sleep(1.0)
        cpu = proc.cpu_percent(None)
        process = PROCESS
        process.cpu_max = max(process.cpu_max, cpu)
        reasons = []
        if cpu > CPU_OVERLOAD_PERCENT:
            process.cpu_over_s += 1
            reasons.append(f"CPU above {CPU_OVERLOAD_PERCENT:.0f}%")
        late = process.ledger.late_sends
        if late > late_seen:
            reasons.append(f"sends behind schedule by over {LATE_SEND_THRESHOLD_S * 1000:.0f} ms")
            late_seen = late
        if reasons:
            process.overload_seconds += 1
            fire(
                request_type=GEN,
                name=OVERLOAD,
                response_time=None,
                response_length=0,
                exception=GeneratorOverload(" and ".join(reasons)),
                context={},
            )


@events.test_stop.add_listener
def _on_test_stop(environment: Environment, **_kwargs: Any) -> None:
    if PROCESS.monitor is not None:
        PROCESS.monitor.kill(block=False)
        PROCESS.monitor = None


@events.report_to_master.add_listener
def _on_report_to_master(client_id: str, data: dict[str, Any], **_kwargs: Any) -> None:
    data["chatlab"] = PROCESS.snapshot()


@events.worker_report.add_listener
def _on_worker_report(client_id: str, data: dict[str, Any], **_kwargs: Any) -> None:
    if "chatlab" in data:
        _worker_snapshots[client_id] = data["chatlab"]


def _totals(environment: Environment) -> dict[str, Any]:
    """Every process's counters added up (maxima for the maxima)."""
    snapshots = (
        list(_worker_snapshots.values())
        if isinstance(environment.runner, MasterRunner)
        else [PROCESS.snapshot()]
    )
    totals: dict[str, Any] = {"processes": len(snapshots)}
    if isinstance(environment.runner, MasterRunner):  # its prelogin's retries
        snapshots.append({"auth_retried": PROCESS.ledger.auth_retried})
    for snapshot in snapshots:
        for key, value in snapshot.items():
            if key.startswith(("max_", "cpu_max")):
                totals[key] = max(totals.get(key, 0), value)
            else:
                totals[key] = totals.get(key, 0) + value
    return totals


@events.quitting.add_listener
def _on_quitting(environment: Environment, **_kwargs: Any) -> None:
    if isinstance(environment.runner, WorkerRunner):
        return
    try:
        options = resolve_options(environment.parsed_options)
    except ValueError:
        return
    if not _ran:
        return  # no test was started (a web UI closed before any run)
    if _aborted:
        environment.process_exit_code = ABORT_EXIT_CODE
        return  # nothing was measured to judge
    fanout = environment.stats.get(FANOUT, WS)
    verdicts = judge(options.slo, fanout.get_response_time_percentile, fanout.num_requests)
    totals = _totals(environment)
    broken = [v for v in verdicts if not v.passed]
    if broken:
        environment.process_exit_code = 1
    report = {
        "target": options.target,
        "stages": options.stages_source,
        "pause_s": list(options.pause_s),
        "room_size": options.room_size,
        "deliveries": {
            k: totals.get(k, 0)
            for k in (
                "sent",
                "acked",
                "delivered",
                "missing",
                "unacked",
                "duplicates",
                "server_errors",
                "unexpected_closes",
                "connects",
                "retried",
                "acked_after_retry",
            )
        },
        "auth": {"retried": totals.get("auth_retried", 0)},
        "generator": {
            "processes": totals.get("processes", 0),
            "cpu_max_percent": totals.get("cpu_max_percent", 0),
            "cpu_over_90_s": totals.get("cpu_over_90_s", 0),
            "late_sends": totals.get("late_sends", 0),
            "late_threshold_ms": LATE_SEND_THRESHOLD_S * 1000,
            "max_lateness_ms": totals.get("max_lateness_ms", 0),
            "overloaded": bool(totals.get("overload_seconds", 0)),
        },
        "fanout": {
            "count": fanout.num_requests,
            "failures": fanout.num_failures,
            **{
                f"p{q * 100:g}_ms": fanout.get_response_time_percentile(q)
                for q in (0.5, 0.9, 0.95, 0.99)
            },
        },
        "slo": {
            "passed": not broken,
            "thresholds": [v.__dict__ for v in verdicts],
        },
    }
    _final.update(report)
    if options.delivery_report:
        Path(options.delivery_report).parent.mkdir(parents=True, exist_ok=True)
        Path(options.delivery_report).write_text(json.dumps(report, indent=2) + "\n")


@events.quit.add_listener
def _on_quit(exit_code: int, **_kwargs: Any) -> None:
    if _aborted:
        print(f"\nchatlab: run stopped: {_aborted[0]}", flush=True)
    elif _final:
        print(_verdict_text(_final), flush=True)


def _verdict_text(report: dict[str, Any]) -> str:
    """The short table printed at the end of a run."""
    d, g, f = report["deliveries"], report["generator"], report["fanout"]
    retried_auth = report["auth"]["retried"]
    lines = [
        "",
        f"chatlab verdict ({report['stages']}, target {report['target']})",
        f"  fanout: {f['count']} deliveries timed, p50 {f['p50_ms']} / p90 {f['p90_ms']} / "
        f"p95 {f['p95_ms']} / p99 {f['p99_ms']} ms",
        f"  deliveries: sent {d['sent']}, acked {d['acked']}, delivered {d['delivered']}, "
        f"missing {d['missing']}, unacked {d['unacked']}, duplicates {d['duplicates']}, "
        f"server errors {d['server_errors']}, unexpected closes {d['unexpected_closes']}, "
        f"retried {d['retried']} (acked after a retry {d['acked_after_retry']})",
        f"  auth: calls answered 429/503 and retried after Retry-After: {retried_auth}"
        " (not failures; one given up on is)",
        f"  generator: {g['processes']} process(es), CPU max {g['cpu_max_percent']:.0f}% "
        f"(above 90% for {g['cpu_over_90_s']} s), sends late by over "
        f"{g['late_threshold_ms']:.0f} ms: {g['late_sends']} (max {g['max_lateness_ms']:.0f} ms)",
    ]
    thresholds = report["slo"]["thresholds"]
    if thresholds:
        lines.append(f"  {'threshold':<10}{'limit ms':>10}{'measured ms':>13}  result")
        for v in thresholds:
            measured = "-" if v["measured_ms"] is None else f"{v['measured_ms']:.0f}"
            result = "ok" if v["passed"] else "BROKEN"
            lines.append(f"  {v['name']:<10}{v['limit_ms']:>10.0f}{measured:>13}  {result}")
        lines.append("  SLO: " + ("passed" if report["slo"]["passed"] else "BROKEN (exit code 1)"))
    if g["overloaded"]:
        lines.append(
            "WARNING: the load generator was overloaded (CPU above 90% or sends behind "
            "schedule): latencies include its own delay; use --processes or fewer users"
        )
    return "\n".join(lines)


def main() -> None:
    """``python -m loadtest.chat --help``: Locust's help with this file's options in it.

    Locust prints ``--help`` before it imports the locustfile (locustio/locust#2917), so
    ``locust -f loadtest/chat.py --help`` cannot list them; runs still go through ``locust``.
    """
    from locust.argument_parser import get_parser  # noqa: PLC0415  (only for --help)

    get_parser().print_help()


if __name__ == "__main__":
    main()
