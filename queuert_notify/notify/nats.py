"""NATS Core notifications with wake budgets in a JetStream key-value bucket.

Wire layout (``prefix`` defaults to ``queuert``):

====================  ==========================================  ===============
what                  name                                        payload / value
====================  ==========================================  ===============
jobs became pending   subject ``{prefix}.sched``                  the type name
chain completed       subject ``{prefix}.chainc``                 the chain id
ownership lost        subject ``{prefix}.owls``                   the job id
wake budget           KV bucket ``{prefix}_hints`` (dots → ``_``), integer (ASCII),
                      key ``t.{type_name}`` (or ``b.{base64url}``) 60 s max age
====================  ==========================================  ===============
"""

from __future__ import annotations

import asyncio
import base64
import logging
import random
import re
from collections.abc import Mapping

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import KeyValueConfig, StorageType
from nats.js.kv import KeyValue

from queuert_notify.errors import ConfigurationError, mask_url
from queuert_notify.notify.channel_adapter import ChannelNotifyAdapter
from queuert_notify.notify.payloads import MAX_PAYLOAD_BYTES as MAX_PAYLOAD_BYTES
from queuert_notify.notify.payloads import check_count, encode_payload
from queuert_notify.notify.protocol import HINT_TTL_SECONDS
from queuert_notify.notify.shared_listener import SharedListener

logger = logging.getLogger(__name__)

_SCHEMES = ("nats", "tls", "ws", "wss")
_TOKEN = r"[A-Za-z0-9_-]+"
_PREFIX = re.compile(rf"{_TOKEN}(\.{_TOKEN})*")  # subject tokens; no wildcards, no spaces
_BUCKET = re.compile(_TOKEN)
_PLAIN_KEY = re.compile(r"[-/_=A-Za-z0-9]+(\.[-/_=A-Za-z0-9]+)*")
_CAS_ATTEMPTS = 50  # a consume that loses this many races in a row grants the wake


def subject_name(prefix: str, kind: str) -> str:
    """The subject of one notification kind (``sched``, ``chainc``, ``owls``)."""
    return f"{prefix}.{kind}"


def default_bucket(prefix: str) -> str:
    """The KV bucket holding wake budgets when ``kv_bucket`` is not given."""
    return f"{prefix.replace('.', '_')}_hints"


def hint_key(type_name: str) -> str:
    """The KV key of ``type_name``'s budget: readable when the name is a valid key,
    base64url otherwise (the two forms never collide)."""
    if _PLAIN_KEY.fullmatch(type_name):
        return f"t.{type_name}"
    return "b." + base64.urlsafe_b64encode(type_name.encode()).decode().rstrip("=")


