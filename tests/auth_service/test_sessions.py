"""Sessions' rules and the SQLite store, driven in process with the time as a number:
the table of outcomes, and a family's state machine under any sequence of refreshes,
replays, pauses and logouts (Hypothesis)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from auth_service.sessions import (
    SPENT_KEPT_PER_FAMILY,
    Outcome,
    SessionRules,
    SqliteSessions,
    TokenRow,
    judge,
    new_token,
    successor,
    token_hash,
    well_formed,
)
from auth_service.users import UserStore

GRACE_S = 10
TTL_S = 1000
NOW = 1_000_000.0


def _row(spent_at: float | None = None, expires_at: float = NOW + TTL_S, revoked: bool = False):
    return TokenRow("family", "alice", expires_at, spent_at, revoked)


@pytest.mark.parametrize(
    ("presented", "following", "outcome"),
    [
        (None, None, Outcome.INVALID),
        (_row(revoked=True), None, Outcome.INVALID),
        (_row(expires_at=NOW), None, Outcome.INVALID),
        (_row(), None, Outcome.ROTATED),
        (_row(spent_at=NOW - GRACE_S), _row(), Outcome.GRACE),
        (_row(spent_at=NOW - GRACE_S - 0.001), _row(), Outcome.REUSED),
        (_row(spent_at=NOW - 1), _row(spent_at=NOW - 0.5), Outcome.REUSED),
        (_row(spent_at=NOW - 1), None, Outcome.REUSED),
    ],
)
def test_the_outcome_of_presenting_a_token_follows_the_table(
    presented: TokenRow | None, following: TokenRow | None, outcome: Outcome
):
    assert judge(presented, following, NOW, GRACE_S) is outcome


def test_no_grace_means_any_replay_is_reuse():
    assert judge(_row(spent_at=NOW), _row(), NOW, 0) is Outcome.REUSED


def test_tokens_are_43_base64url_characters_and_successors_depend_on_the_secret():
    token = new_token()
    assert well_formed(token) and len(token) == 43
    assert not well_formed(token[:-1]) and not well_formed(token + "A")
    assert not well_formed("!" * 43) and not well_formed(None)
    assert well_formed(successor(b"a" * 32, token))
    assert successor(b"a" * 32, token) == successor(b"a" * 32, token)
    assert successor(b"a" * 32, token) != successor(b"b" * 32, token)
    assert len(token_hash(token)) == 32


@pytest.fixture
def runner() -> Iterator[asyncio.Runner]:
    with asyncio.Runner() as run:
        yield run


@pytest.fixture
def store(tmp_path: Path, runner: asyncio.Runner) -> Iterator[SqliteSessions]:
    users = runner.run(UserStore.open(str(tmp_path / "auth.sqlite3")))
    sessions = runner.run(SqliteSessions.open(users, SessionRules(TTL_S, GRACE_S, 1000)))
    yield sessions
    runner.run(users.close())


def _live(path: str, family_id: str, now_s: float) -> int:
    """The family's live tokens, counted in the file itself."""
    with sqlite3.connect(path) as db:
        (count,) = db.execute(
            "SELECT count(*) FROM refresh_tokens t JOIN refresh_families f USING (family_id)"
            " WHERE family_id = ? AND t.spent_at IS NULL AND t.expires_at > ?"
            " AND f.revoked_at IS NULL",
            (family_id, now_s),
        ).fetchone()
    return int(count)


def test_the_secret_is_kept_across_restarts(tmp_path: Path, runner: asyncio.Runner):
    path = str(tmp_path / "auth.sqlite3")
    secrets = []
    for _ in range(2):
        users = runner.run(UserStore.open(path))
        sessions = runner.run(SqliteSessions.open(users, SessionRules(TTL_S, GRACE_S, 10)))
        secrets.append(successor(sessions._secret, "x" * 43))
        runner.run(users.close())
    assert secrets[0] == secrets[1]


