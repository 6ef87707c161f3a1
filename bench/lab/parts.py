"""The scaling function's parts, read from a lab run's Results (``--matrix scaling``).

No I/O: :func:`parts_of` turns a :class:`~bench.lab.results.Results` into
:class:`~bench.lab.scaling.Parts`, each figure over the run's repeats with its range and
its source; :func:`check_of` sets the prediction for the held-out spread (``WORKERS=2``)
against what it measured. Configurations are told apart by their settings, not their
names:

- ``BROKER=memory`` (one process): CPU per frame and knee, quoted beside the terms;
- ``BROKER=redis`` with ``WORKERS=k``: rooms of ``m`` spread over ``k`` processes (on
  average :func:`~bench.lab.scaling.random_spread`); ``k = 1`` gives ``u1``, the knee and
  Redis' cost at spread 1, the largest ``k`` the slopes, a ``k`` between them the check;
- ``BROKER=redis`` with ``REDIS_CLUSTER=on`` (one process): a cluster's figures, which
  then stand for each primary instead of one Redis'.

Chat CPU is the driver's reading of the server's process tree over each cost step's
window (the supervisor and every worker); Redis' CPU is the sampler's over the same
window (its mean share of a core times the window), divided by the step's commits
(sends) for Redis' CPU per message.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from bench.lab.ladder import climb_slo, rungs_of
from bench.lab.plots import samples_during
from bench.lab.results import Results, Run, Step, parse_slo
from bench.lab.scaling import Check, Figure, Parts, fit_slope, random_spread


@dataclass
class Measured:
    """One configuration's cost steps at one offered rate, per repeat (None: not read)."""

    config: str
    processes: int
    spread: float
    chat_us_per_frame: list[float | None] = field(default_factory=list)
    redis_us_per_message: list[float | None] = field(default_factory=list)
    tier_us_per_frame: list[float | None] = field(default_factory=list)
    held: list[bool] = field(default_factory=list)


def _role(env: dict[str, str]) -> tuple[str, int] | None:
    """("memory" | "redis" | "cluster", processes) for a configuration the parts use."""
    if env.get("REGRESSION", "off") != "off" or env.get("PROFILE", "off") != "off":
        return None
    workers = int(env.get("WORKERS", "1") or 1)
    broker = env.get("BROKER", "memory")
    if broker == "memory":
        return ("memory", 1) if workers == 1 else None
    if env.get("REDIS_CLUSTER", "off") == "on":
        return ("cluster", workers) if workers == 1 else None
    return ("redis", workers)


def _configs(results: Results) -> dict[tuple[str, int], str]:
    """Each role's configuration (the first of an A/A pair; chat targets only)."""
    found: dict[tuple[str, int], str] = {}
    for name, described in results.configs.items():
        if described.get("target", "chat") != "chat" or described.get("same_as"):
            continue
        role = _role(dict(described.get("env") or {}))
        if role is not None and role not in found:
            found[role] = name
    return found


def _runs(results: Results, config: str) -> list[Run]:
    return sorted(
        (r for r in results.runs if r.config == config and r.status == "ok"),
        key=lambda r: r.repeat,
    )


def _cost_step(run: Run, rate: float) -> Step | None:
    return next(
        (
            s
            for s in run.steps
            if s.driver == "fast" and s.cost and not s.superseded and s.offered_per_s == rate
        ),
        None,
    )


def redis_cpu_s(run: Run, step: Step) -> float | None:
    """Redis' CPU seconds over ``step``'s window, from the samples inside it (None: none)."""
    samples, inside = samples_during(run, "redis", step)
    if not inside:
        return None
    window = step.window_s or step.duration_s
    return statistics.fmean(s.cpu_percent for s in samples) / 100 * window


