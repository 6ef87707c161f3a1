"""The auth service as the web page and Prometheus see it: CORS and ``GET /metrics``."""

from __future__ import annotations

from collections.abc import Callable

from bench.lab.scrape import scrape_metrics
from chatlab.harness import AuthProcess, http_request

PAGE = "http://127.0.0.1:8000"


def _preflight(auth: AuthProcess, origin: str):
    return http_request(
        "OPTIONS",
        auth.url("/login"),
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type",
        },
    )


def test_the_chat_pages_origins_may_call_the_api_and_others_may_not(
    start_auth: Callable[..., AuthProcess],
):
    auth = start_auth(AUTH_CORS_ORIGINS=f"{PAGE},http://chat.example")
    allowed = _preflight(auth, "http://chat.example")
    assert allowed.status == 200
    assert allowed.headers["access-control-allow-origin"] == "http://chat.example"
    assert "POST" in allowed.headers["access-control-allow-methods"]
    assert "content-type" in allowed.headers["access-control-allow-headers"].lower()
    refused = _preflight(auth, "http://evil.example")
    assert refused.status == 400
    assert "access-control-allow-origin" not in refused.headers
    # the answer itself carries the origin, and Retry-After is readable from the page
    reply = http_request(
        "POST",
        auth.url("/login"),
        {"username": "nobody", "password": "wrong password"},
        headers={"Origin": PAGE},
    )
    assert reply.status == 401
    assert reply.headers["access-control-allow-origin"] == PAGE
    assert "retry-after" in reply.headers["access-control-expose-headers"].lower()
    other = http_request("GET", auth.url("/healthz"), headers={"Origin": "http://evil.example"})
    assert "access-control-allow-origin" not in other.headers


def test_metrics_count_requests_by_route_and_status_and_time_the_hashing(
    start_auth: Callable[..., AuthProcess], username: str
):
    auth = start_auth()
    assert auth.register(username, "correct horse").status == 201
    assert auth.login(username, "correct horse").status == 200
    assert auth.login(username, "wrong horse!").status == 401
    assert auth.get("/no/such/path").status == 404
    reply = auth.get("/metrics")
    assert reply.status == 200
    assert reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = scrape_metrics(auth.port)
    assert samples["auth_requests_total{method=POST,route=/register,status=201}"] == 1
    assert samples["auth_requests_total{method=POST,route=/login,status=200}"] == 1
    assert samples["auth_requests_total{method=POST,route=/login,status=401}"] == 1
    assert samples["auth_requests_total{method=GET,route=other,status=404}"] == 1
    assert samples["auth_request_seconds_count{route=/login}"] == 2
    # a registration hashes once, each login verifies once
    assert samples["auth_hash_seconds_count{op=hash}"] == 1
    assert samples["auth_hash_seconds_count{op=verify}"] == 2
    assert samples["auth_hash_jobs"] == 0
    assert samples["auth_hash_jobs_max"] == 16
    assert samples["auth_hash_rejected_total"] == 0
    assert samples["process_cpu_seconds_total"] > 0
