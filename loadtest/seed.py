"""``python -m loadtest.seed``: register the load test's users ahead of a run.

Registers ``PREFIX0`` .. ``PREFIX{N-1}`` (the names ``loadtest/chat.py`` gives its
users; passwords derived from the names) with ``--concurrency`` requests in flight,
since each registration costs the auth service an argon2 hash. A name already taken
counts as done. ``--token-file`` also logs every user in and writes
``{username: token}`` for ``locust ... --token-file`` (tokens expire after the auth
service's ``TOKEN_TTL_S``).

Exit status: 0 when every user exists (and has a token, if asked), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from loadtest.auth import AuthClient
from loadtest.client import AuthError, password_for, username

DEFAULT_AUTH_URL = "http://127.0.0.1:8001"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.seed",
        description="Register the load test's users ahead of a run (see loadtest/README.md).",
    )
    parser.add_argument(
        "--users", type=int, required=True, help="how many users: PREFIX0..PREFIX{N-1}"
    )
    parser.add_argument(
        "--auth-url",
        default=DEFAULT_AUTH_URL,
        help=f"auth service, or its replicas comma-separated [{DEFAULT_AUTH_URL}]",
    )
    parser.add_argument(
        "--ca-file",
        default="",
        help="PEM CA certificates that verify an https:// --auth-url [the system's CAs]",
    )
    parser.add_argument(
        "--user-prefix", default="load", help="user name prefix, as in the load test [load]"
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=4,
        help="registrations in flight at once (each is an argon2 hash on the auth service) [4]",
    )
    parser.add_argument(
        "--token-file", default="", help="also log every user in and write {username: token} here"
    )
    args = parser.parse_args(argv)
    if args.users < 1 or args.concurrency < 1:
        parser.error("--users and --concurrency must be 1 or more")
    return args


def seed(
    auth: AuthClient, names: list[str], concurrency: int, want_tokens: bool
) -> tuple[int, int, dict[str, str], dict[str, str]]:
    """Register ``names`` (and log them in if ``want_tokens``), ``concurrency`` at a time.

    Returns (created, already taken, tokens, failures by name with their reason).
    """
    created = taken = 0
    tokens: dict[str, str] = {}
    failures: dict[str, str] = {}

    def one(name: str) -> None:
        nonlocal created, taken
        password = password_for(name)
        try:
            if auth.register(name, password):
                created += 1
            else:
                taken += 1
            if want_tokens:
                tokens[name] = auth.login(name, password).access_token
        except AuthError as exc:
            failures[name] = f"{exc} {exc.detail}".strip()

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(one, names))
    return created, taken, tokens, failures


def main(argv: list[str] | None = None) -> int:
    """Seed the users; print one summary line; return the exit status."""
    args = parse_args(argv)
    names = [username(args.user_prefix, i) for i in range(args.users)]
    auth = AuthClient(args.auth_url, ca_file=args.ca_file)
    started = time.monotonic()
    created, taken, tokens, failures = seed(auth, names, args.concurrency, bool(args.token_file))
    elapsed = time.monotonic() - started
    if args.token_file:
        Path(args.token_file).write_text(json.dumps(tokens) + "\n")
    print(
        f"seed: {created} registered, {taken} already there, {len(failures)} failed "
        f"in {elapsed:.1f} s ({len(names) / elapsed:.1f} users/s)"
        + (f"; {len(tokens)} tokens written to {args.token_file}" if args.token_file else "")
    )
    for name, reason in sorted(failures.items())[:10]:
        print(f"  {name}: {reason}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
