"""The web chat page in a real browser: Debian's chromium, driven by its chromium-driver.

Two independent browser sessions (each its own chromium, profile and sessionStorage)
register and log in through the auth service, join one room and talk; a reload
replays what was missed (with ``WS_DEFLATE=shared``: Chromium offers permessage-deflate
and accepts the answer without context takeover, read from its own network log);
strings that look like HTML stay text. On failure each
browser's screenshot is saved in the test's tmp dir (its path is in the failure).
Nothing downloads a browser: selenium is pointed at /usr/bin/chromedriver and
/usr/bin/chromium, and selenium's own driver manager is kept offline.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from chatlab.harness import KeyPair, ServerProcess
from tests.support import CHROMIUM
from tests.support.browser import CHROMEDRIVER, PASSWORD, browsers, page_services

XSS = '<img src=x onerror="window.__xss=(window.__xss||0)+1">'

#: every element around a room's messages that scrolls them (overflowing, with a scrollbar
#: style), innermost first, and ``page`` if the page itself scrolls
_SCROLLERS_JS = """
const scrollers = [];
for (let node = arguments[0]; node; node = node.parentElement) {
  const overflow = getComputedStyle(node).overflowY;
  if ((overflow === 'auto' || overflow === 'scroll') && node.scrollHeight > node.clientHeight)
    scrollers.push(node.id ? '#' + node.id : '.' + node.className);
}
const page = document.scrollingElement;
if (page.scrollHeight > page.clientHeight) scrollers.push('page');
return scrollers;
"""


pytestmark = pytest.mark.skipif(
    shutil.which(CHROMEDRIVER) is None or shutil.which(CHROMIUM) is None,
    reason=f"no {CHROMEDRIVER} or {CHROMIUM}: CI and the setup script install them",
)


@pytest.fixture
def ws_deflate() -> str:
    """The chat server's ``WS_DEFLATE`` (a test parametrizes it to change it)."""
    return "off"


@pytest.fixture
def chat_and_auth(
    tmp_path: Path, keys: KeyPair, transport: str, ws_deflate: str
) -> Iterator[ServerProcess]:
    """An auth service allowing the chat page's origin, and a chat server that names it."""
    with page_services(tmp_path, keys, transport=transport, ws_deflate=ws_deflate) as (_, chat):
        yield chat


@pytest.mark.parametrize("ws_deflate", ["shared"])
def test_two_browsers_talk_in_order_see_presence_and_replay_after_a_reload(
    chat_and_auth: ServerProcess, tmp_path: Path
):
    page = f"http://127.0.0.1:{chat_and_auth.port}/"
    with browsers(tmp_path, "alice", "bob") as (alice, bob):
        for browser in (alice, bob):
            browser.open(page)
            browser.sign_in(browser.name, register=True)
            browser.join("lobby")
        for browser in (alice, bob):
            browser.wait(lambda b=browser: b.members() == ["alice", "bob"], "both members")
            # Chromium offers permessage-deflate and took the answer without context
            # takeover (it fails the connection on an answer it does not accept)
            [(offered, answered)] = browser.websocket_extensions()
            assert offered.startswith("permessage-deflate"), offered
            assert answered.startswith("permessage-deflate"), answered
            assert "server_no_context_takeover" in answered, answered
            assert "client_no_context_takeover" in answered, answered

        for n in range(3):
            alice.say(f"alice {n}")
        bob.say("bob 0")
        for browser in (alice, bob):
            browser.wait(lambda b=browser: len(b.messages("lobby")) == 4, "four messages")
        seen_by_alice, seen_by_bob = alice.messages("lobby"), bob.messages("lobby")
        assert seen_by_alice == seen_by_bob
        assert [m["seq"] for m in seen_by_alice] == [1, 2, 3, 4]
        assert {m["origin"] for m in seen_by_alice} == {"live"}
        assert [m["body"] for m in seen_by_alice if m["user"] == "alice"] == [
            "alice 0",
            "alice 1",
            "alice 2",
        ]

        # bob's page goes away (the tab stays: its sessionStorage too) while alice talks
        bob.open("about:blank")
        alice.wait(lambda: alice.members() == ["alice"], "bob gone")
        alice.say("while you were away 1")
        alice.say("while you were away 2")
        alice.wait(lambda: len(alice.messages("lobby")) == 6, "six messages")
        bob.open(page)
        bob.online()
        assert [answered for _, answered in bob.websocket_extensions()][-1].startswith(
            "permessage-deflate"
        )
        bob.wait(lambda: len(bob.messages("lobby")) == 6, "history and replay after the reload")
        after = bob.messages("lobby")
        assert [m["seq"] for m in after] == [1, 2, 3, 4, 5, 6]
        assert [m["origin"] for m in after] == ["history"] * 4 + ["replayed"] * 2
        assert [m["body"] for m in after[4:]] == ["while you were away 1", "while you were away 2"]
        alice.wait(lambda: alice.members() == ["alice", "bob"], "bob back")

        # a plain reload: nothing was missed, nothing replays
        alice.driver.refresh()
        alice.online()
        alice.wait(lambda: len(alice.messages("lobby")) == 6, "alice's history after a reload")
        assert {m["origin"] for m in alice.messages("lobby")} == {"history"}
        bob.say("after the reloads")
        alice.wait(lambda: len(alice.messages("lobby")) == 7, "a live message")
        assert alice.messages("lobby")[-1] == {
            "seq": 7,
            "user": "bob",
            "body": "after the reloads",
            "origin": "live",
        }


