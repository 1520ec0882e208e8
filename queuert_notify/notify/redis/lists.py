"""Durable wake tokens on Redis lists: the ``wake="lists"`` mode of ``RedisNotifyAdapter``.

The reliable-queue pattern applied to wakeups; the keys are in
:mod:`~queuert_notify.notify.redis.lists_wire`.

- ``notify_jobs_scheduled(counts)`` pushes ``counts[t]`` tokens per type in one script
  (``lua/push_wake_tokens.lua``) per *lane*, all sent at once; nothing is published.
  One token wakes one consumer. A lane is the types whose keys share a hash slot:
  every type on one server, the types of one slot on a cluster
  (:mod:`~queuert_notify.notify.redis.lists_lines`).
- A listening adapter is one *consumer*: per lane it blocks on ONE dedicated
  connection for all the lane's types (``BLMOVE`` into its processing list for one
  type: atomic; ``BLMPOP`` then ``RPUSH`` for several), and calls the type's
  callbacks once per token. On a cluster that is one blocking connection per slot
  holding its types, to the master serving the slot, following it when it moves.
- A worker consumes the token (``consume_wake_hint``, no round trip), claims, then
  calls ``acknowledge_wakes``: the token leaves the processing list (``LREM``). The
  worker also reports its free slots there. Tokens are wanted per type: a lane blocks
  only on its types some listener of has a free slot for that the held and granted
  tokens do not fill (a token that arrives anyway goes straight back to the head of
  its list, unannounced), and a report that changes them ends its blocking move. A
  token announced to a worker while all its slots were busy (it passes it over) is
  announced to it again once a whole claim pass left it held and the worker reports a
  free slot: held and never consumed, it would fill a free slot for good.
- Heartbeat and reaper: every ``consumer_timeout / 3`` the consumer renews its score in
  each type's consumer set and, in the same atomic script (one per lane), returns the
  processing lists of consumers whose score passed to the head of the token lists
  (``lua/wake_heartbeat.lua``): a worker killed holding a token wakes another within
  ``consumer_timeout`` plus one beat.
- Stale tokens (whose job another worker claimed by polling) cost at most one empty
  claim each; unused tokens disappear with their list 60 s after the last push.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from queuert_notify.notify.payloads import encode_payload
from queuert_notify.notify.protocol import (
    HINT_TTL_SECONDS,
    SignalCallback,
    TypeNameCallback,
    Unsubscribe,
)
from queuert_notify.notify.redis.lists_lines import Lane, LaneLosses, ListsPlacement
from queuert_notify.notify.redis.lists_listeners import WakeListeners
from queuert_notify.notify.redis.lists_wire import (
    ConsumerKeys,
    Heartbeat,
    move_one,
    token_pushes,
)
from queuert_notify.notify.redis.shared import (
    PUSH_WAKE_TOKENS,
    RETURN_WAKE_TOKENS,
    TAKE_WAKE_TOKEN,
    WAKE_HEARTBEAT,
    all_at_once,
    issued_key,
    processing_key,
    token_list_key,
)
from queuert_notify.notify.shared_listener import SharedListener
from state_adapters.backoff import Backoff

logger = logging.getLogger(__name__)

DEFAULT_CONSUMER_TIMEOUT = 10.0
"""Seconds without a heartbeat after which a consumer's moved tokens are returned."""

_TOKEN = "1"
_IN_FLIGHT_WAIT = 1.0  # seconds consume waits for a token its own blocking move took
_STOP_GRACE = 2.0  # seconds a loop gets to stop before it is cancelled
_GIVE_BACK_TIMEOUT = 1.0  # seconds leaving a type may wait to give its tokens back
_BACKOFF_FIRST, _BACKOFF_MAX = 0.05, 2.0