def test_pruning_deletes_expired_and_revoked_rows_only(
    store: SqliteSessions, runner: asyncio.Runner
):
    kept, _ = runner.run(store.open_family("kept", NOW))
    ended, _ = runner.run(store.open_family("ended", NOW))
    old, _ = runner.run(store.open_family("old", NOW - TTL_S))
    assert runner.run(store.revoke_family_of(ended.refresh_token, NOW)) == ended.family_id
    assert runner.run(store.prune(NOW)) == 4  # two families, each with its token
    assert runner.run(store.refresh(kept.refresh_token, NOW)).outcome is Outcome.ROTATED
    for gone in (ended, old):
        assert runner.run(store.refresh(gone.refresh_token, NOW)).outcome is Outcome.INVALID
    assert runner.run(store.prune(NOW)) == 0


class FamilyMachine(RuleBasedStateMachine):
    """One family under refreshes of any token it ever had, pauses and logouts."""

    store: SqliteSessions
    runner: asyncio.Runner
    path: str
    serial = 0

    @initialize()
    def login(self) -> None:
        FamilyMachine.serial += 1
        self.now = NOW + FamilyMachine.serial * 10 * TTL_S  # each example's own era
        session, _ = self.runner.run(self.store.open_family(f"u{self.serial}", self.now))
        self.family = session.family_id
        self.tokens = [session.refresh_token]
        #: when each token was spent, and the successor it was answered with
        self.spent: dict[str, tuple[float, str]] = {}
        self.ended = False

    @rule(pick=st.integers(min_value=0))
    def present(self, pick: int) -> None:
        token = self.tokens[pick % len(self.tokens)]
        refreshed = self.runner.run(self.store.refresh(token, self.now))
        replay = self.spent.get(token)
        if refreshed.outcome is Outcome.ROTATED:
            assert replay is None and not self.ended
            assert refreshed.session is not None
            self.spent[token] = (self.now, refreshed.session.refresh_token)
            self.tokens.append(refreshed.session.refresh_token)
        elif refreshed.outcome is Outcome.GRACE:
            assert replay is not None and self.now - replay[0] <= GRACE_S
            assert refreshed.session is not None
            assert refreshed.session.refresh_token == replay[1]  # the same successor
            assert replay[1] not in self.spent  # which is still live
        else:
            assert refreshed.session is None
            self.ended = True
        if replay is not None and self.now - replay[0] > GRACE_S:
            # any replay outside the grace leaves no live token
            assert refreshed.outcome in (Outcome.REUSED, Outcome.INVALID)
            assert _live(self.path, self.family, self.now) == 0

    @rule(seconds=st.sampled_from([0, 1, GRACE_S // 2, GRACE_S, GRACE_S + 1, 3 * GRACE_S]))
    def wait(self, seconds: int) -> None:
        self.now += seconds

    @rule(pick=st.integers(min_value=0))
    def logout(self, pick: int) -> None:
        token = self.tokens[pick % len(self.tokens)]
        self.runner.run(self.store.revoke_family_of(token, self.now))
        self.ended = True
        assert _live(self.path, self.family, self.now) == 0

    @invariant()
    def at_most_one_live_token(self) -> None:
        if hasattr(self, "family"):
            live = _live(self.path, self.family, self.now)
            assert live <= 1
            if self.ended:
                assert live == 0


def test_a_family_has_at_most_one_live_token_whatever_is_presented(
    store: SqliteSessions, runner: asyncio.Runner
):
    FamilyMachine.store, FamilyMachine.runner = store, runner
    FamilyMachine.path = store.users.path
    run_state_machine_as_test(
        FamilyMachine,
        settings=settings(
            max_examples=60,
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


def test_a_family_keeps_its_latest_spent_tokens_only(store: SqliteSessions, runner: asyncio.Runner):
    session, _ = runner.run(store.open_family("busy", NOW))
    tokens = [session.refresh_token]
    for index in range(SPENT_KEPT_PER_FAMILY + 4):
        refreshed = runner.run(store.refresh(tokens[-1], NOW + index / 100))
        assert refreshed.session is not None
        tokens.append(refreshed.session.refresh_token)
    assert runner.run(store.prune(NOW + GRACE_S + 1)) == 4
    later = NOW + GRACE_S + 1
    # the oldest, forgotten: refused, and the session goes on
    assert runner.run(store.refresh(tokens[0], later)).outcome is Outcome.INVALID
    assert _live(store.users.path, session.family_id, later) == 1
    # a spent one still kept: reuse, the session ends
    assert runner.run(store.refresh(tokens[-3], later)).outcome is Outcome.REUSED
    assert _live(store.users.path, session.family_id, later) == 0
