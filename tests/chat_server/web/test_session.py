"""The web page stays signed in, in Chromium, with access tokens that live
``TOKEN_TTL_S`` = 3 s: the page renews its token with its refresh token before it
expires, before connecting and after a failed connect, so a person types the password
once; "Sign out" ends the session at the auth service.

Cookie mode (the page and the auth service on one loopback host): the refresh token is
an ``HttpOnly`` cookie no page script can read. Body mode, the fallback (the page at
``localhost``, the auth service at ``127.0.0.1``: another host, which the cookie would
not reach): the refresh token in the tab's ``sessionStorage``. One auth service and one
chat server serve both tests.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Iterator
from typing import Any

import pytest

from chatlab.harness import AuthProcess, KeyPair, ServerProcess
from tests.support import CHROMIUM, say_acked, wait_until
from tests.support.auth import metric_sum
from tests.support.browser import CHROMEDRIVER, PASSWORD, Browser, browsers, page_services

pytestmark = pytest.mark.skipif(
    shutil.which(CHROMEDRIVER) is None or shutil.which(CHROMIUM) is None,
    reason=f"no {CHROMEDRIVER} or {CHROMIUM}: CI and the setup script install them",
)

TOKEN_TTL_S = 3
REFRESH_COOKIE = "chatlab_refresh"

#: the page's access token replaced by one the chat server refuses, which the page
#: believes good for an hour (after any renewal in flight, with the renewal timer stopped)
_REFUSED_TOKEN_JS = """
return (session.renewing || Promise.resolve()).then(() => {
  clearTimeout(session.timer);
  sessionStorage.setItem('chatlab.token', 'refused');
  const later = String(Date.now() + 3600 * 1000);
  sessionStorage.setItem('chatlab.token_renew_at', later);
  sessionStorage.setItem('chatlab.token_expires_at', later);
  return true;
});
"""


@pytest.fixture(scope="module")
def site(
    tmp_path_factory: pytest.TempPathFactory, keys: KeyPair
) -> Iterator[tuple[AuthProcess, ServerProcess]]:
    """An auth service issuing 3-second access tokens, and a chat server whose page names it;
    the page may be opened at ``127.0.0.1`` or at ``localhost``."""
    with page_services(
        tmp_path_factory.mktemp("session"),
        keys,
        {"TOKEN_TTL_S": str(TOKEN_TTL_S)},
        page_hosts=("127.0.0.1", "localhost"),
    ) as services:
        yield services


def _refreshes(auth: AuthProcess) -> float:
    return metric_sum(auth, "auth_refresh_total", outcome="rotated")


def _logins(auth: AuthProcess) -> float:
    """Passwords the auth service took (its CORS preflights are ``OPTIONS``)."""
    return metric_sum(auth, "auth_requests_total", route="/login", method="POST", status="200")


def _bodies(browser: Browser, room: str) -> list[str]:
    return [m["body"] for m in browser.messages(room)]


def _refresh_cookies(browser: Browser) -> list[dict[str, Any]]:
    return [c for c in browser.cookies() if c["name"] == REFRESH_COOKIE]


def _settled_signed_out(browser: Browser) -> bool:
    """True once the page has started and shows the sign-in form (and not the chat)."""
    started = browser.js("return typeof state !== 'undefined' && state.config !== null")
    return bool(started) and browser.field("login-panel").is_displayed()


def test_the_page_stays_signed_in_across_token_lifetimes_and_a_chat_server_restart(
    site: tuple[AuthProcess, ServerProcess], tmp_path
):
    from selenium.webdriver.common.keys import Keys

    auth, chat = site
    assert auth.register("bob", PASSWORD).status == 201
    logins = _logins(auth)
    with browsers(tmp_path, "alice") as (alice,):
        page = f"http://127.0.0.1:{chat.port}/"
        alice.open(page)
        alice.sign_in("alice", register=True)
        alice.join("lobby")
        for n in range(3):  # three token lifetimes, each token renewed by the page
            renewed = _refreshes(auth)
            alice.say(f"token {n}")
            alice.wait(lambda r=renewed: _refreshes(auth) > r, "a renewal")
        said = ["token 0", "token 1", "token 2"]
        alice.wait(lambda: _bodies(alice, "lobby") == said, "three messages")

        # a deploy: the chat server is killed and started again on its port, and stays
        # down while the page's access token is renewed
        chat.kill()
        alice.wait(lambda: alice.field("connection").text != "online", "the connection lost")
        down = _refreshes(auth)
        alice.wait(lambda: _refreshes(auth) > down, "a renewal while the chat server is down")
        chat.start()
        missed = ["while you were away 1", "while you were away 2"]
        asyncio.run(say_acked(chat, auth.token("bob", PASSWORD), "lobby", missed))
        alice.online()
        alice.wait(lambda: _bodies(alice, "lobby") == [*said, *missed], "caught up")
        assert not alice.field("login-panel").is_displayed()
        # alice's one login and bob's: the page never asked for the password again
        assert _logins(auth) == logins + 2

        # a new tab of the same browser has no access token of its own, but the cookie
        alice.driver.switch_to.new_window("tab")
        alice.open(page)
        alice.online()
        assert _logins(auth) == logins + 2

        # the refresh token: an HttpOnly cookie sent only to /refresh and /logout, out of
        # page script's reach
        cookies = _refresh_cookies(alice)
        assert sorted(c["path"] for c in cookies) == ["/logout", "/refresh"]
        assert all(c["httpOnly"] and c["secure"] and c["sameSite"] == "Strict" for c in cookies)
        refresh_token = cookies[0]["value"]
        assert REFRESH_COOKIE not in alice.js("return document.cookie")
        kept = alice.storage()
        assert kept and not [key for key, value in kept.items() if refresh_token in value]

        # "Sign out", from the keyboard: the auth service revokes the session
        signed_out = metric_sum(auth, "auth_sessions_revoked_total", reason="logout")
        alice.field("logout").send_keys(Keys.ENTER)
        alice.wait(lambda: alice.field("login-panel").is_displayed(), "the sign-in form")
        assert metric_sum(auth, "auth_sessions_revoked_total", reason="logout") == signed_out + 1
        assert auth.post("/refresh", {"refresh_token": refresh_token}).status == 401
        assert _refresh_cookies(alice) == []
        alice.driver.refresh()
        alice.wait(lambda: _settled_signed_out(alice), "the sign-in form after a reload")
        assert not alice.field("chat-panel").is_displayed()
        assert _logins(auth) == logins + 2


def test_a_page_on_another_host_keeps_its_refresh_token_in_the_tab_and_renews_on_return(
    site: tuple[AuthProcess, ServerProcess], tmp_path
):
    auth, chat = site
    page = f"http://localhost:{chat.port}/"  # the auth service is at 127.0.0.1
    with browsers(tmp_path, "carol") as (carol,):
        carol.open(page)
        carol.sign_in("carol", register=True)
        logins = _logins(auth)
        assert carol.js("return sessionStorage.getItem('chatlab.refresh')")
        assert _refresh_cookies(carol) == []

        # the tab leaves the page for longer than its access token lives; back, the page
        # renews the token before it connects
        expires_at_ms = float(carol.js("return sessionStorage.getItem('chatlab.token_expires_at')"))
        carol.open("about:blank")
        asyncio.run(
            wait_until(lambda: time.time() * 1000 > expires_at_ms, 20, "the access token expired")
        )
        renewed = _refreshes(auth)
        carol.open(page)
        carol.online()
        assert _refreshes(auth) > renewed
        assert _logins(auth) == logins

        # a token the page holds as fresh but the chat server refuses (its handshake's 401
        # is only a failed connection to a browser): the page renews it and connects
        assert carol.js(_REFUSED_TOKEN_JS) is True
        renewed = _refreshes(auth)
        carol.driver.refresh()
        carol.online()
        assert "connection lost; reconnecting" in carol.field("events").text
        assert _refreshes(auth) > renewed
        assert _logins(auth) == logins

        refresh_token = carol.js("return sessionStorage.getItem('chatlab.refresh')")
        carol.field("logout").click()
        carol.wait(lambda: carol.field("login-panel").is_displayed(), "the sign-in form")
        assert auth.post("/refresh", {"refresh_token": refresh_token}).status == 401
        assert carol.storage() == {}
        carol.driver.refresh()
        carol.wait(lambda: _settled_signed_out(carol), "the sign-in form after a reload")
