"""The web chat page: static files served on the chat server's own port, both transports.

:class:`WebSite` reads the page's files (``static/``: HTML, CSS, JavaScript, no build
step, nothing fetched from elsewhere) once at start and answers ``GET`` of their
paths from memory, with their content types, caching headers and a
Content-Security-Policy that allows only the page's own script files (no inline
script, no ``eval``), its own origin and the auth service's. ``/config.json`` is
generated from the settings: the auth service's public URLs (``AUTH_PUBLIC_URL``: one,
or one per replica, which the page fails over between) and the subprotocol the server
speaks, so the page needs no inline configuration.
It does no I/O after start and knows nothing of the transports: they turn its
:class:`WebFile` into their own HTTP answer.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from urllib.parse import urlsplit

#: the page's files: URL path -> (file in ``static/``, content type)
PAGE_FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/session.js": ("session.js", "text/javascript; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/style.css": ("style.css", "text/css; charset=utf-8"),
    "/favicon.svg": ("favicon.svg", "image/svg+xml"),
}
CONFIG_PATH = "/config.json"
#: index.html names its script and style sheet with this marker, replaced by a hash of
#: their contents so a changed file gets a new URL and may be cached long
VERSION_MARKER = "__ASSET_VERSION__"
#: the HTML and its configuration are revalidated on every load; the assets it names
#: by versioned URL are cached for a day
NO_CACHE = "no-cache"
ASSET_CACHE = "public, max-age=86400"


@dataclass(frozen=True, slots=True)
class WebFile:
    """One answer: the body, its content type and the other headers to send with it."""

    body: str
    content_type: str
    headers: tuple[tuple[str, str], ...]


def origin_of(url: str) -> str:
    """``scheme://host[:port]`` of an absolute http(s) URL (the CSP's and CORS' unit)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def content_security_policy(*auth_origins: str) -> str:
    """The page's policy: its own files only, no inline script; connections to itself
    (the websocket: CSP Level 3's ``'self'`` covers ``ws:`` on the page's host) and to
    the auth service's replicas."""
    return "; ".join(
        (
            "default-src 'none'",
            "script-src 'self'",
            "style-src 'self'",
            "img-src 'self'",
            f"connect-src 'self' {' '.join(dict.fromkeys(auth_origins))}",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        )
    )


class WebSite:
    """The page's files in memory, answered by path (``None``: not one of them)."""

    def __init__(self, auth_public_urls: tuple[str, ...], subprotocol: str) -> None:
        static = resources.files(__package__).joinpath("static")
        texts = {name: static.joinpath(name).read_text("utf-8") for name, _ in PAGE_FILES.values()}
        digest = hashlib.sha256()
        for name in sorted(texts):
            if name != "index.html":
                digest.update(texts[name].encode())
        texts["index.html"] = texts["index.html"].replace(VERSION_MARKER, digest.hexdigest()[:12])
        common = (
            (
                "Content-Security-Policy",
                content_security_policy(*(origin_of(url) for url in auth_public_urls)),
            ),
            ("X-Content-Type-Options", "nosniff"),
            ("Referrer-Policy", "no-referrer"),
        )
        self._files: dict[str, WebFile] = {}
        for path, (name, content_type) in PAGE_FILES.items():
            cache = NO_CACHE if name == "index.html" else ASSET_CACHE
            self._files[path] = WebFile(
                texts[name], content_type, (("Cache-Control", cache), *common)
            )
        auth_urls = [url.rstrip("/") for url in auth_public_urls]
        config = {"auth_urls": auth_urls, "subprotocol": subprotocol}
        self._files[CONFIG_PATH] = WebFile(
            json.dumps(config) + "\n",
            "application/json",
            (("Cache-Control", NO_CACHE), *common),
        )

    def answer(self, path: str) -> WebFile | None:
        """The file at URL ``path`` (without query), or None when the page has none there."""
        return self._files.get(path)