class NatsNotifyAdapter(ChannelNotifyAdapter):
    """Notifications over NATS Core subjects; wake budgets in JetStream KV, changed by
    compare-and-swap on the entry revision.

    Guarantees:

    - ``url`` is ``nats://``, ``tls://``, ``ws://`` or ``wss://`` (several
      servers comma-separated). The client reconnects forever
      (``max_reconnect_attempts=-1``) and re-subscribes by itself; the
      ``on_reconnect`` callbacks then run, since messages may have been missed.
    - One NATS subscription per subject however many listeners; a listener
      registered by an awaited ``listen_*`` call hears every later notification
      (the call returns after the server confirmed the subscription), and every
      ``notify_*`` call returns after the server received the message.
    - Wake budgets are exact under concurrency: each change reads the entry and
      writes it back only if its revision is unchanged, retrying on conflict,
      so a budget of 3 wakes exactly 3 of any number of racing consumers and
      concurrent provides add up. A consume that keeps losing races grants the
      wake (waking is the safe answer). A budget expires 60 s after its last
      change (the bucket's max age).
    - Without JetStream on the server (detected at ``connect()``), wake hints
      degrade to no-ops with a logged warning: provide does nothing, consume
      returns True. :attr:`hints_enabled` tells which.
    - Payloads that are empty, longer than :data:`MAX_PAYLOAD_BYTES`, not
      UTF-8 or holding NUL are dropped and counted in :attr:`ignored_messages`
      (:mod:`~queuert_notify.notify.payloads`).
    - ``close()`` is idempotent, bounded by ``close_timeout``, and leaves no
      task running; afterwards calls raise ``NotifyAdapterClosedError``.

    While the client is disconnected, ``notify_*``, hint calls and a ``listen_*``
    that needs a new subscription raise ``nats.errors.ConnectionReconnectingError``
    at once (a slow server: ``nats.errors.TimeoutError`` after ``timeout``
    seconds); while no server could be reached yet, every call raises
    ``ConfigurationError`` as soon as each server refused once (a server that
    does not answer: after ``timeout``). Notifications are hints, so callers log
    and rely on polling.
    """

    _ADAPTER_NAME = "NatsNotifyAdapter"

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "queuert",
        kv_bucket: str | None = None,
        timeout: float = 5.0,
        close_timeout: float = 5.0,
    ) -> None:
        if not _PREFIX.fullmatch(prefix):
            raise ConfigurationError(
                f"NATS prefix {prefix!r} is not allowed: use tokens of letters, digits, '_' "
                "or '-' separated by single dots"
            )
        bucket = kv_bucket if kv_bucket is not None else default_bucket(prefix)
        if not _BUCKET.fullmatch(bucket):
            raise ConfigurationError(
                f"NATS KV bucket name {bucket!r} is not allowed: use letters, digits, '_' or '-'"
            )
        self._servers = _servers(url)
        super().__init__(
            prefix=prefix,
            address=",".join(mask_url(server, user_is_secret=True) for server in self._servers),
            channel_name=subject_name,
            listener=SharedListener(self._subscribe, self._unsubscribe),
        )
        self._bucket = bucket
        self._timeout = timeout
        self._close_timeout = close_timeout
        self._nc = Client()
        self._kv: KeyValue | None = None
        self._kv_lock = asyncio.Lock()
        self._subscriptions: dict[str, Subscription] = {}
        # What the servers answered while connect() runs (see _connect_client).
        self._connect_errors: list[Exception] = []
        self._every_server_failed = asyncio.Event()

    @property
    def kv_bucket(self) -> str:
        """The JetStream KV bucket that holds the wake budgets."""
        return self._bucket

    @property
    def hints_enabled(self) -> bool:
        """True once connected to a server with JetStream: budgets are kept."""
        return self._kv is not None

    # -- lifecycle -----------------------------------------------------------

    async def connect(self) -> None:
        """Connect, detect JetStream and open (or create) the hint bucket; idempotent.

        Raises ConfigurationError naming the (password-masked) address as soon
        as every server refused the connection, or when none answers within
        ``timeout``.
        """
        await self._connect_once(self._open)

    async def _open(self) -> None:
        try:
            await self._connect_client()
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            await self._nc.close()
            reason = "no answer in time" if isinstance(exc, TimeoutError) else str(exc)
            raise ConfigurationError(
                f"cannot reach NATS at {self._address}: {reason}; is the server running?"
            ) from exc
        try:
            self._kv = await self._open_bucket()
        except BaseException:
            await self._nc.close()
            raise

    async def _connect_client(self) -> None:
        """Connect to any one server; raises the last error as soon as every server
        failed once, TimeoutError after ``timeout``.

        nats-py retries the first connect as often as a lost connection
        (``max_reconnect_attempts=-1``: forever); without this, every call on an
        adapter whose servers are all down would wait out the whole ``timeout``.
        """
        self._connect_errors = []
        self._every_server_failed.clear()
        self._nc = Client()  # a fresh client: a cancelled connect leaves one half-open
        connecting = asyncio.ensure_future(
            self._nc.connect(
                servers=self._servers,
                name=f"queuert-notify {self._prefix}",
                max_reconnect_attempts=-1,  # the default gives up after ~2 minutes
                connect_timeout=max(1, round(self._timeout)),
                error_cb=self._on_error,
                disconnected_cb=self._on_disconnected,
                reconnected_cb=self._on_reconnected,
            )
        )
        failed = asyncio.ensure_future(self._every_server_failed.wait())
        try:
            async with asyncio.timeout(self._timeout):
                await asyncio.wait((connecting, failed), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (connecting, failed):
                task.cancel()
            await asyncio.gather(connecting, failed, return_exceptions=True)
        if connecting.cancelled():
            raise self._connect_errors[-1]
        connecting.result()

    async def close(self) -> None:
        """Drop every listener and close the connection; idempotent."""
        await self._close_once(
            self._shut_down, self._close_timeout, logger, "nats notify adapter close timed out"
        )

    async def _shut_down(self) -> None:
        await self._listener.dispose()
        self._subscriptions.clear()
        self._reconnect_callbacks.clear()
        # Closing the connection ends every subscription and the client's tasks.
        try:
            await self._nc.close()
        except Exception as exc:
            # nats-py writes queued commands to the socket before ending the
            # subscriptions; on a dead socket that raises and leaves their tasks.
            logger.info("nats close met a dead connection", extra={**self._log, "error": repr(exc)})
            for subscription in list(self._nc._subs.values()):
                subscription._stop_processing()
        # nats-py cancels its subscription tasks without awaiting them (when the
        # server is down nothing else yields); one loop turn lets them finish, so
        # nothing outlives close().
        await asyncio.sleep(0)

    # -- wake hints ------------------------------------------------------------

    async def provide_wake_hint(self, type_name: str, count: int) -> None:
        """Add ``count`` to the budget (compare-and-swap); 0, or no JetStream, is a no-op."""
        check_count(count)
        key = hint_key(encode_payload("type name", type_name))
        await self._ready()
        if count > 0 and self._kv is not None:
            await self._add_budget(key, count)

    async def consume_wake_hint(self, type_name: str) -> bool:
        """Take one unit; True when taken, when no budget exists or without JetStream;
        False when the budget is exhausted."""
        key = hint_key(encode_payload("type name", type_name))
        await self._ready()
        kv = self._kv
        if kv is None:
            return True
        self._require_connection()
        for attempt in range(_CAS_ATTEMPTS):
            try:
                entry = await kv.get(key)
            except nats.js.errors.KeyNotFoundError:
                return True  # missing, expired or deleted: wake rather than miss
            budget = _budget(entry.value)
            if budget is None:
                return True  # not ours to judge: wake
            if budget <= 0:
                return False
            try:
                await kv.update(key, b"%d" % (budget - 1), last=entry.revision)
                return True
            except nats.js.errors.KeyWrongLastSequenceError:
                await _after_conflict(attempt)
        logger.info("consume_wake_hint kept losing races; waking", extra={"type_name": type_name})
        return True

    async def notify_jobs_scheduled(self, counts: Mapping[str, int]) -> None:
        """Provide every budget, then publish every type name and flush once.

        Types with a count of 0 are skipped (no new jobs, nothing to announce).
        """
        # Every name and count is checked before anything is sent.
        scheduled = {
            encode_payload("type name", n): c for n, c in counts.items() if check_count(c) > 0
        }
        await self._ready()
        if not scheduled:
            return
        if self._kv is not None:
            # Budgets first: a woken consumer must find its budget.
            await asyncio.gather(
                *(self._add_budget(hint_key(name), count) for name, count in scheduled.items())
            )
        await self._publish([(self._sched, name) for name in scheduled])

    async def _add_budget(self, key: str, count: int) -> None:
        """Add ``count`` to ``key``'s budget; retries until its write wins (each lost
        race means another writer's succeeded, so the bucket as a whole progresses)."""
        recreated = False
        attempt = 0
        while True:
            kv = self._kv
            if kv is None:
                return
            self._require_connection()
            try:
                try:
                    entry = await kv.get(key)
                except nats.js.errors.KeyNotFoundError:
                    await kv.create(key, b"%d" % count)
                    return
                current = _budget(entry.value) or 0  # garbage is replaced, not added to
                await kv.update(key, b"%d" % (current + count), last=entry.revision)
                return
            except nats.js.errors.KeyWrongLastSequenceError:
                await _after_conflict(attempt)
                attempt += 1
            except nats.js.errors.NoStreamResponseError:
                # No stream behind the bucket: a restarted server lost the in-memory
                # bucket, or someone deleted it. Create it again, once.
                if recreated:
                    raise
                recreated = True
                await self._reopen_bucket(kv)

    async def _open_bucket(self) -> KeyValue | None:
        """Bind to the hint bucket, creating it when missing; None (with a warning)
        when the server has no JetStream."""
        js = self._nc.jetstream(timeout=self._timeout)
        try:
            await js.account_info()
        except nats.errors.Error as exc:
            logger.warning(
                "NATS server has no JetStream; wake hints are disabled (every consume wakes)",
                extra={"address": self._address, "error": repr(exc)},
            )
            return None
        try:
            return await js.key_value(self._bucket)
        except nats.js.errors.BucketNotFoundError:
            pass
        config = KeyValueConfig(
            bucket=self._bucket,
            description="queuert-notify wake budgets",
            history=1,
            ttl=HINT_TTL_SECONDS,
            storage=StorageType.MEMORY,  # budgets are hints: losing them only wakes more
        )
        try:
            return await js.create_key_value(config)
        except nats.js.errors.BadRequestError:
            # Created meanwhile (by a peer, or by an operator with other settings): use it.
            return await js.key_value(self._bucket)

    async def _reopen_bucket(self, stale: KeyValue) -> None:
        async with self._kv_lock:
            if self._kv is stale:  # concurrent callers reopen once
                self._kv = await self._open_bucket()

    # -- subscriptions ---------------------------------------------------------

    async def _subscribe(self, subject: str) -> None:
        """SUBSCRIBE and wait until the server has it, so no later message is missed."""
        self._require_connection()
        subscription = await self._nc.subscribe(subject, cb=self._on_message)
        try:
            # Two round trips, not one: after the first PONG nats-server 2.9.10 still
            # drops about 1 in 200 messages another connection publishes at once (none
            # in 1,500 after the second; docs/reliability.md). Paid once per subject.
            await self._nc.flush(timeout=max(1, round(self._timeout)))
            await self._nc.flush(timeout=max(1, round(self._timeout)))
        except BaseException:
            await _quietly_unsubscribe(subscription)
            raise
        self._subscriptions[subject] = subscription

    async def _unsubscribe(self, subject: str) -> None:
        subscription = self._subscriptions.pop(subject, None)
        if subscription is not None and not self._closed:
            await subscription.unsubscribe()

    async def _on_message(self, msg: Msg) -> None:
        self._deliver(msg.subject, msg.data)

    # -- connection events -----------------------------------------------------

    async def _on_error(self, exc: Exception) -> None:
        if not self._connected:
            # connect() raises it (or the last one) in a ConfigurationError.
            self._connect_errors.append(exc)
            if len(self._connect_errors) >= len(self._servers):
                self._every_server_failed.set()
        # While reconnecting every failed attempt reports here; the outage itself
        # was logged once by _on_disconnected.
        quiet = self._nc.is_reconnecting or self._closed or not self._connected
        level = logging.DEBUG if quiet else logging.WARNING
        logger.log(
            level, "nats connection error", extra={"address": self._address, "error": repr(exc)}
        )

    async def _on_disconnected(self) -> None:
        if self._connected and not self._closed:  # a failed connect() is not an outage
            logger.warning("nats connection lost; reconnecting", extra={"address": self._address})

    async def _on_reconnected(self) -> None:
        # The client has re-subscribed every subject by now; messages published
        # while it was away are gone.
        logger.info("nats connection restored", extra={"address": self._address})
        self._fire_reconnect()

    # -- helpers -----------------------------------------------------------------

    async def _publish(self, messages: list[tuple[str, str]]) -> None:
        await self._ready()
        self._require_connection()
        for subject, payload in messages:
            await self._nc.publish(subject, payload.encode())
        # One round trip: returns once the server has every message.
        await self._nc.flush(timeout=max(1, round(self._timeout)))

    def _require_connection(self) -> None:
        # nats-py would queue the command while it reconnects and report success;
        # say instead that the server is away (callers rely on polling). It also
        # keeps that queue empty, which close() needs while the server is down.
        if not self._nc.is_connected:
            raise nats.errors.ConnectionReconnectingError()

    @property
    def _log(self) -> dict[str, str]:
        return {"address": self._address, "prefix": self._prefix}


def _servers(url: str) -> list[str]:
    servers = [part.strip() for part in url.split(",") if part.strip()]
    for server in servers:
        scheme = server.partition("://")[0].lower() if "://" in server else ""
        if scheme not in _SCHEMES:
            raise ConfigurationError(
                f"unsupported NATS URL {mask_url(server, user_is_secret=True)!r}: the scheme "
                "must be nats://, tls://, ws:// or wss://"
            )
    if not servers:
        raise ConfigurationError(
            "NatsNotifyAdapter needs a NATS URL such as 'nats://127.0.0.1:4222'"
        )
    return servers


async def _after_conflict(attempt: int) -> None:
    """Jittered pause after a lost compare-and-swap, so racers spread out."""
    await asyncio.sleep(random.uniform(0, 0.001 * 2 ** min(attempt, 5)))


async def _quietly_unsubscribe(subscription: Subscription) -> None:
    try:
        await subscription.unsubscribe()
    except nats.errors.Error:
        logger.debug("unsubscribe after a failed subscribe failed", exc_info=True)


def _budget(value: bytes | None) -> int | None:
    """The budget stored in ``value``, or None when it is not an integer."""
    try:
        return int(value or b"")
    except ValueError:
        return None