def measured_at(results: Results, config: str, processes: int, rate: float, m0: int) -> Measured:
    """``config``'s figures at cost rate ``rate``, per repeat."""
    found = Measured(config, processes, random_spread(processes, m0))
    for run in _runs(results, config):
        step = _cost_step(run, rate)
        chat = step.server_us_per_frame if step is not None else None
        redis = redis_cpu_s(run, step) if step is not None else None
        per_message = redis * 1e6 / step.sent if step and redis is not None and step.sent else None
        tier = (
            (step.server_cpu_s + redis) * 1e6 / step.delivered  # type: ignore[operator]
            if step and chat is not None and redis is not None
            else None
        )
        found.chat_us_per_frame.append(chat)
        found.redis_us_per_message.append(per_message)
        found.tier_us_per_frame.append(tier)
        found.held.append(step is not None and step.holds({"p99": 100.0}))
    return found


def cost_rate(results: Results, configs: list[str]) -> float | None:
    """The offered rate the parts are read at: the highest cost rate at which every
    repeat of every one of ``configs`` held p99 < 100 ms (below saturation), else the
    lowest cost rate they all ran."""
    rates: set[float] | None = None
    for config in configs:
        mine = {
            s.offered_per_s
            for r in _runs(results, config)
            for s in r.steps
            if s.cost and s.offered_per_s
        }
        rates = mine if rates is None else rates & mine
    if not rates:
        return None
    held = [
        rate
        for rate in rates
        if all(
            (s := _cost_step(r, rate)) is not None and s.holds({"p99": 100.0})
            for c in configs
            for r in _runs(results, c)
        )
    ]
    return max(held) if held else min(rates)


def knee_of(results: Results, config: str, slo_text: str, label: str) -> Figure | None:
    """``config``'s knee under ``slo_text`` over its repeats (the ladder's rung, judged
    under that SLO: one looser than the climb's makes it a lower bound)."""
    slo = parse_slo(slo_text)
    rung = next((r for r in rungs_of(results, slo) if r.config == config), None)
    if rung is None:
        return None
    climbed = climb_slo(results, config) or {}
    lower = rung.lower_bound or any(slo.get(k, 0) > v for k, v in climbed.items())
    figure = Figure.of(
        rung.knees,
        "delivered/s",
        f"{label}, '{config}': fast-driver climb to {slo_text} (median of repeats)",
    )
    if figure is None:
        return None
    return Figure(**{**figure.__dict__, "lower_bound": lower})


def _per_repeat(a: list[float | None], b: list[float | None]) -> list[tuple[float, float]]:
    return [(x, y) for x, y in zip(a, b, strict=False) if x is not None and y is not None]


def _run_label(results: Results) -> str:
    commit = results.machine.get("commit") or "?"
    return f"{results.matrix} run {results.started} (commit {commit})"


