"""Messages published in the same turn of the event loop, sent in one transport call."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

Message = tuple[str, str]
"""``(channel, payload)``."""


class PublishBatch:
    """Merges the messages that callers publish in one turn of the event loop into one
    call of ``send`` (one round trip on every transport: a Redis pipeline, one
    ``pg_notify`` statement, one NATS flush), in the order they were published.

    The first caller of a turn leads: it yields once, so that the callers started in the
    same turn (for example by one ``asyncio.gather``) join its batch, then sends the
    batch itself; no task is created. Invariants: each caller returns once the call
    carrying its message has returned, and raises the exception that call raised; a
    joiner whose leader is cancelled mid-send gets a ``ConnectionError`` (its message
    may not have been sent), never a ``CancelledError`` of someone else's; a caller
    alone in its turn costs one extra pass of the loop, nothing more.
    """

    __slots__ = ("_joiners", "_messages", "_send")

    def __init__(self, send: Callable[[list[Message]], Awaitable[None]]) -> None:
        self._send = send
        self._messages: list[Message] | None = None
        self._joiners: list[asyncio.Future[None]] = []

    async def publish(self, message: Message) -> None:
        """Send ``message``, with the others published in this turn."""
        if self._messages is not None:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._messages.append(message)
            self._joiners.append(future)
            await future
            return
        messages = self._messages = [message]
        joiners: list[asyncio.Future[None]] = []
        self._joiners = joiners
        try:
            await asyncio.sleep(0)  # the callers of this turn join
        finally:
            self._messages = None
        error: BaseException | None = None
        try:
            await self._send(messages)
        except asyncio.CancelledError:
            error = ConnectionError("the publish carrying this message was cancelled")
            raise
        except BaseException as exc:
            error = exc
            raise
        finally:
            for future in joiners:
                if future.done():
                    continue
                if error is None:
                    future.set_result(None)
                else:
                    future.set_exception(error)
