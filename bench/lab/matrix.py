"""Lab matrices: small TOML files in ``bench/matrices/`` naming configurations to compare.

A matrix names its configurations (each a set of the server's ``.env`` toggles, or the
bare relay), the load every configuration gets (fast-driver rates and one Locust
profile), the baseline every ratio is taken against, and an A/A pair (a configuration
repeated under another name with ``same_as``) whose difference is the run's noise floor.
See ``bench/matrices/demo.toml`` for a commented example.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bench.lab.pairs import MIN_PAIRS
from bench.memory import TRAFFIC_MODES
from bench.relay_base import DEFAULT_MODES, MODES
from loadtest.profiles import PROFILES

MATRICES_DIR = Path(__file__).resolve().parent.parent / "matrices"

TARGETS = ("chat", "relay")
#: where a chat configuration's TLS is (``Config.tls``): none, in the server itself
#: (``TLS_CERT_FILE``), or at HAProxy in front of it, the hop behind plain
#: (:mod:`chatlab.front_door`, as ``deploy/haproxy``); the lab makes a throwaway
#: certificate for either
TLS_MODES = ("off", "server", "proxy")
AUTH_MODES = ("prelogin", "login")
#: a climb's steps at most (for time estimates and timeouts: doubling up, then bisecting)
MAX_CLIMB_STEPS = 14
#: a climb waits up to this long after a broken step for the target to catch up
CLIMB_SETTLE_S = 8.0


#: ``WS_DEFLATE`` values under which the chat server accepts permessage-deflate (with
#: context takeover, or shared): the fast driver then offers it, as browsers do
DEFLATE_VALUES = ("on", "shared")


def offers_deflate(env: dict[str, str]) -> bool:
    """Whether a configuration's server accepts permessage-deflate (the fast driver then
    offers it and is measured with it)."""
    return env.get("WS_DEFLATE") in DEFLATE_VALUES


class MatrixError(ValueError):
    """A matrix file that cannot be used; the message names the file and the problem."""


@dataclass(frozen=True)
class Load:
    """What every configuration of a matrix is driven with."""

    connections: int = 200  # fast driver: connections, in rooms of room_size
    room_size: int = 10
    rates: tuple[float, ...] = (2000.0,)  # fast driver: messages/s sent, one step each
    step_s: float = 5.0
    warmup_s: float = 2.0
    drain_s: float = 1.0
    locust_profile: str = "smoke"  # a loadtest/profiles.py name, or "" for no Locust run
    locust_stages: str = ""  # overrides the profile's stages (same syntax as --stages)
    settle_s: float = 1.0  # idle time after the server is up, before the first driver
    # a capacity climb instead of fixed rates: the SLO (e.g. "p99=100"); the fast driver
    # starts at rates[0], multiplies by ``factor`` while the SLO holds, then bisects
    # between the last rate held and the first broken until within ``resolution``
    climb: str = ""
    factor: float = 1.4
    resolution: float = 0.05
    max_rate: float = 0.0  # the climb's highest offered rate (0: none)
    # fixed offered rates (messages/s sent) run before the climb or the rates, one step of
    # ``cost_step_s`` each: the server's CPU µs per delivered frame at a stated load
    cost_rates: tuple[float, ...] = ()
    cost_step_s: float = 4.0
    # the message body's length the fast driver sends (0: the driver's least, 60)
    body_chars: int = 0
    # the matrix's [load] only: rounds of the paired cost phase (bench.lab.pairs). The
    # configurations with cost_rates that can share the server's core (one process, the
    # lab's pinning) are started together and their cost steps taken one at a time, A B
    # B A, this many rounds; the others keep their cost steps in each run (0: all do)
    pairs: int = 0
    # after the climb, one step this long at 90 % of its knee: whether the knee holds
    # sustained (0: none; the knee is then a burst's, from steps of step_s)
    sustain_s: float = 0.0
    # after each run of a chat configuration, on a server of its own with its settings
    # (bench.lab.side): bytes on the wire per delivered message for three body sets
    # (bench.wire; this many messages per member and set, 0: not measured), and memory per
    # connection over this many connections (bench.memory, each ``memory_traffic`` mode:
    # idle, after; 0: not measured)
    wire_messages: int = 0
    memory_connections: int = 0
    memory_traffic: tuple[str, ...] = ("idle", "after")

    def side_s(self) -> float:
        """About how many seconds the side measurements take after one run."""
        wire = 3.0 + 0.1 * self.wire_messages if self.wire_messages else 0.0
        memory = len(self.memory_traffic) * (4 + self.memory_connections / 700)
        return wire + (memory if self.memory_connections else 0.0)

    def fast_duration_s(self) -> float:
        """Seconds one fast-driver run takes (connects not counted; a climb: its most)."""
        steps = MAX_CLIMB_STEPS if self.climb else len(self.rates)
        settle = CLIMB_SETTLE_S if self.climb else 0.0
        costs = len(self.cost_rates) * (self.cost_step_s + self.drain_s)
        costs += self.sustain_s + self.drain_s if self.sustain_s and self.climb else 0.0
        return self.warmup_s + costs + steps * (self.step_s + self.drain_s + settle)

    def climb_steps_expected(self, holds_to_cap: bool = False) -> int:
        """About how many steps a climb takes: up by ``factor`` until a step breaks, then
        the bisection, about 8 on the lab's rungs (the demo's chat runs: 7.9 on average);
        for a server expected to hold up to ``max_rate`` (a floor relay), the start rate
        and the steps up to the cap (the demo's relays: 5)."""
        if not self.climb:
            return len(self.rates)
        if not holds_to_cap:
            return 8
        return 1 + math.ceil(math.log(self.max_rate / min(self.rates)) / math.log(self.factor))

    def locust_duration_s(self) -> float:
        """Seconds one Locust run takes (its start-up not counted)."""
        if not self.locust_profile:
            return 0.0
        if self.locust_stages:
            from loadtest.profiles import parse_stages

            return sum(s.duration_s for s in parse_stages(self.locust_stages))
        return sum(s.duration_s for s in PROFILES[self.locust_profile].stages)


@dataclass(frozen=True)
class Config:
    """One configuration: a target and its toggles, and which drivers run against it."""

    name: str
    target: str = "chat"
    env: dict[str, str] = field(default_factory=dict)
    description: str = ""
    fast: bool = True  # run the fast driver's steps
    locust: bool = True  # run the Locust profile (chat target only)
    profile: bool = False  # PROFILE=cprofile: snapshots go into the report
    auth_mode: str = "prelogin"  # Locust: tokens before the run, or logins while it runs
    same_as: str = ""  # this is an A/A twin of that configuration
    load: Load | None = None  # overrides the matrix's load for this configuration
    # runs beyond the matrix's repeat, interleaved after the others: for a figure that
    # moves more between runs than the rest (a relay's knee on a shared machine)
    extra_repeats: int = 0
    tls: str = "off"  # one of TLS_MODES (chat target only)

    def slug(self) -> str:
        """The name as a directory name."""
        keep = "".join(c if c.isalnum() or c in "-_." else "-" for c in self.name.lower())
        return "-".join(part for part in keep.split("-") if part)


def shares_core(config: Config) -> bool:
    """Whether ``config`` can run beside others on the server's core in a paired cost
    phase: one process (one worker, no Redis) pinned as the lab pins it, plain or with
    TLS in the server (the paired driver verifies wss:// with the lab's CA file). Not
    behind the proxy (``tls = "proxy"``): a paired step would read the server's CPU alone
    while the verdict needs the server's and HAProxy's together, and HAProxy beside every
    paired server is one more process each idle round; its cost steps stay in its runs."""
    env = config.env
    return (
        config.fast
        and config.tls in ("off", "server")
        and env.get("WORKERS", "1") == "1"
        and env.get("CPU_AFFINITY", "server") == "server"
        and env.get("BROKER", "memory") != "redis"
    )


@dataclass(frozen=True)
class Matrix:
    """A named set of configurations, run ``repeat`` times each, interleaved."""

    name: str
    description: str
    configs: tuple[Config, ...]
    baseline: str
    aa_pair: tuple[str, str] | None
    load: Load
    repeat: int = 1
    path: Path | None = None

    def config(self, name: str) -> Config:
        """The configuration called ``name``."""
        for config in self.configs:
            if config.name == name:
                return config
        raise KeyError(name)

    def load_of(self, config: Config) -> Load:
        """The load ``config`` gets (in its runs: without the cost rates the paired
        phase measures, :meth:`paired`)."""
        load = config.load or self.load
        if load.cost_rates and config in self.paired():
            return replace(load, cost_rates=())
        return load

    def paired(self) -> tuple[Config, ...]:
        """The configurations whose cost steps the paired phase takes (those with cost
        rates that can share the server's core, :func:`shares_core`: plain or TLS in the
        server, not behind the proxy, whose cost steps stay unpaired in its runs), when
        the matrix asks for pairs and at least two qualify; else none."""
        if self.load.pairs <= 0:
            return ()
        found = tuple(
            c for c in self.configs if (c.load or self.load).cost_rates and shares_core(c)
        )
        return found if len(found) >= 2 else ()

    def paired_estimate_s(self) -> float:
        """Rough seconds of the paired cost phase (starts, connections, warm-ups, steps)."""
        configs = self.paired()
        if not configs:
            return 0.0
        steps = sum(len((c.load or self.load).cost_rates) for c in configs)
        step_s = self.load.cost_step_s + min(self.load.drain_s, 0.2) + 0.2
        return len(configs) * (4 + self.load.warmup_s) + self.load.pairs * steps * step_s

    def estimate_s(self, repeat: int, per_run_overhead_s: float = 3.0) -> float:
        """Rough seconds the whole matrix takes, for the progress bar."""
        total = 0.0
        for config in self.configs:
            load = self.load_of(config)
            run_s = per_run_overhead_s + load.settle_s
            if config.fast:
                # a floor relay is the matrix's fastest server: its climbs end at the cap
                steps = load.climb_steps_expected(holds_to_cap=config.target == "relay")
                # (the demo's runs took what this counts: a further 2 s per run and 3 s
                # of settling after broken steps, counted until 2026-11, were not spent)
                run_s += load.warmup_s + steps * (load.step_s + load.drain_s)
                run_s += len(load.cost_rates) * (load.cost_step_s + load.drain_s)
                if load.climb and load.sustain_s:
                    run_s += load.sustain_s + load.drain_s + 1
            if config.locust and config.target == "chat" and load.locust_profile:
                run_s += load.locust_duration_s() + 4
            if config.target == "chat":
                run_s += load.side_s()
            total += run_s * (repeat + config.extra_repeats)
        return total + self.paired_estimate_s()


def available() -> list[str]:
    """The built-in matrices' names."""
    return sorted(p.stem for p in MATRICES_DIR.glob("*.toml"))


def _load_table(data: dict[str, Any], where: str, base: Load | None = None) -> Load:
    """A :class:`Load` from a TOML table, over ``base``."""
    config_level = base is not None
    base = base or Load()
    known = set(Load.__dataclass_fields__)
    unknown = set(data) - known
    if unknown:
        raise MatrixError(f"{where}: unknown load keys {sorted(unknown)}; known: {sorted(known)}")
    values = dict(data)
    if "rates" in values:
        values["rates"] = tuple(float(r) for r in values["rates"])
        if not values["rates"] or min(values["rates"]) <= 0:
            raise MatrixError(f"{where}: rates must be a non-empty list of positive numbers")
    if "cost_rates" in values:
        values["cost_rates"] = tuple(float(r) for r in values["cost_rates"])
        if values["cost_rates"] and min(values["cost_rates"]) <= 0:
            raise MatrixError(f"{where}: cost_rates must be positive numbers")
    if "memory_traffic" in values:
        values["memory_traffic"] = tuple(str(m) for m in values["memory_traffic"])
        if not values["memory_traffic"] or set(values["memory_traffic"]) - set(TRAFFIC_MODES):
            raise MatrixError(f"{where}: memory_traffic must name some of {TRAFFIC_MODES}")
    load = replace(base, **values)
    if config_level and "pairs" in values:
        raise MatrixError(f"{where}: pairs belongs to the matrix's [load], not a configuration's")
    if load.pairs and load.pairs < MIN_PAIRS:
        raise MatrixError(f"{where}: pairs must be 0 or at least {MIN_PAIRS}")
    if load.wire_messages < 0 or load.memory_connections < 0:
        raise MatrixError(f"{where}: wire_messages and memory_connections must be >= 0")
    if load.memory_connections % 10 and "after" in load.memory_traffic:
        raise MatrixError(f"{where}: memory_connections must be a multiple of 10 (rooms of 10)")
    if load.climb:
        from bench.lab.results import parse_slo

        try:
            parse_slo(load.climb)
        except ValueError as exc:
            raise MatrixError(f"{where}: climb {load.climb!r}: {exc}") from None
        if not load.factor > 1 or not 0 < load.resolution < load.factor - 1:
            raise MatrixError(f"{where}: a climb needs factor > 1 and 0 < resolution < factor - 1")
    if load.locust_profile and load.locust_profile not in PROFILES:
        raise MatrixError(
            f"{where}: locust_profile {load.locust_profile!r}: allowed {sorted(PROFILES)} or ''"
        )
    if load.connections < 1 or load.room_size < 1 or load.connections % load.room_size:
        raise MatrixError(f"{where}: connections must be a positive multiple of room_size")
    return load


def _check_relay_env(env: dict[str, str], where: str) -> None:
    """A relay's ``TRANSPORT`` and ``RELAY_MODE`` (``bench.relay --mode``) fit together,
    or :class:`MatrixError` says what is allowed."""
    transport = env.get("TRANSPORT", "websockets")
    if transport not in DEFAULT_MODES:
        raise MatrixError(f"{where}: TRANSPORT {transport!r}: allowed {tuple(DEFAULT_MODES)}")
    mode = env.get("RELAY_MODE", DEFAULT_MODES[transport])
    allowed = [m for m, (_, transports) in MODES.items() if transport in transports]
    if mode not in allowed:
        raise MatrixError(f"{where}: RELAY_MODE {mode!r} on {transport}: allowed {allowed}")


def load_matrix(name_or_path: str) -> Matrix:
    """Read a matrix by built-in name or path; :class:`MatrixError` says what is wrong."""
    path = Path(name_or_path)
    if not path.suffix:
        path = MATRICES_DIR / f"{name_or_path}.toml"
    if not path.exists():
        raise MatrixError(f"no matrix {name_or_path!r}: built in are {', '.join(available())}")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise MatrixError(f"{path}: {exc}") from None
    where = str(path)
    load = _load_table(data.get("load", {}), f"{where} [load]")
    configs: list[Config] = []
    for i, table in enumerate(data.get("config", [])):
        raw = dict(table)
        name = raw.get("name") or f"config {i + 1}"
        if "load" in raw:
            raw["load"] = _load_table(raw["load"], f"{where} [{name}].load", load)
        if "same_as" in raw:
            twin = next((c for c in configs if c.name == raw["same_as"]), None)
            if twin is None:
                raise MatrixError(f"{where}: {name}: same_as {raw['same_as']!r} comes first")
            raw = {**twin.__dict__, "name": name, "same_as": twin.name, **raw}
        raw["env"] = {str(k).upper(): str(v) for k, v in raw.get("env", {}).items()}
        unknown = set(raw) - set(Config.__dataclass_fields__)
        if unknown:
            raise MatrixError(f"{where}: {name}: unknown keys {sorted(unknown)}")
        config = Config(**raw)
        if config.target not in TARGETS:
            raise MatrixError(f"{where}: {name}: target {config.target!r}: allowed {TARGETS}")
        if config.target == "relay":
            _check_relay_env(config.env, f"{where}: {name}")
        if config.tls not in TLS_MODES or (config.tls != "off" and config.target != "chat"):
            raise MatrixError(f"{where}: {name}: tls {config.tls!r}: allowed {TLS_MODES} (chat)")
        if config.auth_mode not in AUTH_MODES:
            raise MatrixError(f"{where}: {name}: auth_mode {config.auth_mode!r}: {AUTH_MODES}")
        configs.append(config)
    names = [c.name for c in configs]
    if not configs or len(set(names)) != len(names):
        raise MatrixError(f"{where}: configuration names must exist and be unique: {names}")
    baseline = data.get("baseline", names[0])
    if baseline not in names:
        raise MatrixError(f"{where}: baseline {baseline!r} is not a configuration")
    twins = [c for c in configs if c.same_as]
    aa_pair = (twins[0].same_as, twins[0].name) if twins else None
    return Matrix(
        name=path.stem,
        description=data.get("description", ""),
        configs=tuple(configs),
        baseline=baseline,
        aa_pair=aa_pair,
        load=load,
        repeat=int(data.get("repeat", 1)),
        path=path,
    )


def unknown_settings(config: Config) -> list[str]:
    """The settings ``config`` gives that this checkout's chat server does not have (a
    feature not built here yet, such as ``REDIS_CLUSTER``); relays take none of them."""
    if config.target != "chat":
        return []
    from chatlab.setting_names import CHAT_SERVER

    return sorted(name for name in config.env if name not in CHAT_SERVER)


def runnable(matrix: Matrix) -> tuple[Matrix, dict[str, str]]:
    """``matrix`` without the configurations this checkout cannot run, and each one left
    out with the reason (a chat server that ignored the setting would mislabel its run)."""
    skipped = {
        c.name: f"this checkout's chat server has no setting {', '.join(names)}"
        for c in matrix.configs
        if (names := unknown_settings(c))
    }
    kept = tuple(c for c in matrix.configs if c.name not in skipped)
    if not skipped:
        return matrix, {}
    if not kept:
        raise MatrixError(f"{matrix.name}: no configuration can run here: {skipped}")
    baseline = matrix.baseline if matrix.baseline not in skipped else kept[0].name
    pair = matrix.aa_pair if matrix.aa_pair and not set(matrix.aa_pair) & set(skipped) else None
    return replace(matrix, configs=kept, baseline=baseline, aa_pair=pair), skipped
