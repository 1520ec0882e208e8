"""Debian's chromium for the browser tests: the ``browser`` fixture of the dashboard's
(``pytest_plugins``) and :func:`chromium` for a test that launches its own."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from playwright.async_api import Browser, async_playwright, expect

from tests.support.dashboard_server import CHROMIUM_ARGS, chromium_path

EXPECT_TIMEOUT_MS = 30_000
"""How long an ``expect(...)`` waits for the page: Playwright's default 5 s ran out in
a CI run on a machine stalled for seconds (a page that is right a little late)."""


@asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    """Debian's chromium, launched by Playwright, closed on the way out."""
    executable = chromium_path()
    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            await browser.close()


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    """:func:`chromium` for one test."""
    async with chromium() as launched:
        yield launched
