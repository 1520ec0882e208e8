"""The overview's Workers panel in a real browser (Debian's chromium driven by
Playwright) is live like the rest of the page: a worker that starts appears, with its
types, and one that stops disappears, over the page's server-sent events without a
reload; a type no live worker handles is flagged until one does. Nothing announces a
worker starting or stopping, so the panel follows the page's periodic re-read
(``REFRESH_WITH_NOTIFY``); the bounds below leave a stalled machine 10 s beyond it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, expect

from queuert_notify import Client, Worker
from queuert_notify.dashboard import create_app
from queuert_notify.dashboard.live import REFRESH_WITH_NOTIFY
from tests.support.dashboard_server import served
from tests.test_dashboard_browser import shoot

pytest_plugins = ["tests.support.queue_fixtures", "tests.support.browser"]

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.slow,
    pytest.mark.parametrize("state_kind", ["postgres"], indirect=True),
]

WITHIN = (REFRESH_WITH_NOTIFY + 10) * 1000
"""Milliseconds to wait for a change nothing announces: one re-read, and a stall."""


async def charge(job: Any, ctx: Any) -> dict[str, Any]:
    return {"charged": job.input["amount"]}


async def test_the_workers_panel_follows_workers_starting_and_stopping_without_a_reload(
    browser: Browser, client: Client, tmp_path: Path
) -> None:
    await client.start_chain("chrage", {"amount": 12})  # a typo: no worker handles it
    async with served(create_app(client.state, client.notify)) as url:
        page = await browser.new_page(viewport={"width": 1280, "height": 1000})
        await page.goto(url + "/")
        await expect(page.locator("#live-state")).to_have_text("live")
        await page.evaluate("window.__sameDocument = true")
        await expect(page.locator("p#workers")).to_contain_text("no worker is running")
        unhandled = page.locator("#unhandled")
        await expect(unhandled).to_contain_text("type 'chrage' are due and no live worker")
        await expect(unhandled).to_contain_text("known types: none")

        handlers = {"charge": charge, "refund": charge}
        async with (
            Worker(client, handlers, worker_id="billing-1", concurrency=4),
            Worker(client, {"send-email": charge}, worker_id="mailer-1"),
        ):
            billing = page.locator('#workers tr[data-worker="billing-1"]')
            await expect(billing).to_contain_text("charge, refund", timeout=WITHIN)
            await expect(billing).to_contain_text("live")
            await expect(billing.locator("td.num").nth(1)).to_have_text("4")  # slots
            await expect(page.locator('#workers tr[data-worker="mailer-1"]')).to_contain_text(
                "send-email"
            )
            await expect(unhandled).to_contain_text("known types: charge, refund, send-email")
            await shoot(page, tmp_path, "dashboard-workers")
        # A clean stop deletes the worker's row: the panel empties again.
        await expect(page.locator("p#workers")).to_contain_text(
            "no worker is running", timeout=WITHIN
        )
        await expect(unhandled).to_contain_text("known types: none")
        assert await page.evaluate("window.__sameDocument") is True
        assert int(await page.locator("#live").get_attribute("data-updates") or 0) >= 2