def test_html_in_names_bodies_rooms_and_errors_stays_text(
    chat_and_auth: ServerProcess, tmp_path: Path
):
    page = f"http://127.0.0.1:{chat_and_auth.port}/"
    with browsers(tmp_path, "mallory") as (mallory,):
        mallory.open(page)
        # a user name that is HTML: the auth service refuses it, the page names it in the error
        mallory.field("username").send_keys(XSS)
        mallory.field("password").send_keys(PASSWORD)
        mallory.field("register").click()
        mallory.wait(lambda: "bad_request" in mallory.field("events").text, "the refusal")
        assert f"register {XSS}" in mallory.field("events").text
        mallory.field("username").clear()
        mallory.field("password").clear()
        mallory.sign_in("mallory", register=True)
        mallory.join("lobby")
        mallory.say(XSS)
        mallory.wait(lambda: len(mallory.messages("lobby")) == 1, "the message")
        assert mallory.messages("lobby")[0]["body"] == XSS
        # a room name that is HTML: refused by the chat server, shown as text
        room_box = mallory.field("room-name")
        room_box.clear()
        room_box.send_keys(XSS)
        mallory.field("join").click()
        mallory.wait(
            lambda: mallory.js(
                "return document.querySelector('#events li[data-code=invalid_room]')"
            ),
            "the invalid_room error",
        )
        assert f"joining {XSS}" in mallory.field("events").text
        assert mallory.js("return document.querySelectorAll('img').length") == 0
        assert mallory.js("return window.__xss === undefined") is True


def test_a_long_conversation_scrolls_in_one_pane(chat_and_auth: ServerProcess, tmp_path: Path):
    page = f"http://127.0.0.1:{chat_and_auth.port}/"
    with browsers(tmp_path, "talker") as (talker,):
        talker.open(page)
        talker.sign_in("talker", register=True)
        talker.join("lobby")
        for n in range(30):  # more than the pane holds
            talker.say(f"line {n}")
        talker.wait(lambda: len(talker.messages("lobby")) == 30, "thirty messages")
        room_list = talker.js("return document.querySelector('ol.messages[data-room=lobby]')")
        assert talker.js(_SCROLLERS_JS, room_list) == [".messages"]
        # and the pane shows the latest message
        assert talker.js("return arguments[0].scrollTop > 0", room_list) is True