class RedisWakeLists:
    """The wake half of ``RedisNotifyAdapter(wake="lists")``; each public method keeps
    the promise of the adapter's method of the same name (see the module docstring).

    Invariants: a token moved into this consumer's processing lists is, at every
    moment, either *held* (announced to callbacks, not consumed), *granted* (consumed
    by ``consume_wake_hint``, not acknowledged) or on its way back to its token list;
    a lane blocks only on its types of which a listener has a free slot (no report
    yet: unbounded) the held and granted tokens, shared among the listeners of their
    types, do not fill (a token taken by ``consume_wake_hint`` from the list may go
    past); a token a listener heard of before
    its previous acknowledgement and still held when it reports free slots is announced
    to it again; a recount adopts only tokens in a processing list that are neither held,
    granted nor pending (their take, removal or give-back not answered yet); a killed
    consumer's tokens go back once its heartbeat lapses; a script call or blocking
    command names keys of one lane only.
    """

    def __init__(
        self,
        commands: Redis | RedisCluster,
        placement: ListsPlacement,
        *,
        prefix: str,
        address: str,
        ready: Callable[[], Awaitable[None]],
        consumer_timeout: float,
    ) -> None:
        self._commands = commands
        self._placement = placement
        self._prefix = prefix
        self._address = address
        self._ready = ready
        self.consumer = uuid.uuid4().hex[:16]
        self._listener = SharedListener(self._start_type, self._stop_type)
        self._lanes: dict[int, Lane] = {}
        self._lane_of: dict[str, Lane] = {}  # by type listened to
        self._held: Counter[str] = Counter()
        self._granted: Counter[str] = Counter()
        # Tokens taken, removed or given back by a command whose reply has not come: in
        # our processing lists or not, a recount cannot tell (see _pending_while).
        self._pending: Counter[str] = Counter()
        self._listeners = WakeListeners(self._held, self._listener.run_callback)
        self._changed = asyncio.Event()
        self._arrival = asyncio.Event()
        self._losses = LaneLosses(address, self._listener.run_callback)
        self._closed = False
        self._push = commands.register_script(PUSH_WAKE_TOKENS)
        self._take = commands.register_script(TAKE_WAKE_TOKEN)
        self._beat = commands.register_script(WAKE_HEARTBEAT)
        self._give_back = commands.register_script(RETURN_WAKE_TOKENS)
        self._keys = ConsumerKeys(prefix, placement, self.consumer, consumer_timeout)
        self._heart = Heartbeat(
            self._beat,
            self._keys,
            lambda: [list(lane.types) for lane in self._lanes.values()],
            address=address,
            name=f"queuert-notify wake heartbeat {prefix}",
        )

    # -- producing -------------------------------------------------------------------

    async def notify_job_scheduled(self, type_name: str) -> None:
        """One token: wakes one listener of ``type_name``."""
        await self.notify_jobs_scheduled({type_name: 1})

    async def provide_wake_hint(self, type_name: str, count: int) -> None:
        """``count`` tokens (a provide and a wake are the same thing here)."""
        await self.notify_jobs_scheduled({type_name: count})

    async def notify_jobs_scheduled(self, counts: Mapping[str, int]) -> None:
        """Push every type's tokens: one script per lane, all sent at once (one round
        trip of wall time); 0 counts are skipped."""
        calls = token_pushes(self._prefix, counts, self._placement)
        await self._ready()
        if calls:
            await all_at_once([self._push(keys=keys, args=args) for keys, args in calls])

    # -- consuming -------------------------------------------------------------------

    async def consume_wake_hint(self, type_name: str) -> bool:
        """A token this consumer holds (no round trip), else one taken from the list
        (moved into the processing list when this adapter listens to the type, popped
        otherwise). True when taken or when no token was issued lately; False only when
        tokens were issued within the TTL and every one is taken."""
        key = encode_payload("type name", type_name)
        await self._ready()
        if self._held[key] > 0:
            self._held[key] -= 1
            self._granted[key] += 1
            return True
        tag = self._placement.tag(key)
        keys = [token_list_key(self._prefix, tag), issued_key(self._prefix, tag)]
        if key in self._lane_of:
            keys.append(processing_key(self._prefix, tag, self.consumer))
        with self._pending_while({key: 1}):
            code, moved = (int(n) for n in await self._take(keys=keys, args=[HINT_TTL_SECONDS]))
        if code == 2:
            self._granted[key] += 1
        elif code == 0 and (self._held[key] > 0 or moved > self._held[key] + self._granted[key]):
            # Our blocking move took the last token a moment ago: it arrived during
            # this round trip, or its reply is on its way.
            return await self._in_flight(key)
        return code > 0

    async def _in_flight(self, type_name: str) -> bool:
        """Grant the token our blocking move is about to report (True if it does not
        come within a moment: wake rather than miss)."""
        with suppress(TimeoutError):
            async with asyncio.timeout(_IN_FLIGHT_WAIT):
                while self._held[type_name] <= 0:
                    self._arrival.clear()
                    await self._arrival.wait()
        if self._held[type_name] > 0:
            self._held[type_name] -= 1
            self._granted[type_name] += 1
        return True

    async def acknowledge_wakes(self, callback: TypeNameCallback, free_slots: int) -> None:
        """Remove every granted token from the processing lists (the claim they woke is
        done), record that ``callback``'s listener has ``free_slots`` free, and announce
        to it again, up to that many, the tokens of its types still held that it heard of
        before its previous acknowledgement: a token heard with a slot free is asked for
        by the next pass, so one a whole pass left held was passed over (heard while
        every slot was busy)."""
        if callback in self._listeners:
            # Recorded first: the blocking loops follow the worker's slots even while
            # Redis is unreachable.
            self._listeners.report(callback, free_slots)
        self._look_again()
        await self._ready()
        granted, self._granted = self._granted, Counter()
        if granted:
            self._look_again()  # their slots are free again
        try:
            if granted:
                async with self._commands.pipeline(transaction=False) as pipe:
                    for type_name, count in granted.items():
                        pipe.lrem(self._keys.processing(type_name), count, _TOKEN)
                    with self._pending_while(granted):
                        await pipe.execute()
            await self._return_surplus()
        except BaseException:
            # Whether the removals or give-backs were carried out is unknown: a token
            # left in a processing list, counted nowhere, would make every consume that
            # finds its list empty wait for it as one in flight. Each lane counts its
            # lists again at once (its blocking move ended), adopting what is there.
            for lane in self._lanes.values():
                lane.recount = True
                lane.nudge()
            self._changed.set()
            raise

    # -- listening -------------------------------------------------------------------

    async def listen_job_scheduled(
        self, type_names: Sequence[str], callback: TypeNameCallback
    ) -> Unsubscribe:
        """Call ``callback(t)`` once per token of a type in ``type_names`` this consumer
        moves; returns once the consumer is registered for every type."""
        await self._ready()
        names = [encode_payload("type name", name) for name in type_names]
        unsubscribes: list[Unsubscribe] = []
        self._listeners.add(callback, names)
        done = False

        async def unsubscribe_all() -> None:
            nonlocal done
            if done:
                return
            done = True
            self._listeners.remove(callback, names)
            for unsubscribe in unsubscribes:
                await unsubscribe()
            self._look_again()

        try:
            for name in dict.fromkeys(names):
                unsubscribes.append(await self._listener.add(name, [name], callback))
        except BaseException:
            await unsubscribe_all()
            raise
        self._look_again()  # a new listener wants tokens (unbounded until it reports)
        return unsubscribe_all

    def on_reconnect(self, callback: SignalCallback) -> Unsubscribe:
        """Run ``callback`` when a blocking connection was lost or every one restored
        (tokens may have been lost with a restarted server: poll now)."""
        return self._losses.on_reconnect(callback)

    async def close(self) -> None:
        """Stop moving tokens, give back every token this consumer holds, leave the
        consumer sets; idempotent. The blocking connections are closed (always ours)."""
        if self._closed:
            return
        self._closed = True
        self._listeners.stop()
        lanes = list(self._lanes.values())
        try:
            await asyncio.gather(*(self._stop_lane(lane) for lane in lanes))
            await self._heart.stop()
            await self._listener.dispose()
        finally:
            # Also when the caller's close timeout cut the give-backs short (a master
            # down): no connection outlives close().
            self._losses.clear()
            for lane in lanes:
                await lane.line.close()
            self._lanes.clear()

    # -- the consumer ----------------------------------------------------------------

    async def _start_type(self, type_name: str) -> None:
        """Register this consumer on ``type_name`` (so a reaper knows its processing
        list) before any token can be moved there, then block on it too."""
        await self._beat(
            keys=self._keys.beat_keys([type_name]), args=self._keys.beat_args([type_name])
        )
        tokens = self._keys.tokens(type_name)
        key = self._placement.lane(tokens)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = Lane(key, self._placement.line(tokens))
        lane.types.append(type_name)
        self._lane_of[type_name] = lane
        await self._restart(lane)
        self._heart.start()

    async def _stop_type(self, type_name: str) -> None:
        lane = self._lane_of.pop(type_name, None)
        if lane is not None and type_name in lane.types:
            lane.types.remove(type_name)
            if not self._closed:
                await self._restart(lane)
                if not lane.types:
                    del self._lanes[lane.key]
                    self._losses.forget(lane)
                    await lane.line.close()
                if not self._lanes:
                    await self._heart.stop()
        self._held.pop(type_name, None)
        self._granted.pop(type_name, None)
        try:
            # Bounded: a hanging server must not hold up a stop (see the except).
            async with asyncio.timeout(_GIVE_BACK_TIMEOUT):
                await self._give_back_tokens(type_name, 0)
        except Exception as exc:
            # They come back when the reaper sees this consumer's heartbeat lapse.
            logger.warning(
                "could not give back wake tokens",
                extra={"address": self._address, "type_name": type_name, "error": repr(exc)},
            )

    async def _restart(self, lane: Lane) -> None:
        """Restart the lane's blocking loop on its current types."""
        await self._stop_lane(lane)
        if lane.types and not self._closed:
            stop = lane.stop = asyncio.Event()
            lane.task = asyncio.create_task(
                self._block_loop(lane, stop), name=f"queuert-notify wake lists {self._prefix}"
            )

    async def _stop_lane(self, lane: Lane) -> None:
        """Stop the lane's loop. Cooperatively: redis-py may hold (or swallow) the
        cancellation of a command it is reading, so the loop is told to stop and the
        blocking command is ended by ``CLIENT UNBLOCK``; cancelling is the fallback."""
        task, lane.task = lane.task, None
        if task is None:
            return
        lane.stop.set()
        self._changed.set()
        deadline = asyncio.get_running_loop().time() + _STOP_GRACE
        while not task.done() and asyncio.get_running_loop().time() < deadline:
            if lane.moving and lane.client_id is not None:
                # Ends a blocking move at once (it moved nothing); sent again in case the
                # move reached the server after the first one. Never another command: the
                # push after a BLMPOP, held back by a write pause, would be refused, and
                # Redis 7.0 runs it all the same once writes resume.
                with suppress(Exception):
                    await lane.line.unblock(lane.client_id)
            await asyncio.wait([task], timeout=0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await lane.stop_nudging()

    async def _block_loop(self, lane: Lane, stop: asyncio.Event) -> None:
        """Move tokens of the lane's types while listeners want them, until ``stop``;
        never dies of a lost connection."""
        backoff = Backoff(_BACKOFF_FIRST, _BACKOFF_MAX)
        synced = False
        while not stop.is_set():
            try:
                if not synced:
                    await self._sync(lane)
                    synced = True
                elif lane.recount:
                    await self._adopt(lane)
                self._losses.restored(lane)
                wanted = self._wanted(lane.types)
                if not wanted:
                    self._changed.clear()
                    if not stop.is_set():  # set before _changed: no wakeup is lost
                        await self._changed.wait()
                    continue
                if stop.is_set():
                    return
                type_name = await move_one(lane, self._keys, wanted)
                if type_name is not None:
                    await self._arrived(type_name)
            except Exception as exc:
                if stop.is_set():
                    return  # the connection was closed to interrupt us
                synced = False
                lane.line.failed()
                self._losses.lose(lane, exc)
                await backoff.sleep()
                continue
            backoff.reset()

    async def _arrived(self, type_name: str) -> None:
        if not self._wanted([type_name]):
            # The type's listeners filled up while we were blocked: back to the head of
            # its list, unannounced (a held token nobody heard of would wait for good),
            # where the next consumer waiting takes it at once, or we once a slot frees.
            await self._give_back_tokens(type_name, 1)
            return
        self._held[type_name] += 1
        self._arrival.set()
        self._listeners.tell(type_name)
        self._listener.dispatch(type_name, type_name, type_name)

    async def _sync(self, lane: Lane) -> None:
        """Connect where the lane's keys live, learn the connection's id, re-register
        on every type and adopt tokens in our processing lists we do not know of
        (moved while a blocking command was being interrupted)."""
        types = list(lane.types)
        if not types:
            return
        lane.client_id = await lane.line.open()
        await self._beat(keys=self._keys.beat_keys(types), args=self._keys.beat_args(types))
        await self._adopt(lane)

    async def _adopt(self, lane: Lane) -> None:
        """Adopt the tokens in the lane's processing lists that are neither held nor
        granted (announced as if just moved)."""
        lane.recount = False
        types = list(lane.types)
        async with self._commands.pipeline(transaction=False) as pipe:
            for type_name in types:
                pipe.llen(self._keys.processing(type_name))
            lengths = await pipe.execute()
        for type_name, length in zip(types, lengths, strict=True):
            known = self._held[type_name] + self._granted[type_name] + self._pending[type_name]
            if self._pending[type_name] > 0:
                lane.recount = True  # again after the next move: those may not be there
            for _ in range(max(int(length) - known, 0)):
                await self._arrived(type_name)

    async def _return_surplus(self) -> None:
        """Give back held tokens no listener of their type has a free slot for."""
        for type_name, surplus in self._listeners.surplus(self._outstanding()).items():
            count = min(self._held[type_name], surplus)
            if count > 0:
                self._held[type_name] -= count
                with self._pending_while({type_name: count}):
                    await self._give_back_tokens(type_name, count)

    async def _give_back_tokens(self, type_name: str, count: int) -> None:
        """Move ``count`` tokens (0: all, and leave the type's consumers) of our processing
        list of ``type_name`` back to the head of its token list."""
        keys = self._keys.give_back_keys(type_name)
        await self._give_back(keys=keys, args=[count, self.consumer, HINT_TTL_SECONDS])

    # -- helpers ---------------------------------------------------------------------

    @contextmanager
    def _pending_while(self, counts: Mapping[str, int]) -> Iterator[None]:
        """Count ``counts`` tokens as pending while the command sending them is awaited
        (a recount does not adopt a token whose removal is on its way)."""
        self._pending.update(counts)
        try:
            yield
        finally:
            self._pending.subtract(counts)

    def _outstanding(self) -> Counter[str]:
        """Held plus granted tokens, by type."""
        return self._held + self._granted

    def _wanted(self, types: Sequence[str]) -> list[str]:
        """Of ``types``, those a listener has a free slot for one more token of."""
        return self._listeners.wanted(self._outstanding(), types)

    def _look_again(self) -> None:
        """Listeners or tokens changed: the loops waiting look again, and a lane blocked
        on other types than those now wanted ends its blocking move at once."""
        self._changed.set()
        moving = [lane for lane in self._lanes.values() if lane.moving]
        wanted = set(self._wanted([name for lane in moving for name in lane.types]))
        for lane in moving:
            if lane.moving != wanted.intersection(lane.types):
                lane.nudge()
