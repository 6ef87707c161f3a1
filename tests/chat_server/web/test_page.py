"""The web chat page as served on the chat server's port, on both transports.

What a browser does with it is ``tests/chat_server/web/test_browser.py``'s; here: the files, their
headers, the generated configuration, and that nothing else on the port changed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from html.parser import HTMLParser

import pytest

from chat_server.web import PAGE_FILES, WebSite
from chatlab.harness import ServerProcess, http_request


def _get(server: ServerProcess, path: str):
    return http_request("GET", f"http://127.0.0.1:{server.port}{path}", timeout_s=10)


@pytest.mark.transports
def test_the_page_and_its_files_are_served_with_types_caching_and_policy(
    start_server: Callable[..., ServerProcess],
):
    server = start_server(
        event_loop="asyncio",
        auth_public_url="http://auth.example:9001/, https://auth2.example",
    )
    page = _get(server, "/")
    assert page.status == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert page.headers["cache-control"] == "no-cache"
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy
    assert "unsafe-eval" not in policy
    # every auth replica the page may fail over to
    assert "connect-src 'self' http://auth.example:9001 https://auth2.example;" in policy
    assert page.headers["x-content-type-options"] == "nosniff"
    assert b"__ASSET_VERSION__" not in page.body
    version = re.search(rb'app\.js\?v=([0-9a-f]{12})"', page.body)
    assert version is not None
    for path, (_, content_type) in PAGE_FILES.items():
        reply = _get(server, path)
        assert (reply.status, reply.headers["content-type"]) == (200, content_type), path
        assert reply.headers["content-security-policy"] == policy
        assert reply.headers["cache-control"] in ("no-cache", "public, max-age=86400")
    versioned = _get(server, f"/app.js?v={version.group(1).decode()}")
    assert versioned.status == 200 and versioned.headers["cache-control"] == "public, max-age=86400"
    config = _get(server, "/config.json")
    assert config.headers["content-type"] == "application/json"
    assert config.headers["cache-control"] == "no-cache"
    assert json.loads(config.body) == {
        "auth_urls": ["http://auth.example:9001", "https://auth2.example"],
        "subprotocol": "chatlab.json",
    }


@pytest.mark.transports
def test_the_rest_of_the_port_is_unchanged(start_server: Callable[..., ServerProcess]):
    server = start_server(event_loop="asyncio")
    assert _get(server, "/healthz").status == 200
    assert _get(server, "/stats").headers["content-type"] == "application/json"
    missing = _get(server, "/index.html")
    assert missing.status == 404 and "content-security-policy" not in missing.headers
    assert _get(server, "/ws").status == 401
    config = json.loads(_get(server, "/config.json").body)
    assert config["auth_urls"] == ["http://127.0.0.1:8001"]


class _Inline(HTMLParser):
    """Collects what would run inline: script elements with a body, event attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[dict[str, str | None]] = []
        self.handlers: list[str] = []
        self.in_script = False
        self.inline_script = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handlers += [name for name, _ in attrs if name.startswith("on")]
        if tag == "script":
            self.scripts.append(dict(attrs))
            self.in_script = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self.in_script = False

    def handle_data(self, data: str) -> None:
        if self.in_script:
            self.inline_script += data.strip()


def test_the_page_has_no_inline_script_and_never_writes_html():
    site = WebSite("http://127.0.0.1:8001", "chatlab.json")
    html = site.answer("/")
    assert html is not None
    parsed = _Inline()
    parsed.feed(html.body)
    names = [s.get("src", "").split("?")[0] for s in parsed.scripts]
    assert names == ["session.js", "app.js"]
    assert parsed.inline_script == "" and parsed.handlers == []
    scripts = [site.answer(f"/{name}") for name in names]
    # every string from a user or the server goes in as text
    for script in scripts:
        assert script is not None
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
            assert sink not in script.body, sink
    assert "textContent" in scripts[1].body
