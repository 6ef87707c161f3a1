"""The web page as a person uses it, in Chromium: one browser and one auth service and
chat server for the module, other people's messages said over a websocket client.

A return with messages missed lands on the first of them, marked; a person reading
older messages is not pulled down by new ones; the rooms come back when the person
signs in again, and a shared browser forgets them at "Sign out" (unless the person
asked it to keep them); at a phone's width (390 px) and a desktop's (1280 px) nothing
scrolls sideways and every control can be reached and is named. Screenshots of both
widths and of a return are saved in ``reports/web-page/`` (ignored by git; pytest's tmp
dirs are pruned after three runs), for a person to look at.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from chatlab.harness import AuthProcess, KeyPair, ServerProcess
from tests.support import CHROMIUM, say_acked
from tests.support.browser import CHROMEDRIVER, PASSWORD, Browser, browsers, page_services

pytestmark = pytest.mark.skipif(
    shutil.which(CHROMEDRIVER) is None or shutil.which(CHROMIUM) is None,
    reason=f"no {CHROMEDRIVER} or {CHROMIUM}: CI and the setup script install them",
)

#: where a room's message ``seq`` is on screen: its box and the list's box (viewport px)
#: where the screenshots go
SHOTS = Path(__file__).resolve().parents[3] / "reports" / "web-page"

_PLACE_JS = """
const list = document.querySelector(`ol.messages[data-room="${arguments[0]}"]`);
const item = list.querySelector(`li[data-seq="${arguments[1]}"]`);
const box = item.getBoundingClientRect(), view = list.getBoundingClientRect();
return {top: box.top, bottom: box.bottom, viewTop: view.top, viewBottom: view.bottom,
        marked: item.classList.contains('first-unread'), scrollTop: list.scrollTop,
        atEnd: list.scrollHeight - list.scrollTop - list.clientHeight <= 8};
"""

#: every control a person can see, scrolled into view in turn: where it was then
_CONTROLS_JS = """
const seen = [];
for (const node of document.querySelectorAll('button, input, select, textarea, a, [tabindex]')) {
  if (!node.getClientRects().length) continue;  // not displayed
  node.scrollIntoView({block: 'nearest', inline: 'nearest'});
  const box = node.getBoundingClientRect();
  seen.push({id: node.id || node.className || node.tagName, left: box.left, right: box.right,
             top: box.top, bottom: box.bottom});
}
window.scrollTo(0, 0);
return seen;
"""


class Site(NamedTuple):
    auth: AuthProcess
    chat: ServerProcess


_SIDEWAYS_JS = """
const page = document.scrollingElement;
return {scrollWidth: page.scrollWidth, clientWidth: page.clientWidth};
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, keys: KeyPair) -> Iterator[Site]:
    """An auth service, with bob registered, and a chat server whose page names it."""
    with page_services(tmp_path_factory.mktemp("person"), keys) as (auth, chat):
        assert auth.register("bob", PASSWORD).status == 201
        yield Site(auth, chat)


