"""The dashboard's Health page in a real browser (Debian's chromium driven by
Playwright), on Postgres while another connection holds a snapshot open and jobs churn:
the page names that backend, the dead rows vacuum cannot remove, and what to do; and
once the snapshot is released and the tables vacuumed, it drops them by itself. The
screenshot goes to the test's tmp_path and, with ``QUEUERT_SCREENSHOTS_DIR=docs/images``,
to the docs (docs/dashboard.md shows it)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from playwright.async_api import Browser, expect
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from queuert_notify.dashboard import create_app
from queuert_notify.dashboard.live import REFRESH_WITHOUT_NOTIFY
from state_adapters import SqlAlchemyStateAdapter
from state_adapters.model import NewChain, NewJob
from state_adapters.notifications import NotificationBuffer
from tests.support.dashboard_server import screenshot_paths, served
from tests.support.held_horizon import churn, held_snapshot, holds_the_horizon
from tests.support.queue_helpers import drop_tables

pytest_plugins = ["tests.support.browser"]

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


@holds_the_horizon
async def test_the_health_page_names_the_held_snapshot_until_it_is_gone(
    browser: Browser, postgres_url: str, prefix: str, tmp_path: Path
) -> None:
    engine = create_async_engine(postgres_url)
    state = SqlAlchemyStateAdapter(engine, table_prefix=f"{prefix}_")
    await state.migrate()
    holder = await held_snapshot(postgres_url)
    pid = holder.info.backend_pid
    held_since = time.monotonic()
    released = False
    try:
        await churn(state, 12_000, "send-email")
        backlog = [NewChain(NewJob("build-report", {"month": n})) for n in range(40)]
        await state.start_chains(backlog, notes=NotificationBuffer())
        async with engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.execute(text(f"VACUUM {prefix}_jobs"))  # cannot remove a thing
        await asyncio.sleep(max(0.0, 1.5 - (time.monotonic() - held_since)))
        async with served(create_app(state)) as url:
            context = await browser.new_context(viewport={"width": 1280, "height": 900})
            page = await context.new_page()
            await page.goto(url + "/health?horizon_age=1")
            severity = page.locator("#health-severity")
            await expect(severity).to_have_attribute("data-severity", "critical")
            await expect(page.locator(f'#horizon tr[data-pid="{pid}"]')).to_contain_text(
                "analytics-report"
            )
            findings = page.locator("#findings")
            await expect(findings).to_contain_text(f"backend {pid} (analytics-report")
            await expect(findings).to_contain_text(f"pg_terminate_backend({pid})")
            await expect(findings).to_contain_text(f"table {prefix}_jobs")
            for path in screenshot_paths(tmp_path, "dashboard-health"):
                await page.screenshot(path=str(path), full_page=True)

            await holder.execute("ROLLBACK")
            released = True
            async with engine.connect() as conn:
                conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
                for table in ("jobs", "chains"):
                    await conn.execute(text(f"VACUUM {prefix}_{table}"))
            # The page re-reads itself (no notify adapter: the slow refresh).
            await expect(page.locator(f'#horizon tr[data-pid="{pid}"]')).to_have_count(
                0, timeout=(REFRESH_WITHOUT_NOTIFY + 10) * 1000
            )
            await context.close()
    finally:
        if not released:
            await holder.execute("ROLLBACK")
        await holder.close()
        await drop_tables(engine, f"{prefix}_")
        await engine.dispose()
