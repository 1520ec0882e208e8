"""A running job's log lines on the chain page, in a real browser: they appear while the
job runs (over the page's server-sent events, no reload), per attempt, and markup in a
line is shown as text, never run."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, expect

from queuert_notify import Client, Worker
from queuert_notify.dashboard import create_app
from queuert_notify.jobs import Job, JobContext
from tests.support.dashboard_server import served
from tests.test_dashboard_browser import _assert_inert, shoot

pytest_plugins = ["tests.support.queue_fixtures", "tests.support.browser"]

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.slow,
    pytest.mark.parametrize("state_kind", ["sqlite", "postgres"], indirect=True),
]

MARKUP = '<img src=x onerror="window.__xss = 1">'


async def test_the_chain_page_shows_a_running_jobs_lines_live_per_attempt(
    browser: Browser, client: Client, tmp_path: Path
) -> None:
    release = asyncio.Event()

    async def import_rows(job: Job, ctx: JobContext) -> Any:
        ctx.log("reading rows.csv", attempt=job.attempt)
        if job.attempt == 1:
            raise RuntimeError("the file server timed out")
        ctx.log(f"row 17 has markup: {MARKUP}", row=17)
        await release.wait()
        ctx.log("imported 1,204 rows", rows=1204)
        return {"rows": 1204}

    chain = await client.start_chain("import-rows", {"file": "rows.csv"}, max_attempts=3)
    async with served(create_app(client.state, client.notify)) as url:
        page = await browser.new_page()
        await page.goto(f"{url}/chains/{chain.id}")
        await expect(page.locator("#live-state")).to_have_text("live")
        await expect(page.locator("pre.log")).to_have_count(0)
        # The page was rendered before the job ran: what follows comes over its events.
        async with Worker(client, {"import-rows": import_rows}, retry_backoff=lambda a: 0.0):
            first = page.locator('pre.log[data-attempt="1"]')
            second = page.locator('pre.log[data-attempt="2"]')
            # Written while the job runs, shown without a reload.
            await expect(second).to_contain_text("row 17 has markup", timeout=30_000)
            await expect(first).to_contain_text("reading rows.csv")
            await expect(second).to_contain_text(MARKUP)
            await expect(page.locator("h1 .status")).to_have_text("running")
            await shoot(page, tmp_path, "dashboard-job-logs")
            release.set()
            await expect(second).to_contain_text("imported 1,204 rows", timeout=30_000)
            await expect(page.locator("h1 .status")).to_have_text("completed")
            await _assert_inert(page)
