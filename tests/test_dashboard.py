"""The dashboard over HTTP: pages, filters and paging, actions guarded by CSRF, the
access token, read-only mode, live updates over server-sent events, and the CLI's
refusal to expose it without a token. (The browser tests are test_dashboard_browser.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from html import escape as html_escape
from html import unescape as html_unescape
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from sqlalchemy.ext.asyncio import create_async_engine

from queuert_notify import Client, InProcessNotifyAdapter
from queuert_notify.cli import main
from queuert_notify.cli.dashboard import is_loopback
from queuert_notify.dashboard import create_app, live, pages
from state_adapters import SqlAlchemyStateAdapter
from state_adapters.model import Completion, ContinueWith, NewJob
from state_adapters.notifications import NotificationBuffer
from tests.support.dashboard_server import served
from tests.support.services import free_port

pytestmark = pytest.mark.timeout(60)

PAYLOADS = ["<script>window.__xss = 1</script>", '"><img src=x onerror="window.__xss=1">']


@pytest.fixture
async def queue(tmp_path: Path) -> AsyncIterator[tuple[SqlAlchemyStateAdapter, Client]]:
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path}/jobs.db")
    state = SqlAlchemyStateAdapter(engine, table_prefix="dash_")
    await state.migrate()
    async with Client(state=state, notify=InProcessNotifyAdapter()) as client:
        try:
            yield state, client
        finally:
            await engine.dispose()


def http(app: object, **options: object) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),  # type: ignore[arg-type]
        **{"base_url": "http://dash.test", **options},  # type: ignore[arg-type]
    )


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, "the page has no action form"
    return found.group(1)


async def test_every_page_renders_stored_markup_as_text(queue: tuple) -> None:
    state, client = queue
    chain = await client.start_chain("email", {"to": PAYLOADS[0]}, dedup_key=PAYLOADS[1])
    await client.complete_chain(chain.id, {"note": PAYLOADS[1]})
    async with http(create_app(state, client.notify)) as h:
        pages = ["/", "/chains", f"/chains/{chain.id}", f"/chains?q={PAYLOADS[1]}"]
        for path in pages:
            response = await h.get(path)
            assert response.status_code == 200, path
            assert "<script>window" not in response.text and "<img" not in response.text
            assert response.headers["content-security-policy"].startswith("default-src 'none'")
        detail = (await h.get(f"/chains/{chain.id}")).text
        assert "&lt;script&gt;window.__xss = 1&lt;/script&gt;" in detail
        assert "&lt;img src=x onerror=" in detail


async def test_a_chain_page_shows_every_job_its_blockers_and_dependents(queue: tuple) -> None:
    state, client = queue
    first = await client.start_chain("fetch", {"url": "https://example.com"})
    (job,) = await state.acquire(["fetch"], worker_id="w-1", lease_seconds=30)
    follow = ContinueWith(NewJob("store", {"bytes": 1234}))
    await state.complete_jobs(
        [Completion(job.id, job.lease_token, continue_with=follow)], notes=NotificationBuffer()
    )
    report = await client.start_chain("report", {}, blockers=[first.id])
    async with http(create_app(state, client.notify)) as h:
        page = (await h.get(f"/chains/{first.id}")).text
        report_page = (await h.get(f"/chains/{report.id}")).text
    assert re.findall(r'data-job-id="([0-9a-f]+)"', page)[0] == first.id
    assert len(re.findall(r'data-job-id="', page)) == 2
    assert "&#34;bytes&#34;: 1234" in page and "store" in page
    assert f'href="/chains/{report.id}"' in page  # it blocks the report
    assert f'href="/chains/{first.id}"' in report_page and "waits for" in report_page


async def test_the_overview_counts_by_type_and_says_when_it_stopped_counting(
    queue: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    state, client = queue
    for n in range(3):
        done = await client.start_chain("email", {"n": n})
        await client.complete_chain(done.id, None)
    await client.start_chain("email", {})
    await client.start_chain("report", {}, delay=60)
    async with http(create_app(state, client.notify)) as h:
        page = (await h.get("/")).text
        assert re.search(r'data-type="email">.*?(<td[^>]*>\d+</td>\s*)+', page, re.S)
        cells = re.findall(r'<td class="num[^"]*">(\d+)</td>', page)
        # email: blocked, pending, running, completed, failed, cancelled; then report
        assert cells == ["0", "1", "0", "3", "0", "0", "0", "1", "0", "0", "0", "0"]
        assert 'id="truncated"' not in page
        monkeypatch.setattr(pages, "FINISHED_LIMIT", 2)
        assert 'id="truncated"' in (await h.get("/")).text


async def test_chains_list_filters_and_pages_newest_first(queue: tuple) -> None:
    state, client = queue
    ids = [(await client.start_chain("a" if n % 2 else "b", {"n": n})).id for n in range(60)]
    await client.cancel_chain(ids[0])
    async with http(create_app(state, client.notify)) as h:
        first = (await h.get("/chains?type=a")).text
        listed = re.findall(r'data-chain-id="([0-9a-f]+)"', first)
        assert listed == [i for n, i in enumerate(ids) if n % 2][::-1]
        assert 'rel="next"' not in first
        everything = (await h.get("/chains")).text
        older = re.search(r'rel="next" href="([^"]+)"', everything)
        assert older, "60 chains make two pages"
        second = (await h.get(older.group(1).replace("&amp;", "&"))).text
        rest = re.findall(r'data-chain-id="([0-9a-f]+)"', second)
        assert [*re.findall(r'data-chain-id="([0-9a-f]+)"', everything), *rest] == ids[::-1]
        cancelled = (await h.get("/chains?status=cancelled")).text
        assert re.findall(r'data-chain-id="([0-9a-f]+)"', cancelled) == [ids[0]]
        by_id = (await h.get(f"/chains?q={ids[7]}")).text
        assert re.findall(r'data-chain-id="([0-9a-f]+)"', by_id) == [ids[7]]
        assert (await h.get("/chains?status=done")).status_code == 400
        assert (await h.get("/chains?after=junk")).status_code == 400
        assert (await h.get("/chains/" + "0" * 32)).status_code == 404


async def test_actions_cancel_retry_and_run_now_with_a_csrf_token(queue: tuple) -> None:
    state, client = queue
    chain = await client.start_chain("email", {}, delay=3600)
    async with http(create_app(state, client.notify)) as h:
        page = (await h.get(f"/chains/{chain.id}")).text
        assert 'data-action="trigger"' in page and 'data-action="retry"' not in page
        token = csrf_of(page)
        done = await h.post(f"/chains/{chain.id}/trigger", data={"csrf": token})
        assert done.status_code == 303 and done.headers["location"].endswith("?done=trigger")
        job = (await client.get_chain(chain.id)).last_job
        assert job.scheduled_at.timestamp() <= time.time()
        await h.post(f"/chains/{chain.id}/cancel", data={"csrf": token})
        assert (await client.get_chain(chain.id)).status == "cancelled"
        page = (await h.get(f"/chains/{chain.id}?done=cancel")).text
        assert "Chain cancelled." in page and 'data-action="cancel"' not in page
        await h.post(f"/chains/{chain.id}/retry", data={"csrf": token})
        assert (await client.get_chain(chain.id)).status == "pending"
        refused = await h.post(f"/chains/{chain.id}/retry", data={"csrf": token})
        assert refused.status_code == 409 and "only a failed or cancelled chain" in refused.text


@pytest.mark.parametrize("forgery", ["missing", "wrong", "other_browser", "foreign_origin"])
async def test_an_action_without_this_browsers_csrf_token_changes_nothing(
    queue: tuple, forgery: str
) -> None:
    state, client = queue
    chain = await client.start_chain("email", {})
    app = create_app(state, client.notify)
    async with http(app) as h, http(app) as other:
        token = csrf_of((await h.get(f"/chains/{chain.id}")).text)
        headers = {}
        form = {"csrf": token}
        if forgery == "missing":
            form = {}
        elif forgery == "wrong":
            form = {"csrf": "0" * 64}
        elif forgery == "other_browser":
            h = other  # a browser without the nonce cookie the token belongs to
            await h.get("/")
        else:
            headers = {"origin": "http://evil.example"}
        response = await h.post(f"/chains/{chain.id}/cancel", data=form, headers=headers)
    assert response.status_code == 403
    assert (await client.get_chain(chain.id)).status == "pending"


async def test_a_request_for_a_host_not_allowed_is_refused_so_dns_rebinding_gets_nothing(
    queue: tuple,
) -> None:
    state, client = queue
    chain = await client.start_chain("email", {}, delay=3600)
    app = create_app(state, client.notify, allowed_hosts=["127.0.0.1:8765", "localhost:8765"])
    rebound = {"host": "rebind.attacker.example:8765"}
    async with http(app, base_url="http://127.0.0.1:8765") as h:
        # A page that rebinds its own name to 127.0.0.1: its requests carry its Host.
        for path in ["/", f"/chains/{chain.id}", "/static/live.js", f"/chains/{chain.id}?live=1"]:
            refused = await h.get(path, headers=rebound)
            assert refused.status_code == 400, path
            assert "csrf" not in refused.text and chain.id not in refused.text
        token = csrf_of((await h.get(f"/chains/{chain.id}")).text)
        forged = await h.post(
            f"/chains/{chain.id}/trigger",
            data={"csrf": token},
            headers={**rebound, "origin": "http://rebind.attacker.example:8765"},
        )
        assert forged.status_code == 400
        # The right Host with the rebinding page's Origin: the Origin is checked against
        # the allowed hosts, not against the request's own Host.
        foreign = await h.post(
            f"/chains/{chain.id}/trigger",
            data={"csrf": token},
            headers={"host": "127.0.0.1:8765", "origin": "http://rebind.attacker.example:8765"},
        )
        assert foreign.status_code == 403
        assert (await client.get_chain(chain.id)).last_job.scheduled_at.timestamp() > time.time()
        # Another allowed name of the same dashboard is its own origin.
        done = await h.post(
            f"/chains/{chain.id}/trigger",
            data={"csrf": token},
            headers={"host": "LOCALHOST:8765", "origin": "http://127.0.0.1:8765"},
        )
        assert done.status_code == 303
        assert (await h.get("/", headers={"host": "127.0.0.1:9999"})).status_code == 400


@pytest.mark.usefixtures("queue")  # the tables the dashboard reads
async def test_the_standalone_dashboard_answers_only_for_the_address_it_is_bound_to(
    tmp_path: Path,
) -> None:
    port = free_port()
    server = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "queuert_notify.cli", "dashboard"),
        *("--database-url", f"sqlite:///{tmp_path}/jobs.db", "--table-prefix", "dash_"),
        *("--port", str(port), "--allowed-host", "queue.internal.example"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        assert server.stdout is not None
        line = await server.stdout.readline()
        assert f"127.0.0.1:{port}" in line.decode(), line
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as h:
            for _ in range(400):  # the line is printed just before uvicorn listens
                with contextlib.suppress(httpx.ConnectError):
                    await h.get("/static/live.js")
                    break
                await asyncio.sleep(0.05)
            for host in [f"127.0.0.1:{port}", f"localhost:{port}", "queue.internal.example"]:
                assert (await h.get("/", headers={"host": host})).status_code == 200, host
            for host in [f"rebind.attacker.example:{port}", "localhost:1", "10.1.2.3"]:
                assert (await h.get("/", headers={"host": host})).status_code == 400, host
    finally:
        server.terminate()
        await server.wait()


async def test_read_only_hides_and_refuses_every_action(queue: tuple) -> None:
    state, client = queue
    chain = await client.start_chain("email", {})
    async with http(create_app(state, client.notify, read_only=True)) as h:
        page = (await h.get(f"/chains/{chain.id}")).text
        assert "data-action" not in page and 'method="post"' not in page
        response = await h.post(f"/chains/{chain.id}/cancel", data={"csrf": "x"})
    assert response.status_code == 403
    assert (await client.get_chain(chain.id)).status == "pending"


async def test_pause_and_resume_a_type_from_the_overview_and_see_its_limits(
    queue: tuple,
) -> None:
    state, client = queue
    await client.start_chain("email", {})
    await client.set_limits("email", concurrency=2, rate=50, per=timedelta(seconds=1))
    async with http(create_app(state, client.notify)) as h:
        page = (await h.get("/")).text
        assert 'data-action="pause" data-type="email"' in page
        assert re.search(r'id="limits".*<td>email</td>\s*<td class="num">2</td>', page, re.S)
        token = csrf_of(page)
        forged = await h.post("/types/pause", data={"csrf": "0" * 64, "type_name": "email"})
        assert forged.status_code == 403 and await client.paused_types() == set()

        done = await h.post("/types/pause", data={"csrf": token, "type_name": "email"})
        assert done.status_code == 303 and "done=pause" in done.headers["location"]
        assert await client.paused_types() == {"email"}
        page = (await h.get(done.headers["location"])).text
        assert "Type email paused." in page
        assert 'data-action="resume" data-type="email"' in page

        await h.post("/types/resume", data={"csrf": token, "type_name": "email"})
        assert await client.paused_types() == set()
        unknown = await h.post("/types/delete", data={"csrf": token, "type_name": "email"})
        assert unknown.status_code == 404


TYPE_NAMES = ["send/email", "q?x=1#frag", "pct%2Fenc", "100%", "..", "a b&c=d+e", "é/ü"]


def type_form(page: str, type_name: str) -> tuple[str, dict[str, str]]:
    """The action and fields of the form whose button acts on ``type_name``, as a
    browser would submit it."""
    for form in re.findall(r'<form method="post"[^>]*>.*?</form>', page, re.S):
        button = re.search(r'data-type="([^"]*)"', form)
        if button and html_unescape(button.group(1)) == type_name:
            action = html_unescape(re.search(r'action="([^"]*)"', form).group(1))  # type: ignore[union-attr]
            fields = re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', form)
            return action, {name: html_unescape(value) for name, value in fields}
    raise AssertionError(f"no form for type {type_name!r}")


async def test_a_type_with_any_name_is_shown_and_paused_and_resumed_from_the_overview(
    queue: tuple,
) -> None:
    state, client = queue
    for type_name in TYPE_NAMES:
        await client.start_chain(type_name, {})
    async with http(create_app(state, client.notify)) as h:
        for type_name in TYPE_NAMES:
            overview = await h.get("/")
            assert overview.status_code == 200, overview.text
            action, fields = type_form(overview.text, type_name)
            done = await h.post(action, data=fields)
            assert done.status_code == 303, (type_name, action, done.text)
            assert await client.paused_types() == {type_name}
            page = (await h.get(done.headers["location"])).text
            assert f"Type {html_escape(type_name)} paused." in page
            action, fields = type_form(page, type_name)
            assert (await h.post(action, data=fields)).status_code == 303
            assert await client.paused_types() == set()


async def test_read_only_hides_and_refuses_pausing_a_type(queue: tuple) -> None:
    state, client = queue
    await client.start_chain("email", {})
    async with http(create_app(state, client.notify, read_only=True)) as h:
        page = (await h.get("/")).text
        assert "data-action" not in page and 'method="post"' not in page
        response = await h.post("/types/pause", data={"csrf": "x", "type_name": "email"})
    assert response.status_code == 403
    assert await client.paused_types() == set()


async def test_with_a_token_every_request_must_carry_it(queue: tuple) -> None:
    state, client = queue
    app = create_app(state, client.notify, token="s3cret")
    async with http(app) as h:
        for path in ["/", "/chains", "/static/live.js", "/?live=1", "/?token=wrong"]:
            assert (await h.get(path)).status_code == 401, path
        assert (await h.post("/chains/x/cancel")).status_code == 401
        bearer = await h.get("/chains", headers={"authorization": "Bearer s3cret"})
        assert bearer.status_code == 200
        entry = await h.get("/chains?status=pending&token=s3cret")
        assert entry.status_code == 303 and entry.headers["location"] == "/chains?status=pending"
        assert "httponly" in entry.headers["set-cookie"].lower()
        assert (await h.get("/chains")).status_code == 200  # the cookie now
        bounce = await h.get("http://dash.test//evil.example/x?token=s3cret")
        assert bounce.headers["location"] == "/evil.example/x"  # never to another site


async def test_live_stream_pushes_a_status_change_before_the_periodic_reread(
    queue: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    state, client = queue
    # No periodic re-read within the test: an update after the cancel was pushed.
    monkeypatch.setattr(live, "REFRESH_WITH_NOTIFY", 3600.0)
    chain = await client.start_chain("email", {})
    async with (
        served(create_app(state, client.notify)) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as h,
        h.stream("GET", f"/chains/{chain.id}?live=1") as stream,
    ):
        assert stream.headers["content-type"].startswith("text/event-stream")
        events = _events(stream)
        assert (await anext(events))[0] == "hello"
        # Sent once the stream follows what the page shows.
        first = await anext(events)
        assert first[0] == "update" and 'data-status="pending"' in first[1]
        await client.cancel_chain(chain.id)
        name, html = await asyncio.wait_for(anext(events), 30)
        assert name == "update" and 'data-status="cancelled"' in html


async def test_without_a_notify_adapter_pages_fall_back_to_a_slow_reread(
    queue: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    state, client = queue
    assert live.REFRESH_WITHOUT_NOTIFY > live.REFRESH_WITH_NOTIFY
    monkeypatch.setattr(live, "REFRESH_WITHOUT_NOTIFY", 0.3)
    chain = await client.start_chain("email", {})
    async with (
        served(create_app(state)) as url,
        httpx.AsyncClient(base_url=url, timeout=10) as h,
        h.stream("GET", f"/chains/{chain.id}?live=1") as stream,
    ):
        events = _events(stream)
        assert await anext(events) == ("hello", "refresh")
        assert 'data-status="pending"' in (await anext(events))[1]
        await client.cancel_chain(chain.id)
        name, html = await asyncio.wait_for(anext(events), 5)
        assert name == "update" and 'data-status="cancelled"' in html


async def _events(stream: httpx.Response) -> AsyncIterator[tuple[str, str]]:
    """The named events of a server-sent-events stream (comments skipped)."""
    name, data = None, []
    async for line in stream.aiter_lines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data.append(line[6:])
        elif line == "" and name is not None:
            yield name, "\n".join(data)
            name, data = None, []


def test_cli_refuses_a_public_address_without_a_token() -> None:
    result = CliRunner().invoke(
        main, ["dashboard", "--database-url", "sqlite:///x.db", "--host", "0.0.0.0"]
    )
    assert result.exit_code == 2
    assert "--token" in result.output
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.com")


async def test_the_overview_lists_workers_and_flags_a_type_no_live_worker_handles(
    queue: tuple,
) -> None:
    state, client = queue
    await state.record_worker(
        "w-<b>1</b>", host="box", pid=7, type_names=["charge"], slots=4, starting=True
    )
    await client.start_chain("chrage", {})
    async with http(create_app(state, client.notify)) as h:
        page = (await h.get("/")).text
    assert 'data-worker="w-&lt;b&gt;1&lt;/b&gt;"' in page and ">live<" in page
    assert (
        "1 jobs of type &#39;chrage&#39; are due and no live worker handles that type; "
        "known types: charge"
    ) in page
