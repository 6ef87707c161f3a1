"""Fixtures of the web page's tests."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _selenium_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Selenium's driver manager may never fetch a browser or a driver."""
    monkeypatch.setenv("SE_OFFLINE", "true")
