"""Headless Chromium sessions on the chat page, driven by Debian's chromium-driver with
what a person would do (never a downloaded browser: selenium is pointed at
/usr/bin/chromedriver and /usr/bin/chromium; a test keeps selenium's own driver manager
offline with ``SE_OFFLINE=true``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from chatlab.harness import AuthProcess, KeyPair, ServerProcess
from tests.support import CHROMIUM
from tests.support.auth import TEST_SETTINGS

__all__ = ["CHROMEDRIVER", "PASSWORD", "WAIT_S", "Browser", "browsers", "page_services"]

CHROMEDRIVER = "/usr/bin/chromedriver"
#: the password :meth:`Browser.sign_in` types
PASSWORD = "correct horse battery"
WAIT_S = 20


#: the messages shown for a room, as the page shows them (text, never HTML)
_MESSAGES_JS = """
return [...document.querySelectorAll('ol.messages')]
  .filter(list => list.dataset.room === arguments[0])
  .flatMap(list => [...list.querySelectorAll('li.message')])
  .map(li => ({
    seq: Number(li.dataset.seq),
    user: li.querySelector('.user').textContent,
    body: li.querySelector('.body').textContent,
    origin: ['replayed', 'history', 'live'].find(c => li.classList.contains(c)),
  }));
"""

#: every key and value the page's origin keeps in sessionStorage and localStorage
_STORAGE_JS = """
const kept = {};
for (const [prefix, store] of [['session:', sessionStorage], ['local:', localStorage]])
  for (let i = 0; i < store.length; i++) kept[prefix + store.key(i)] = store.getItem(store.key(i));
return kept;
"""


class Browser:
    """One headless chromium session on the chat page, with what a person would do."""

    def __init__(self, name: str, profile: Path, flags: tuple[str, ...] = ()) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        # the network log holds each websocket handshake as Chromium saw it
        options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
        for flag in (
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-background-networking",
            "--window-size=1200,900",
            f"--user-data-dir={profile}",
            *flags,
        ):
            options.add_argument(flag)
        self.name = name
        self.driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
        self.driver.set_page_load_timeout(WAIT_S)

    def wait(self, condition: Callable[[], Any], what: str) -> Any:
        """Wait until ``condition()`` is truthy; its value."""
        from selenium.webdriver.support.ui import WebDriverWait

        return WebDriverWait(self.driver, WAIT_S, poll_frequency=0.05).until(
            lambda _: condition(), f"{self.name}: {what}"
        )

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def field(self, element_id: str) -> Any:
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.ID, element_id)

    def open(self, url: str) -> None:
        self.driver.get(url)

    def online(self) -> None:
        self.wait(lambda: self.field("connection").text == "online", "connected")

    def sign_in(self, username: str, register: bool) -> None:
        self.field("username").send_keys(username)
        self.field("password").send_keys(PASSWORD)
        self.field("register" if register else "login").click()
        self.online()
        assert self.field("whoami").text == f"signed in as {username}"

    def join(self, room: str) -> None:
        box = self.field("room-name")
        box.clear()
        box.send_keys(room)
        self.field("join").click()
        self.wait(lambda: self.field("room-title").text == room, f"joined {room}")

    def say(self, body: str) -> None:
        self.wait(lambda: self.field("body").is_enabled(), "send enabled")
        self.field("body").send_keys(body)
        self.field("send").click()

    def messages(self, room: str) -> list[dict[str, Any]]:
        return list(self.js(_MESSAGES_JS, room))

    def members(self) -> list[str]:
        return list(
            self.js(
                "return [...document.querySelectorAll('#members li')].map(li => li.dataset.user)"
            )
        )

    def cookies(self) -> list[dict[str, Any]]:
        """Every cookie the browser holds, for any host and path, ``HttpOnly`` ones too
        (from Chromium's DevTools protocol: what no page script can read)."""
        return list(self.driver.execute_cdp_cmd("Network.getAllCookies", {})["cookies"])

    def storage(self) -> dict[str, str]:
        """Everything the page's origin keeps in ``sessionStorage`` and ``localStorage``,
        by key (prefixed ``session:`` or ``local:``)."""
        return dict(self.js(_STORAGE_JS))

    def websocket_extensions(self) -> list[tuple[str, str]]:
        """(offered, answered) ``Sec-WebSocket-Extensions`` of each websocket handshake
        since the last call, from Chromium's network log."""
        pairs = []
        for entry in self.driver.get_log("performance"):
            event = json.loads(entry["message"])["message"]
            if event["method"] == "Network.webSocketHandshakeResponseReceived":
                response = event["params"]["response"]
                offered = _header(response.get("requestHeaders", {}), "Sec-WebSocket-Extensions")
                pairs.append((offered, _header(response["headers"], "Sec-WebSocket-Extensions")))
        return pairs

    def close(self) -> None:
        self.driver.quit()


def _header(headers: dict[str, str], name: str) -> str:
    """A header's value whatever its case ("" when absent)."""
    return next((v for k, v in headers.items() if k.lower() == name.lower()), "")


@contextmanager
def browsers(tmp_path: Path, *names: str, flags: tuple[str, ...] = ()) -> Iterator[list[Browser]]:
    """Independent browser sessions (Chromium given ``flags`` too); each one's screenshot
    is saved if the block fails."""
    opened: list[Browser] = []
    try:
        for name in names:
            opened.append(Browser(name, tmp_path / f"profile-{name}", flags))
        yield opened
    except BaseException:
        for browser in opened:
            shot = tmp_path / f"failure-{browser.name}.png"
            try:
                browser.driver.save_screenshot(str(shot))
                print(f"screenshot of {browser.name}: {shot}")
            except Exception as exc:  # the browser itself may be what failed
                print(f"no screenshot of {browser.name}: {exc}")
        raise
    finally:
        for browser in opened:
            browser.close()


@contextmanager
def page_services(
    root: Path,
    keys: KeyPair,
    auth_settings: dict[str, str] | None = None,
    page_hosts: tuple[str, ...] = ("127.0.0.1",),
    **chat_settings: Any,
) -> Iterator[tuple[AuthProcess, ServerProcess]]:
    """An auth service (``TEST_SETTINGS`` and ``auth_settings``) allowing the chat page's
    origin at each of ``page_hosts``, and an asyncio chat server (``chat_settings``) whose
    page names it; both killed at the end."""
    (root / "auth").mkdir()
    (root / "chat").mkdir()
    auth = AuthProcess(root / "auth", **{**TEST_SETTINGS, **(auth_settings or {})})
    chat = ServerProcess(
        root / "chat",
        keys,
        event_loop="asyncio",
        jwt_public_key=str(auth.public_path),
        auth_public_url=auth.url(),
        **chat_settings,
    )
    auth.env["AUTH_CORS_ORIGINS"] = ",".join(f"http://{host}:{chat.port}" for host in page_hosts)
    try:
        auth.start()
        chat.start()
        yield auth, chat
    finally:
        chat.kill()
        auth.kill()
