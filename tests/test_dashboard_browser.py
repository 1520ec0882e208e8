"""The dashboard in a real browser (Debian's chromium driven by Playwright): the
operator's path through it on Postgres + Redis, live updates without a reload, and
stored markup that never runs. Screenshots go to the test's tmp_path and, with
``QUEUERT_SCREENSHOTS_DIR=docs/images``, to the docs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, Page, expect
from sqlalchemy.ext.asyncio import create_async_engine

from queuert_notify import Client, InProcessNotifyAdapter, RedisNotifyAdapter
from queuert_notify.dashboard import create_app, live
from queuert_notify.testing import run_until_idle
from state_adapters import SqlAlchemyStateAdapter
from state_adapters.notifications import NotificationBuffer
from tests.support.dashboard_server import (
    screenshot_paths,
    served,
)
from tests.support.queue_helpers import drop_tables
from tests.support.redis_helpers import delete_prefix

pytest_plugins = ["tests.support.browser"]

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


async def shoot(page: Page, tmp_path: Path, name: str) -> None:
    for path in screenshot_paths(tmp_path, name):
        await page.screenshot(path=str(path), full_page=True)


async def send_email(job: Any, ctx: Any) -> dict[str, Any]:
    return {"sent": True, "to": job.input["to"]}


async def charge_card(job: Any, ctx: Any) -> None:
    raise RuntimeError(f"card declined for order {job.input['order']}: insufficient funds")


async def test_an_operator_filters_follows_cancels_live_and_retries(
    browser: Browser,
    postgres_url: str,
    redis_url: str,
    prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No periodic re-read within the test: a page that updates by itself was pushed.
    monkeypatch.setattr(live, "REFRESH_WITH_NOTIFY", 3600.0)
    engine = create_async_engine(postgres_url)
    state = SqlAlchemyStateAdapter(engine, table_prefix=f"{prefix}_")
    await state.migrate()
    notify = RedisNotifyAdapter(redis_url, prefix=prefix)
    try:
        async with Client(state=state, notify=notify) as client:
            for n in range(6):
                await client.start_chain("send-email", {"to": f"user{n}@example.com"})
            failed = await client.start_chain("charge-card", {"order": 1042}, max_attempts=1)
            handlers = {"send-email": send_email, "charge-card": charge_card}
            await run_until_idle(client, handlers)
            waiting = [
                await client.start_chain("send-email", {"to": f"later{n}@example.com"})
                for n in range(3)
            ]
            target = waiting[1]
            await client.start_chain("build-report", {"month": "2026-11"}, delay=3600)
            await client.start_chain("archive", {}, blockers=[waiting[0].id])

            async with served(create_app(state, notify)) as url:
                context = await browser.new_context(viewport={"width": 1280, "height": 900})
                page = await context.new_page()
                await page.goto(url + "/")
                row = page.locator('#by-type tr[data-type="charge-card"]')
                await expect(row).to_contain_text("1")
                await expect(page.locator("#live-state")).to_have_text("live")
                await shoot(page, tmp_path, "dashboard-overview")

                await page.click("text=Chains")
                await page.select_option("select[name=status]", "pending")
                await page.fill("input[name=type]", "send-email")
                await page.click("button:has-text('Filter')")
                await expect(page).to_have_url(f"{url}/chains?status=pending&type=send-email&q=")
                rows = page.locator("#chains tbody tr")
                await expect(rows).to_have_count(3)
                await shoot(page, tmp_path, "dashboard-chains")

                await page.click(f"a:has-text('{target.id}')")
                heading = page.locator("h1 .status")
                await expect(heading).to_have_text("pending")
                await expect(page.locator("#live-state")).to_have_text("live")
                await page.evaluate("window.__notReloaded = true")

                # Someone else cancels it in another tab; this one updates by itself.
                other = await context.new_page()
                await other.goto(f"{url}/chains/{target.id}")
                await other.click("button[data-action=cancel]")
                await expect(other.locator(".notice")).to_have_text("Chain cancelled.")
                await expect(heading).to_have_text("cancelled", timeout=30_000)
                assert await page.evaluate("window.__notReloaded") is True
                await shoot(page, tmp_path, "dashboard-chain-cancelled-live")
                await expect(page.locator("button[data-action=retry]")).to_be_visible()
                await other.close()

                await page.goto(f"{url}/chains?status=failed")
                await page.click(f"a:has-text('{failed.id}')")
                error = page.locator("#last-error")
                await expect(error).to_contain_text("Traceback")
                await expect(error).to_contain_text("card declined for order 1042")
                await shoot(page, tmp_path, "dashboard-chain-failed")
                await page.click("button[data-action=retry]")
                await expect(page.locator(".notice")).to_have_text("Chain retried.")
                await expect(page.locator("h1 .status")).to_have_text("pending")
                await shoot(page, tmp_path, "dashboard-chain-retried")
                await context.close()
            assert (await client.get_chain(failed.id)).status == "pending"
            assert (await client.get_chain(target.id)).status == "cancelled"
    finally:
        await drop_tables(engine, f"{prefix}_")
        await engine.dispose()
        await delete_prefix(redis_url, prefix)


PAYLOADS = [
    "<script>window.__xss = (window.__xss || 0) + 1; alert(1)</script>",
    '"><img src=x onerror="window.__xss = (window.__xss || 0) + 1; alert(2)">',
    '</pre><svg onload="window.__xss = 1"></svg><pre>',
]


async def test_stored_markup_in_inputs_outputs_and_errors_never_runs(
    browser: Browser, tmp_path: Path
) -> None:
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path}/jobs.db")
    state = SqlAlchemyStateAdapter(engine, table_prefix="xss_")
    await state.migrate()
    try:
        async with Client(state=state, notify=InProcessNotifyAdapter()) as client:
            done = await client.start_chain("t", {"html": PAYLOADS}, dedup_key=PAYLOADS[1])
            await client.complete_chain(done.id, {"reply": PAYLOADS})
            failing = await client.start_chain("t", PAYLOADS[1])
            (job,) = await state.acquire(["t"], worker_id=PAYLOADS[0], lease_seconds=30)
            assert job.lease_token is not None
            await state.set_progress(job.id, job.lease_token, {"step": PAYLOADS[2]})
            await state.fail_job(
                job.id, job.lease_token, "\n".join(PAYLOADS), notes=NotificationBuffer(), final=True
            )
            pending = await client.start_chain("t", {"later": PAYLOADS[0]})

            async with served(create_app(state, client.notify)) as url:
                page = await browser.new_page()
                dialogs: list[str] = []
                page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
                for path in [
                    "/",
                    "/chains",
                    f"/chains/{done.id}",
                    f"/chains/{failing.id}",
                    f"/chains?q={PAYLOADS[1]}",
                ]:
                    await page.goto(url + path)
                    await expect(page.locator("main")).to_be_visible()
                    await _assert_inert(page)
                await page.goto(f"{url}/chains/{failing.id}")
                await expect(page.locator("#last-error")).to_contain_text(PAYLOADS[0])
                await expect(page.locator("#last-error")).to_contain_text(PAYLOADS[1])
                await shoot(page, tmp_path, "dashboard-escaped")

                # HTML swapped in by a live update is as inert as the first render.
                await page.goto(f"{url}/chains/{pending.id}")
                await expect(page.locator("#live-state")).to_have_text("live")
                await client.cancel_chain(pending.id)
                # The update is pushed, or (a cancel published before the stream
                # subscribed) comes with the periodic re-read: either is a live update.
                await expect(page.locator("h1 .status")).to_have_text(
                    "cancelled", timeout=(live.REFRESH_WITH_NOTIFY + 10) * 1000
                )
                await expect(page.locator("#live")).to_contain_text(PAYLOADS[0])
                await _assert_inert(page)
                assert dialogs == []
    finally:
        await engine.dispose()


async def _assert_inert(page: Page) -> None:
    assert await page.evaluate("window.__xss") is None
    planted = await page.evaluate(
        "document.querySelectorAll('main script, main img, main [onerror], main [onload]').length"
    )
    assert planted == 0