def parts_of(results: Results, slo_text: str = "p99=100") -> Parts:
    """The scaling function's terms as ``results`` measured them, under ``slo_text``."""
    label = _run_label(results)
    roles = _configs(results)
    spreads = sorted(k for role, k in roles if role == "redis")
    first_load = next(iter(results.configs.values()), {}).get("load") or {}
    m0 = int(first_load.get("room_size") or 10)
    connections = int(first_load.get("connections") or 0)
    caveats: list[str] = []
    notes: dict[str, Figure] = {}
    parts: dict[str, Figure | None] = {}
    redis_configs = [roles["redis", k] for k in spreads]
    rate = cost_rate(results, redis_configs) if redis_configs else None
    at = f"cost step {rate:g} sends/s" if rate else ""
    measured = {k: measured_at(results, roles["redis", k], k, rate, m0) for k in spreads if rate}
    if 1 in measured:
        one = measured[1]
        parts["u1"] = Figure.of(
            one.chat_us_per_frame,
            "µs/frame",
            f"{label}, '{one.config}' ({at}): server CPU over delivered frames",
        )
        parts["knee"] = knee_of(results, one.config, slo_text, label)
        caveats.append(
            "the knee on Redis was measured with Redis on the chat process' core (the lab "
            "pins them together): a process whose Redis runs elsewhere holds more"
        )
        high = max(measured)
        if high > 1:
            top = measured[high]
            beta = [
                fit_slope(1, a, top.spread, b)
                for a, b in _per_repeat(one.chat_us_per_frame, top.chat_us_per_frame)
            ]
            source = (
                f"{label}: ('{top.config}' - '{one.config}') / ({top.spread:.2f} - 1) "
                f"processes per room, CPU per delivered frame ({at})"
            )
            parts["beta"] = Figure.of(beta, "µs/frame per process", source)
            pairs = _per_repeat(one.redis_us_per_message, top.redis_us_per_message)
            delivery = [fit_slope(1, a, top.spread, b) for a, b in pairs]
            commit = [a - d for (a, _), d in zip(pairs, delivery, strict=True)]
            parts["redis_delivery_us"] = Figure.of(
                delivery,
                "µs",
                f"{label}: Redis CPU per send, ('{top.config}' - '{one.config}') / "
                f"({top.spread:.2f} - 1) ({at}; Redis' CPU from the sampler)",
            )
            parts["redis_commit_us"] = Figure.of(
                commit,
                "µs",
                f"{label}: Redis CPU per send at '{one.config}' less one delivery ({at})",
            )
            for name in ("beta", "redis_delivery_us"):
                figure = parts.get(name)
                if figure is not None and figure.value < 0:
                    caveats.append(f"{name} measured below zero ({figure.text(2)}): taken as 0")
    for k, m in measured.items():
        figure = Figure.of(
            m.tier_us_per_frame,
            "µs/frame",
            f"{label}, '{m.config}' ({at}): (server + Redis CPU) / delivered frames",
        )
        if figure is not None:
            notes[f"tier at {k} process(es)"] = figure
    if ("memory", 1) in roles:
        config = roles["memory", 1]
        memory_rate = cost_rate(results, [config])
        if memory_rate:
            m = measured_at(results, config, 1, memory_rate, m0)
            figure = Figure.of(
                m.chat_us_per_frame,
                "µs/frame",
                f"{label}, '{config}' (cost step {memory_rate:g} sends/s)",
            )
            if figure is not None:
                notes["BROKER=memory CPU per frame"] = figure
        knee = knee_of(results, config, slo_text, label)
        if knee is not None:
            notes["BROKER=memory knee"] = knee
    _cluster(
        results,
        roles,
        parts=parts,
        notes=notes,
        caveats=caveats,
        slo_text=slo_text,
        m0=m0,
        label=label,
    )
    extra = results.parts
    parts["logins_per_cpu_s"] = Figure.of(
        extra.get("logins_per_cpu_s") or [],
        "logins/CPU-s",
        f"{label}: argon2 verifications per CPU-second, {extra.get('argon2', '?')}",
    )
    parts["refreshes_per_cpu_s"] = Figure.of(
        extra.get("refreshes_per_cpu_s") or [],
        "refreshes/CPU-s",
        f"{label}: POST /refresh answered per CPU-second of the auth service, "
        f"{extra.get('refresh_clients', '?')} clients in a loop",
    )
    parts["bytes_per_connection"] = Figure.of(
        extra.get("bytes_per_connection") or [],
        "bytes",
        f"{label}: bench.memory, RSS per idle connection over "
        f"{extra.get('memory_connections', '?')} connections",
    )
    return Parts(
        room_size=m0,
        connections=connections,
        slo=slo_text,
        notes=notes,
        caveats=tuple(caveats),
        **parts,  # type: ignore[arg-type]
    )


