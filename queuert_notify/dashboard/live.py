"""Live pages: a server-sent-events stream that re-renders a page's live region when
something it shows may have changed.

The notify adapter says when: a chain on the page completed (``listen_chain_completed``)
or a job of a type on the page became pending (``listen_job_scheduled``). Some changes
are announced by nothing (a worker claiming a job), so the region is also re-read every
``refresh`` seconds; without a notify adapter that slow re-read is all there is. A
region is sent only when its HTML changed. Notifications are hints: the database read
that follows is the truth.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import suppress
from typing import Any

from queuert_notify.dashboard.pages import Watch
from queuert_notify.notify.protocol import NotifyAdapter, Unsubscribe

logger = logging.getLogger(__name__)

REFRESH_WITH_NOTIFY = 5.0
"""Seconds between re-reads of a page whose changes the notify adapter announces
(only claims go unannounced)."""
REFRESH_WITHOUT_NOTIFY = 15.0
"""Seconds between re-reads when there is no notify adapter: the slow fallback."""
REFRESH_WHILE_RUNNING = 1.0
"""Seconds between re-reads of a page that shows a running job: its log lines are
written at most a second apart and nothing announces them."""
SETTLE = 0.1
"""Seconds to let a burst of notifications settle before re-reading once."""

Render = Callable[[], Awaitable[tuple[str, Watch]]]
"""Renders a page's live region now; returns its HTML and what it watches."""


class Subscriptions:
    """The notify subscriptions of one stream, kept equal to the page's last
    :class:`Watch`; every callback sets one event (coalescing)."""

    def __init__(self, notify: NotifyAdapter, changed: asyncio.Event) -> None:
        self.notify = notify
        self.changed = changed
        self.chains: dict[str, Unsubscribe] = {}
        self.types: frozenset[str] = frozenset()
        self.types_unsubscribe: Unsubscribe | None = None

    def _signal(self, *_: object) -> None:
        self.changed.set()

    async def follow(self, watch: Watch) -> None:
        """Subscribe to what ``watch`` names and drop what it no longer names. A failed
        subscription is logged and left to the periodic re-read."""
        try:
            for chain_id in set(self.chains) - watch.chain_ids:
                await self.chains.pop(chain_id)()
            for chain_id in watch.chain_ids - set(self.chains):
                self.chains[chain_id] = await self.notify.listen_chain_completed(
                    chain_id, self._signal
                )
            if watch.type_names != self.types:
                if self.types_unsubscribe is not None:
                    await self.types_unsubscribe()
                    self.types_unsubscribe = None
                self.types = watch.type_names
                if self.types:
                    self.types_unsubscribe = await self.notify.listen_job_scheduled(
                        sorted(self.types), self._signal
                    )
        except Exception:
            logger.warning(
                "dashboard live updates: subscribing failed; re-reading only", exc_info=True
            )

    async def close(self) -> None:
        """Drop every subscription (idempotent)."""
        unsubscribes = [*self.chains.values()]
        if self.types_unsubscribe is not None:
            unsubscribes.append(self.types_unsubscribe)
        self.chains.clear()
        self.types_unsubscribe = None
        for unsubscribe in unsubscribes:
            with suppress(Exception):
                await unsubscribe()


async def live_events(render: Render, notify: NotifyAdapter | None) -> AsyncIterator[str]:
    """The event stream of one page: an ``update`` event with the live region's HTML
    whenever it changed, a comment line otherwise (so a closed connection is noticed
    at the next write)."""
    changed = asyncio.Event()
    subscriptions = None if notify is None else Subscriptions(notify, changed)
    refresh = REFRESH_WITHOUT_NOTIFY if notify is None else REFRESH_WITH_NOTIFY
    last_html = None
    # Tells the page how often to expect a re-read, and that the stream is up.
    yield f"event: hello\ndata: {'notify' if notify else 'refresh'}\n\n"
    try:
        while True:
            html, watch = await render()
            if subscriptions is not None:
                await subscriptions.follow(watch)
            wait = min(refresh, REFRESH_WHILE_RUNNING) if watch.running else refresh
            if html != last_html:
                last_html = html
                yield _event("update", html)
            else:
                yield ": idle\n\n"
            with suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), wait)
            if changed.is_set():
                await asyncio.sleep(SETTLE)
                changed.clear()
    finally:
        if subscriptions is not None:
            await _to_completion(subscriptions.close())


async def _to_completion(cleanup: Coroutine[Any, Any, None]) -> None:
    """Run ``cleanup`` to its end, then re-raise a cancellation received meanwhile. A
    stream its client closed is cancelled by Starlette's cancel scope, which cancels it
    again at every await until it returns: awaited plainly, the first unsubscribe would
    be interrupted and every later one skipped, leaving the page's listeners registered
    (and their channels subscribed) for as long as the process runs."""
    task = asyncio.ensure_future(cleanup)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError as exc:
            cancelled = exc
    if cancelled is not None:
        raise cancelled


def _event(name: str, data: str) -> str:
    lines = "".join(f"data: {line}\n" for line in data.splitlines() or [""])
    return f"event: {name}\n{lines}\n"
