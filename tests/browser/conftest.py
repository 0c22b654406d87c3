"""Fixtures for the browser tier: Debian's chromium, driven headless by Playwright.

The browser is the system's ``chromium`` package (``make setup`` apt-installs it); the
suite never runs ``playwright install``, so no browser is downloaded. Playwright only
needs ``executable_path``: given the full chromium binary it launches the new headless
mode (``--headless``), and the ``chromium_headless_shell`` build Playwright would
otherwise look for is not involved.

Database access: Playwright's sync API keeps an asyncio event loop running in the main
thread, so once a browser is up, Django's async-safety check refuses ORM calls made by
the test itself (``SynchronousOnlyOperation``). Tests that use ``page`` together with the
ORM (``django_user_model``, factories, ...) need
``os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"``; the ``browser`` fixture sets it while
the browser is up and restores the previous value afterwards. That is safe here: the
ORM is still used from one thread, the loop only belongs to Playwright. ``live_server``
serves requests from its own thread and needs nothing of this; pytest-django makes any
test that uses it a ``transactional_db`` test, so rows the test creates are committed
and visible to the server.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

_FALLBACK_CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="session")
def chromium_path() -> str:
    """Path of the chromium binary: $RELIER_CHROMIUM, else `chromium` on PATH, else Debian's."""
    override = os.environ.get("RELIER_CHROMIUM")
    candidate = override or shutil.which("chromium") or _FALLBACK_CHROMIUM
    path = Path(candidate)
    if path.is_file() and os.access(path, os.X_OK):
        return str(path)
    # A missing browser is a broken set-up, not an optional feature: fail, never skip.
    source = "$RELIER_CHROMIUM" if override else "PATH and " + _FALLBACK_CHROMIUM
    pytest.fail(
        f"no chromium executable at {candidate} (looked at {source}). Run `make setup`, "
        "which apt-installs chromium chromium-driver, or point RELIER_CHROMIUM at a "
        "chromium binary.",
        pytrace=False,
    )


@pytest.fixture(scope="package")
def browser(chromium_path: str) -> Iterator[Browser]:
    """One headless chromium for this package's tests, launched through Playwright's sync API.

    Package scope, not session: while Playwright runs, its event loop is the running loop
    of the main thread, and the tiers collected after this one (integration calls
    ``asyncio.run``; ``push`` refuses to run inside a loop) would fail. Closing it when the
    package ends also restores DJANGO_ALLOW_ASYNC_UNSAFE for them.
    """
    with pytest.MonkeyPatch.context() as mp:
        # See the module docstring: the ORM would otherwise refuse to run beside
        # Playwright's event loop. A value the caller already set wins.
        mp.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE", "true"))
        with sync_playwright() as playwright:
            # chromium_sandbox=False makes Playwright pass --no-sandbox: chromium refuses to
            # start as root with its sandbox on, and containers rarely allow the sandbox.
            instance = playwright.chromium.launch(
                executable_path=chromium_path, headless=True, chromium_sandbox=False
            )
            try:
                yield instance
            finally:
                instance.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh page in its own context (no shared cookies or storage), 1280x900."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        yield context.new_page()
    finally:
        context.close()
