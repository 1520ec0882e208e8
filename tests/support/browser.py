"""The ``browser`` fixture of the dashboard's browser tests (``pytest_plugins``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from playwright.async_api import Browser, async_playwright

from tests.support.dashboard_server import CHROMIUM_ARGS, chromium_path


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    """Debian's chromium, launched by Playwright for one test."""

    executable = chromium_path()
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            await browser.close()
