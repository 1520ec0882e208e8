"""What a test of connections taken out of an engine's pool looks at: how many were
checked out, and whether a call cancelled at any of its awaits gives its own back."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine


def count_checkouts(engine: AsyncEngine) -> list[int]:
    """A one-item list counting the checkouts from ``engine``'s pool from now on."""
    checkouts = [0]

    def on_checkout(*_: Any) -> None:
        checkouts[0] += 1

    event.listen(engine.sync_engine, "checkout", on_checkout)
    return checkouts


async def cancelled_at_every_await(call: Callable[[], Awaitable[None]], *, after: int) -> None:
    """Run ``call()`` in a task, let it reach ``after`` awaits, then cancel it at every
    turn of the event loop until it ends; it must end cancelled or done."""
    task = asyncio.ensure_future(call())
    for _ in range(after):
        await asyncio.sleep(0)
    while not task.done():
        task.cancel()
        await asyncio.sleep(0)
    if not task.cancelled():
        task.result()
