"""One underlying subscription per channel, shared by any number of callbacks."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from queuert_notify.errors import NotifyAdapterClosedError
from queuert_notify.notify.protocol import Unsubscribe

logger = logging.getLogger(__name__)

ANY_PAYLOAD = None
"""Register under this key to receive every payload of a channel."""


class SharedListener:
    """Routes payloads of transport channels to registered callbacks.

    Invariants: a channel is subscribed on the transport while at least one
    callback is registered on it and unsubscribed when the last one leaves, unless
    it is kept (:meth:`keep_subscribed`: subscribed until :meth:`dispose`, with or
    without callbacks); ``add``/unsubscribe/``keep_subscribed``/``dispose``
    serialize on one ``asyncio.Lock`` so concurrent callers never leak or double a
    subscription; ``dispatch`` finds a payload's callbacks in O(1) and isolates
    their exceptions.
    """

    def __init__(
        self,
        subscribe: Callable[[str], Awaitable[None]],
        unsubscribe: Callable[[str], Awaitable[None]],
    ) -> None:
        self._subscribe = subscribe
        self._unsubscribe = unsubscribe
        self._lock = asyncio.Lock()
        # channel -> payload key (None = every payload) -> registration -> callback
        self._routes: dict[str, dict[str | None, dict[_Registration, Callable[..., object]]]] = {}
        self._kept: set[str] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._disposed = False

    @property
    def channels(self) -> list[str]:
        """Channels subscribed now, for having a callback or being kept (to re-subscribe)."""
        return list(self._routes)

    async def keep_subscribed(self, channel: str) -> None:
        """Subscribe ``channel`` if it is not yet, and keep it subscribed until
        :meth:`dispose` even when no callback is left: callbacks that come and go on it
        then cost no transport round trip. Idempotent."""
        if channel in self._kept:
            return
        async with self._lock:
            if self._disposed:
                raise NotifyAdapterClosedError("the notify adapter is closed; create a new one")
            if channel not in self._routes:
                await self._subscribe(channel)
                self._routes[channel] = {}
            self._kept.add(channel)

    async def add(
        self,
        channel: str,
        keys: Iterable[str | None],
        callback: Callable[..., object],
    ) -> Unsubscribe:
        """Register ``callback`` for payloads equal to one of ``keys`` on
        ``channel`` (``ANY_PAYLOAD`` for all); subscribes the channel first if
        it has no callback yet. Returns an idempotent unsubscribe."""
        registration = _Registration(self, channel, tuple(dict.fromkeys(keys)))
        async with self._lock:
            if self._disposed:
                raise NotifyAdapterClosedError("the notify adapter is closed; create a new one")
            if channel not in self._routes:
                # Subscribe before registering: if it fails nothing is left behind.
                await self._subscribe(channel)
                self._routes[channel] = {}
            routes = self._routes[channel]
            for key in registration.keys:
                routes.setdefault(key, {})[registration] = callback
        return registration

    async def _remove(self, registration: _Registration) -> None:
        async with self._lock:
            channel = registration.channel
            routes = self._routes.get(channel)
            if routes is None:
                return
            for key in registration.keys:
                callbacks = routes.get(key)
                if callbacks is not None:
                    callbacks.pop(registration, None)
                    if not callbacks:
                        del routes[key]
            if not routes and channel not in self._kept:
                del self._routes[channel]
                if not self._disposed:
                    try:
                        await self._unsubscribe(channel)
                    except Exception:
                        # The registration is gone either way; a transport
                        # subscription left behind only carries unrouted hints.
                        logger.warning(
                            "transport unsubscribe failed",
                            exc_info=True,
                            extra={"channel": channel},
                        )

    def dispatch(self, channel: str, payload: str, *args: object) -> int:
        """Run the callbacks registered for ``payload`` (and for every payload)
        on ``channel`` with ``args``; returns how many were called."""
        routes = self._routes.get(channel)
        if routes is None:
            return 0
        targets = [*routes.get(payload, {}).values(), *routes.get(ANY_PAYLOAD, {}).values()]
        for callback in targets:
            self.run_callback(callback, *args)
        return len(targets)

    def run_callback(self, callback: Callable[..., object], *args: object) -> None:
        """Call ``callback``; a coroutine result runs as an owned task.

        Errors are logged, never raised."""
        try:
            result = callback(*args)
        except Exception:
            logger.exception("notify callback failed", extra={"callback": repr(callback)})
            return
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(result)
            self._tasks.add(task)
            task.add_done_callback(self._finish_task)

    def _finish_task(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error(
                "notify callback failed", exc_info=task.exception(), extra={"task": task.get_name()}
            )

    async def dispose(self) -> None:
        """Unsubscribe every channel, cancel running callback tasks; later ``add`` raises."""
        async with self._lock:
            if self._disposed:
                return
            self._disposed = True
            self._kept.clear()
            channels, self._routes = list(self._routes), {}
            for channel in channels:
                try:
                    await self._unsubscribe(channel)
                except Exception:
                    logger.warning("unsubscribe failed during close", extra={"channel": channel})
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class _Registration:
    """One ``add``: its unsubscribe function (idempotent) and its key in the routes.

    A slotted object rather than a closure: every awaited chain and running job
    holds one while idle, and a closure with its cells costs several times more.
    """

    __slots__ = ("channel", "keys", "listener")

    def __init__(
        self, listener: SharedListener, channel: str, keys: tuple[str | None, ...]
    ) -> None:
        self.listener = listener
        self.channel = channel
        self.keys = keys

    async def __call__(self) -> None:
        await self.listener._remove(self)
