"""The notify/listen half shared by the adapters that speak to a transport
(Redis, Redis Cluster, Postgres, NATS): three kinds of channel, one shared
listener, and the ``on_reconnect`` registry."""

from __future__ import annotations

import asyncio
import logging
from abc import abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from typing import ClassVar

from queuert_notify.errors import NotifyAdapterClosedError
from queuert_notify.notify.payloads import decode_payload, encode_payload
from queuert_notify.notify.protocol import (
    ConnectOnEnter,
    JobIdCallback,
    SignalCallback,
    TypeNameCallback,
    Unsubscribe,
)
from queuert_notify.notify.publish_batch import PublishBatch
from queuert_notify.notify.shared_listener import SharedListener

logger = logging.getLogger(__name__)


class ChannelNotifyAdapter(ConnectOnEnter):
    """Maps each ``notify_*``/``listen_*`` call to one message on, or one listener
    of, the channel of its kind; a subclass supplies only the transport.

    Invariants:

    - Every ``notify_*`` checks its payload before anything is sent, then makes
      one :meth:`_publish` call (chain-completed and ownership-lost messages published
      in the same turn of the event loop share one where ``_BATCH_PUBLISHES``, see
      :class:`PublishBatch`); every ``listen_*`` connects first (lazily) and registers on
      the one :class:`SharedListener`, so a channel is subscribed once however many
      listeners share it. A channel is unsubscribed when its last listener leaves, except the one
      ownership-lost channel shared by every job (all but Redis Cluster's per-job
      channels): once listened, it stays subscribed until ``close()``, because a worker
      listens on it for every run it starts.
    - The channel of a message is :meth:`_channel` of its kind's base name
      (``_sched``, ``_chainc``, ``_owls``, from ``channel_name(prefix, kind)``)
      and the value; a channel carries type names exactly when its name starts
      with ``_sched`` (no kind's name is a prefix of another's).
    - A malformed payload received is counted in :attr:`ignored_messages` and
      dropped, never raised; ``on_reconnect`` callbacks run isolated from each
      other, each time the subclass calls :meth:`_fire_reconnect`.
    - After ``close()`` (which sets ``_closed``) every call raises
      ``NotifyAdapterClosedError``.
    """

    _ADAPTER_NAME: ClassVar[str]  # the public class, named in the closed error
    _BATCH_PUBLISHES: ClassVar[bool] = True
    """Whether messages published in one turn share a :meth:`_publish` call; False for a
    transport that would deliver identical messages of one call only once."""

    def __init__(
        self,
        *,
        prefix: str,
        address: str,
        channel_name: Callable[[str, str], str],
        listener: SharedListener,
    ) -> None:
        self._prefix = prefix
        self._address = address
        self._sched = channel_name(prefix, "sched")
        self._chainc = channel_name(prefix, "chainc")
        self._owls = channel_name(prefix, "owls")
        self._listener = listener
        self._reconnect_callbacks: dict[int, SignalCallback] = {}
        self._every_lost: dict[int, JobIdCallback] = {}
        self._next_callback_id = 0
        self._connect_lock = asyncio.Lock()
        self._connected = False
        self._closed = False
        self._ignored_messages = 0
        self._batch = PublishBatch(self._publish) if self._BATCH_PUBLISHES else None

    @property
    def ignored_messages(self) -> int:
        """How many messages on our channels were dropped as malformed (empty,
        oversized, not UTF-8, holding NUL) since the adapter was created."""
        return self._ignored_messages

    @property
    def prefix(self) -> str:
        """The prefix of every channel (and key) this adapter uses."""
        return self._prefix

    # -- what a subclass supplies ----------------------------------------------

    @abstractmethod
    async def _publish(self, messages: list[tuple[str, str]]) -> None:
        """Send every ``(channel, payload)``, connecting first (lazily)."""

    def _channel(self, base: str, value: str) -> str:
        """The channel of a message about ``value`` whose kind's base name is ``base``;
        by default every value of a kind shares its one channel."""
        return base

    # -- notifications -------------------------------------------------------

    async def notify_job_scheduled(self, type_name: str) -> None:
        await self._publish([self._message(self._sched, "type name", type_name)])

    async def listen_job_scheduled(
        self, type_names: Sequence[str], callback: TypeNameCallback
    ) -> Unsubscribe:
        await self._ready()
        by_channel: dict[str, list[str]] = {}
        for type_name in type_names:
            by_channel.setdefault(self._channel(self._sched, type_name), []).append(type_name)
        if len(by_channel) == 1:
            [(channel, names)] = by_channel.items()
            return await self._listener.add(channel, names, callback)
        # No type (nothing to hear), or one channel per type (Redis Cluster): every
        # registration made, or none.
        unsubscribes: list[Unsubscribe] = []

        async def unsubscribe_all() -> None:
            for unsubscribe in unsubscribes:
                await unsubscribe()

        try:
            for channel, names in by_channel.items():
                unsubscribes.append(await self._listener.add(channel, names, callback))
        except BaseException:
            await unsubscribe_all()
            raise
        return unsubscribe_all

    async def notify_chain_completed(self, chain_id: str) -> None:
        # Completions of one committed batch are sent together (NotificationBuffer.flush
        # starts them in one turn): one round trip for all, see PublishBatch.
        await self._publish_one(self._message(self._chainc, "chain id", chain_id))

    async def notify_signals(self, chain_ids: Sequence[str], job_ids: Sequence[str]) -> None:
        """``notify_chain_completed`` for each chain, then ``notify_job_ownership_lost``
        for each job, in one transport call (what a committed batch of completions owes:
        ``NotificationBuffer.flush`` calls this instead of one call per chain)."""
        messages = [self._message(self._chainc, "chain id", c) for c in chain_ids]
        messages += [self._message(self._owls, "job id", j) for j in job_ids]
        if messages:
            await self._publish(messages)

    async def listen_chain_completed(self, chain_id: str, callback: SignalCallback) -> Unsubscribe:
        await self._ready()
        return await self._listener.add(self._channel(self._chainc, chain_id), [chain_id], callback)

    async def notify_job_ownership_lost(self, job_id: str) -> None:
        await self._publish_one(self._message(self._owls, "job id", job_id))

    async def listen_job_ownership_lost(self, job_id: str, callback: SignalCallback) -> Unsubscribe:
        await self._ready()
        channel = self._channel(self._owls, job_id)
        if channel == self._owls:
            # One channel carries every job's loss, and a worker listens on it for each
            # run it starts and leaves when the run ends: kept subscribed once listened,
            # a run costs no SUBSCRIBE/UNSUBSCRIBE round trip (nor needs the server).
            await self._listener.keep_subscribed(channel)
        return await self._listener.add(channel, [job_id], callback)

    async def listen_every_job_ownership_lost(self, callback: JobIdCallback) -> Unsubscribe | None:
        """On the one ownership-lost channel, kept subscribed (as for a listener of one
        job); ``None`` where each job has a channel of its own (Redis Cluster)."""
        await self._ready()
        if self._channel(self._owls, "any job") != self._owls:
            return None
        await self._listener.keep_subscribed(self._owls)
        callback_id = self._next_callback_id
        self._next_callback_id += 1
        self._every_lost[callback_id] = callback

        async def unsubscribe() -> None:
            self._every_lost.pop(callback_id, None)

        return unsubscribe

    def on_reconnect(self, callback: SignalCallback) -> Unsubscribe:
        """Run ``callback`` whenever the subscription was lost or restored: messages
        may have been missed, so poll now."""
        self._check_open()
        callback_id = self._next_callback_id
        self._next_callback_id += 1
        self._reconnect_callbacks[callback_id] = callback

        async def unsubscribe() -> None:
            self._reconnect_callbacks.pop(callback_id, None)

        return unsubscribe

    # -- for subclasses ------------------------------------------------------------

    async def _publish_one(self, message: tuple[str, str]) -> None:
        if self._batch is None:
            await self._publish([message])
        else:
            await self._batch.publish(message)

    def _message(self, base: str, what: str, value: str) -> tuple[str, str]:
        """The ``(channel, payload)`` of a message about ``value``; raises
        ``InvalidInputError`` for a payload no transport may carry."""
        payload = encode_payload(what, value)
        return self._channel(base, payload), payload

    def _deliver(self, channel: str, data: object) -> None:
        """Hand a received message to its listeners; a malformed one is counted."""
        payload = decode_payload(data)
        if payload is None:
            # Empty, oversized, binary or foreign: a hint we cannot use. Count, never raise.
            self._ignored_messages += 1
            size = len(data) if isinstance(data, bytes | str) else None
            logger.debug(
                "ignored a malformed notification", extra={"channel": channel, "size": size}
            )
            return
        if channel.startswith(self._sched):
            self._listener.dispatch(channel, payload, payload)
        else:
            self._listener.dispatch(channel, payload)
            if channel == self._owls:
                for callback in list(self._every_lost.values()):
                    self._listener.run_callback(callback, payload)

    def _fire_reconnect(self) -> None:
        for callback in list(self._reconnect_callbacks.values()):
            self._listener.run_callback(callback)

    async def _ready(self) -> None:
        self._check_open()
        if not self._connected:
            await self.connect()

    async def _connect_once(self, open_connections: Callable[[], Awaitable[None]]) -> None:
        """``connect()``: ``open_connections()`` unless connected already. Concurrent
        calls wait for the one running it (and run it again if it raised); a closed
        adapter raises ``NotifyAdapterClosedError``, before and after the wait."""
        self._check_open()
        async with self._connect_lock:
            if self._connected:
                return
            self._check_open()
            await open_connections()
            self._connected = True

    async def _close_once(
        self,
        release: Callable[[], Awaitable[None]],
        seconds: float,
        log: logging.Logger,
        timed_out: str,
    ) -> None:
        """``close()``: ``release()`` on the first call only, with ``_closed`` set
        before it starts, for ``seconds`` at most; past them ``timed_out`` is logged
        on ``log`` (with the address and the timeout) and the rest is left."""
        if self._closed:
            return
        self._closed = True
        try:
            async with asyncio.timeout(seconds):
                await release()
        except TimeoutError:
            log.warning(timed_out, extra={"address": self._address, "timeout": seconds})

    def _check_open(self) -> None:
        if self._closed:
            raise NotifyAdapterClosedError(
                f"this {self._ADAPTER_NAME} ({self._address}, prefix {self._prefix!r}) is "
                "closed; create a new adapter"
            )