def _cluster(
    results: Results,
    roles: dict[tuple[str, int], str],
    *,
    parts: dict[str, Figure | None],
    notes: dict[str, Figure],
    caveats: list[str],
    slo_text: str,
    m0: int,
    label: str,
) -> None:
    """Put a Redis Cluster's figures in place of one Redis' when the run measured one."""
    skipped = (results.parts.get("skipped") or {}).items()
    config = roles.get(("cluster", 1))
    rate = cost_rate(results, [config]) if config else None
    if config is None or rate is None:
        why = "; ".join(f"{name}: {reason}" for name, reason in skipped) or "not in the run"
        caveats.append(
            "one Redis' figures stand in for each primary of a Redis Cluster: the "
            f"cluster was not measured ({why}); the replication to each primary's "
            "replica is not in them"
        )
        return
    m = measured_at(results, config, 1, rate, m0)
    at = f"cost step {rate:g} sends/s"
    u1 = Figure.of(m.chat_us_per_frame, "µs/frame", f"{label}, '{config}' ({at})")
    knee = knee_of(results, config, slo_text, label)
    delivery = parts.get("redis_delivery_us")
    commit = None
    if delivery is not None:
        commit = Figure.of(
            [v - delivery.value for v in m.redis_us_per_message if v is not None],
            "µs",
            f"{label}, '{config}': every node's CPU per send ({at}) less one delivery at "
            "one Redis' cost",
        )
    for name, figure in (("u1", u1), ("knee", knee), ("redis_commit_us", commit)):
        if figure is not None:
            if parts.get(name) is not None:
                notes[f"one Redis: {name}"] = parts[name]  # type: ignore[assignment]
            parts[name] = figure
    caveats.append(
        "a Redis Cluster's figures (every node's CPU summed, replicas included) stand for "
        "each primary: conservative per primary"
    )


def check_of(results: Results) -> Check | None:
    """Predicted against measured CPU µs per delivered frame (chat processes plus Redis)
    at a spread between 1 and the largest measured (``WORKERS=2`` of 1, 2, 4): the
    prediction from spread 1 and the largest alone, repeat by repeat. None without three
    spreads."""
    roles = _configs(results)
    spreads = sorted(k for role, k in roles if role == "redis")
    if len(spreads) < 3 or spreads[0] != 1:
        return None
    held_out = 2 if 2 in spreads[1:-1] else spreads[1]
    high = spreads[-1]
    first_load = next(iter(results.configs.values()), {}).get("load") or {}
    m0 = int(first_load.get("room_size") or 10)
    rate = cost_rate(results, [roles["redis", k] for k in spreads])
    if rate is None:
        return None
    one, mid, top = (
        measured_at(results, roles["redis", k], k, rate, m0) for k in (1, held_out, high)
    )
    predicted, chat_part, redis_part = [], [], []
    for u_a, u_b, r_a, r_b in zip(
        one.chat_us_per_frame,
        top.chat_us_per_frame,
        one.redis_us_per_message,
        top.redis_us_per_message,
        strict=False,
    ):
        if None in (u_a, u_b, r_a, r_b):
            continue
        chat = u_a + fit_slope(1, u_a, top.spread, u_b) * (mid.spread - 1)  # type: ignore[operator,arg-type]
        redis = r_a + fit_slope(1, r_a, top.spread, r_b) * (mid.spread - 1)  # type: ignore[operator,arg-type]
        predicted.append(chat + redis / m0)
        chat_part.append(chat)
        redis_part.append(redis / m0)
    label = _run_label(results)
    at = f"cost step {rate:g} sends/s"
    pred = Figure.of(
        predicted,
        "µs/frame",
        f"{label}: from '{one.config}' and '{top.config}' ({at})",
    )
    meas = Figure.of(mid.tier_us_per_frame, "µs/frame", f"{label}, '{mid.config}' ({at})")
    if pred is None or meas is None or meas.value <= 0:
        return None
    chat_meas = [v for v in mid.chat_us_per_frame if v is not None]
    redis_meas = [v / m0 for v in mid.redis_us_per_message if v is not None]

    def pair(a: list[float], b: list[float]) -> tuple[float, float] | None:
        return (statistics.median(a), statistics.median(b)) if a and b else None

    return Check(
        held_out,
        mid.spread,
        pred,
        meas,
        chat=pair(chat_part, chat_meas),
        redis=pair(redis_part, redis_meas),
    )