@pytest.fixture(scope="module")
def person(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    """One browser for the module's tests (a shared computer)."""
    with browsers(tmp_path_factory.mktemp("browser"), "person") as (person,):
        yield person


def _page(site: Site) -> str:
    return f"http://127.0.0.1:{site.chat.port}/"


def _bob_says(site: Site, room: str, bodies: list[str]) -> None:
    asyncio.run(say_acked(site.chat, site.auth.token("bob", PASSWORD), room, bodies))


def _signed_out_page(person: Browser, site: Site) -> None:
    """The page, with nobody signed in."""
    person.open(_page(site))
    person.wait(
        lambda: person.js("return typeof state !== 'undefined' && state.config !== null"),
        "the page started",
    )
    if person.field("logout").is_displayed():
        person.field("logout").click()
    person.wait(lambda: person.field("login-panel").is_displayed(), "the sign-in form")


def _sign_in(person: Browser, name: str, register: bool, keep: bool) -> None:
    for field in ("username", "password"):
        person.field(field).clear()
    if person.field("remember").is_selected() != keep:
        person.field("remember").click()
    person.sign_in(name, register)


def _rooms(person: Browser) -> list[str]:
    return list(
        person.js("return [...document.querySelectorAll('#rooms li')].map(li => li.dataset.room)")
    )


def _seqs(person: Browser, room: str) -> list[int]:
    return [m["seq"] for m in person.messages(room)]


def test_a_return_lands_on_the_first_unread_and_reading_older_is_not_yanked(
    site: Site, person: Browser
):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.actions.wheel_input import ScrollOrigin

    _bob_says(site, "garden", [f"before {n}" for n in range(30)])
    _signed_out_page(person, site)
    # said once: the auth service's words, not the page's hint for the code as well
    person.field("username").send_keys("bob")
    person.field("password").send_keys("not the password")
    person.field("login").click()
    person.wait(lambda: "invalid_credentials" in person.field("events").text, "the refusal")
    line = person.js("return document.querySelector('#events li[data-code]').textContent")
    assert line.count("wrong password") == 1, line

    _sign_in(person, "alice", register=True, keep=True)
    person.join("lobby")
    person.join("garden")
    person.wait(lambda: len(_seqs(person, "garden")) == 20, "the page of history")
    assert person.js(_PLACE_JS, "garden", 30)["atEnd"] is True  # a join shows the latest

    # the page goes away; 25 messages are said meanwhile; back, it lands on the first
    person.open("about:blank")
    _bob_says(site, "garden", [f"missed {n}" for n in range(25)])
    person.open(_page(site))
    person.online()
    person.wait(lambda: _seqs(person, "garden")[-1:] == [55], "the missed messages replayed")
    person.wait(lambda: _seqs(person, "garden")[:1] == [11], "the history before them")
    # the room on screen, in the room box too
    assert person.field("room-title").text == "garden"
    assert person.field("room-name").get_attribute("value") == "garden"
    place = person.wait(lambda: person.js(_PLACE_JS, "garden", 31), "the first unread")
    assert place["marked"] is True
    assert place["viewTop"] <= place["top"] and place["bottom"] <= place["viewBottom"], place
    assert place["scrollTop"] > 0 and not place["atEnd"], place  # the rest of the unread below
    assert person.js("return document.querySelectorAll('li.first-unread').length") == 1
    _screenshot(person, "return-1280")

    # reading older messages (the wheel): a new message does not pull the view down
    garden = person.js("return document.querySelector('ol.messages[data-room=garden]')")
    ActionChains(person.driver).scroll_from_origin(
        ScrollOrigin.from_element(garden), 0, -200
    ).perform()
    person.wait(
        lambda: person.js(_PLACE_JS, "garden", 31)["scrollTop"] < place["scrollTop"], "scrolled up"
    )
    reading = person.js(_PLACE_JS, "garden", 31)["scrollTop"]
    _bob_says(site, "garden", ["while reading"])
    person.wait(lambda: person.field("jump").is_displayed(), "the new-messages marker")
    assert person.js(_PLACE_JS, "garden", 31)["scrollTop"] == reading
    person.field("jump").click()
    person.wait(lambda: person.js(_PLACE_JS, "garden", 56)["atEnd"], "the latest in view")
    assert not person.field("jump").is_displayed()
    # "Older messages": the page fetched is what the view shows
    person.field("older").click()
    person.wait(lambda: _seqs(person, "garden")[:1] == [1], "the older page")
    oldest = person.wait(lambda: person.js(_PLACE_JS, "garden", 1), "the oldest placed")
    assert oldest["scrollTop"] == 0 and oldest["top"] >= oldest["viewTop"], oldest


def test_rooms_come_back_after_sign_out_and_sign_in_and_catch_up(site: Site, person: Browser):
    _signed_out_page(person, site)
    _sign_in(person, "carol", register=True, keep=True)
    person.join("lobby")
    person.join("porch")
    _bob_says(site, "porch", ["seen 1"])
    person.wait(lambda: len(_seqs(person, "porch")) == 1, "a live message")

    # signed out while the page was reconnecting (the chat server restarting)
    site.chat.kill()
    person.wait(lambda: "reconnecting in" in person.field("events").text, "a reconnect planned")
    person.field("logout").click()
    person.wait(lambda: person.field("login-panel").is_displayed(), "the sign-in form")
    site.chat.start()
    _bob_says(site, "porch", ["missed 1", "missed 2"])
    _sign_in(person, "carol", register=False, keep=True)
    person.wait(lambda: _seqs(person, "porch") == [1, 2, 3], "caught up")
    assert sorted(_rooms(person)) == ["lobby", "porch"]
    assert person.field("room-title").text == "porch"
    assert [m["origin"] for m in person.messages("porch")] == ["history", "replayed", "replayed"]
    assert person.js(_PLACE_JS, "porch", 2)["marked"] is True
    # the reconnect count went with the session: the sign-in's is a first connection
    events = person.js(
        "return [...document.querySelectorAll('#events li')].map(li => li.textContent)"
    )
    connections = [event.split()[-1] for event in events if event.endswith("connected")]
    assert connections[0] == "connected", events


def test_sign_out_on_a_shared_browser_leaves_the_next_person_none_of_the_rooms(
    site: Site, person: Browser
):
    _signed_out_page(person, site)
    _sign_in(person, "dave", register=True, keep=False)
    person.join("dave-secret")
    person.field("logout").click()
    person.wait(lambda: person.field("login-panel").is_displayed(), "the sign-in form")
    assert not [value for value in person.storage().values() if "dave-secret" in value]

    _sign_in(person, "erin", register=True, keep=False)
    person.wait(lambda: person.js("return state.roomsOf") == "erin", "erin's rooms loaded")
    assert _rooms(person) == []
    assert person.field("room-title").text == "no room"
    assert not person.js("return document.querySelector('ol.messages')")
    # and dave, signing in again, starts afresh too
    person.field("logout").click()
    person.wait(lambda: person.field("login-panel").is_displayed(), "the sign-in form")
    _sign_in(person, "dave", register=False, keep=False)
    person.wait(lambda: person.js("return state.roomsOf") == "dave", "dave's rooms loaded")
    assert _rooms(person) == []


@pytest.mark.parametrize("width", [390, 1280])
def test_at_a_phones_and_a_desktops_width_nothing_scrolls_sideways_and_every_control_is_reachable(
    site: Site, person: Browser, width: int
):
    from selenium.webdriver.common.keys import Keys

    person.driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {
            "width": width,
            "height": 844 if width < 600 else 900,
            "deviceScaleFactor": 1,
            "mobile": width < 600,
        },
    )
    try:
        _signed_out_page(person, site)
        _assert_fits(person, width)
        _screenshot(person, f"sign-in-{width}")
        _sign_in(person, f"frank{width}", register=True, keep=False)
        # the rooms (and the room box): folded behind a button at a phone's width,
        # beside the messages at a desktop's
        room_list = person.field("room-box")
        if width < 600:
            assert not room_list.is_displayed()
            person.field("rooms-toggle").send_keys(Keys.ENTER)  # from the keyboard
            assert person.field("rooms-toggle").get_attribute("aria-expanded") == "true"
        for room in ("lobby", "a-room-with-a-rather-long-name-0123456789"):
            person.join(room)
        _bob_says(site, "lobby", ["long: " + "x" * 56, "and a short one"])
        assert room_list.is_displayed()
        _assert_fits(person, width)
        person.field("rooms").find_element("css selector", "li[data-room=lobby] button").click()
        person.wait(lambda: len(person.messages("lobby")) == 2, "lobby's messages")
        # a room chosen on a phone takes the screen
        assert room_list.is_displayed() == (width >= 600)
        _assert_fits(person, width)
        _screenshot(person, f"chat-{width}")
        _assert_named(person)
    finally:
        person.driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def _screenshot(person: Browser, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    person.driver.save_screenshot(str(SHOTS / f"{name}.png"))
    print(f"screenshot: {SHOTS / name}.png")


def _assert_fits(person: Browser, width: int) -> None:
    sideways = person.js(_SIDEWAYS_JS)
    assert sideways["clientWidth"] == width
    assert sideways["scrollWidth"] <= sideways["clientWidth"], sideways
    height = person.js("return window.innerHeight")
    controls = person.js(_CONTROLS_JS)
    assert len(controls) >= 4
    outside = [
        c
        for c in controls
        # (a pixel's slack: boxes are laid out in fractions of one)
        if c["left"] < -1 or c["right"] > width + 1 or c["top"] < -1 or c["bottom"] > height + 1
    ]
    assert outside == [], outside


def _assert_named(person: Browser) -> None:
    """Every control in the accessibility tree Chromium builds has a name."""
    tree = person.driver.execute_cdp_cmd("Accessibility.getFullAXTree", {})["nodes"]
    controls = [
        node
        for node in tree
        if not node.get("ignored")
        and node.get("role", {}).get("value") in {"button", "textbox", "checkbox", "list", "log"}
    ]
    assert len(controls) >= 5
    unnamed = [n for n in controls if not str(n.get("name", {}).get("value", "")).strip()]
    assert unnamed == [], unnamed
