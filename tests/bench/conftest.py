"""A scaling run's Results built from plain numbers: what ``python -m bench.lab scaling``
would save, with figures chosen so that the tests can compute the function by hand."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from bench.lab.results import Results, Run, Sample, Step, TimePoint, edge

ROOM = 10
WINDOW_S = 4.0
#: the model the fixture's cost steps follow at the higher cost rate, per repeat factor:
#: chat µs per delivered frame 20 + 2 (s - 1); Redis µs per send 25 + 5 s
CHAT_FACTORS = (1.0, 1.02, 0.99)
REDIS_FACTORS = (1.0, 1.04, 0.98)
#: the highest rate each repeat of "one Redis" held at p99 < 100 ms (x10: its knee)
KNEE_RATES = (4800.0, 5000.0, 4600.0)
LOGINS = [10.0, 11.0, 12.0]
REFRESHES = [1000.0, 1100.0, 1200.0]
BYTES = [32768.0, 33000.0, 32000.0]
SPREAD = {1: 1.0, 2: 2 * (1 - 0.5**10), 4: 4 * (1 - 0.75**10)}


CONFIGS = {
    "memory": {"WORKERS": "1", "BROKER": "memory"},
    "one Redis": {"WORKERS": "1", "BROKER": "redis"},
    "one Redis (A/A)": {"WORKERS": "1", "BROKER": "redis"},
    "2 processes, one Redis": {"WORKERS": "2", "BROKER": "redis", "CPU_AFFINITY": "0,1"},
    "4 processes, one Redis": {"WORKERS": "4", "BROKER": "redis", "CPU_AFFINITY": "0,1"},
}


def chat_us(spread: float) -> float:
    return 20 + 2 * (spread - 1)


def redis_us(spread: float) -> float:
    return 25 + 5 * spread


def _step(rate: float, p99: float, *, started_s: float, cost: bool, chat_us_frame: float) -> Step:
    sent = int(rate * WINDOW_S)
    delivered = sent * ROOM
    return Step(
        driver="fast",
        name=f"cost {rate:g}/s" if cost else f"rate {rate:g}/s",
        connections=2000,
        offered_per_s=rate,
        duration_s=WINDOW_S,
        sent=sent,
        delivered=delivered,
        expected=delivered,
        sent_per_s=rate,
        delivered_per_s=rate * ROOM,
        latency_ms={"p50": 1, "p90": 2, "p95": 3, "p99": p99, "p999": p99, "max": p99},
        timeline=[
            TimePoint(t_s=float(t), delivered_per_s=rate * ROOM, p99_ms=p99) for t in range(4)
        ],
        started_s=started_s,
        cost=cost,
        window_s=WINDOW_S,
        server_cpu_s=chat_us_frame * delivered / 1e6,
        others_cpu_s=0.01,
        steal_s=0.0,
    )


def _run(config: str, repeat: int, off_by: float, broke_at_2000: bool) -> Run:
    env = CONFIGS[config]
    workers = int(env["WORKERS"])
    spread = SPREAD[workers]
    redis = env["BROKER"] == "redis"
    bias = off_by if workers == 2 else 1.0
    steps: list[Step] = []
    samples: list[Sample] = []
    t = 2.0
    for rate, extra_us in ((1000.0, 10.0), (2000.0, 0.0)):
        chat = (chat_us(spread) + extra_us) * CHAT_FACTORS[repeat] * bias
        if not redis:
            chat = 15.0 + extra_us
        p99 = 150.0 if broke_at_2000 and workers == 4 and rate == 2000 else 5.0
        steps.append(_step(rate, p99, started_s=t, cost=True, chat_us_frame=chat))
        if redis:
            # Redis' CPU over the window, as the sampler's mean share of a core
            per_send = (redis_us(spread) + extra_us) * REDIS_FACTORS[repeat] * bias
            percent = per_send * rate / 1e6 * 100
            samples += [Sample(t + 0.5 * (i + 1), percent, 10**7) for i in range(8)]
        t += WINDOW_S + 1
    run = Run(config=config, repeat=repeat, target="chat", env=env, steps=steps)
    run.samples = {"redis": samples} if redis else {}
    if workers == 1:
        top = KNEE_RATES[repeat] if redis else 8000.0
        for rate, p99 in ((3000.0, 20.0), (top, 60.0), (top * 1.6, 400.0)):
            steps.append(_step(rate, p99, started_s=t, cost=False, chat_us_frame=10.0))
            t += WINDOW_S + 1
        run.knee = edge(run, {"p99": 100.0}, ROOM)
    return run


def build_scaling_results(
    *, off_by: float = 1.0, broke_at_2000: bool = False, side_parts: bool = True
) -> Results:
    """The fixture's Results; ``off_by`` scales what WORKERS=2 measured (1.0: exactly the
    model), ``broke_at_2000``: WORKERS=4's higher cost step did not hold."""
    results = Results(
        matrix="scaling",
        started="2026-12-01T10:00:00",
        command="python -m bench.lab scaling",
        baseline="one Redis",
        aa_pair=["one Redis", "one Redis (A/A)"],
        repeat=3,
        machine={"commit": "abc1234"},
        configs={
            name: {
                "target": "chat",
                "env": env,
                "same_as": "one Redis" if name.endswith("(A/A)") else "",
                "load": {
                    "connections": 2000,
                    "room_size": ROOM,
                    "climb": "p99=100" if env["WORKERS"] == "1" else "",
                },
            }
            for name, env in CONFIGS.items()
        },
    )
    results.runs = [_run(name, r, off_by, broke_at_2000) for r in range(3) for name in CONFIGS]
    results.parts = {
        "skipped": {"Redis Cluster": "this checkout's chat server has no setting REDIS_CLUSTER"}
    }
    if side_parts:
        results.parts |= {
            "logins_per_cpu_s": LOGINS,
            "argon2": "argon2id t=3 m=65536 KiB p=4",
            "refreshes_per_cpu_s": REFRESHES,
            "refresh_clients": 4,
            "bytes_per_connection": BYTES,
            "memory_connections": 2000,
        }
    return results


@pytest.fixture
def scaling_results() -> Callable[..., Results]:
    """Build a scaling run's Results (keyword arguments: :func:`build_scaling_results`)."""
    return build_scaling_results
