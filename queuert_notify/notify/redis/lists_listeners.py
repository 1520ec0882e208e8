"""The listeners of one wake-lists consumer: the types each listens to, the free slots
each last reported, and the tokens each was told of since (see
:class:`~queuert_notify.notify.redis.lists.RedisWakeLists`)."""

from __future__ import annotations

import asyncio
import math
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import pairwise

from queuert_notify.notify.protocol import TypeNameCallback

ANNOUNCE_AGAIN_AFTER = 1.0
"""Seconds after a report that a listener is told again of tokens still held for it
(those it heard of before: a listener may count a token as granted without taking it,
while its wake budget calls fail)."""


class WakeListeners:
    """Invariants: a listener is known from its first registration to its last
    unregistration, however many overlap; ``told`` counts, per listener, the tokens
    announced to it since its last report (or the look again after it), and only of
    types it listens to; a held token is announced again only to a listener that was
    told of it before that, at most once per report and once a while after it."""

    def __init__(
        self, held: Counter[str], announce: Callable[[TypeNameCallback, str], None]
    ) -> None:
        self._held = held
        """The consumer's held tokens, by type (its own counter, read here)."""
        self._announce = announce
        self._registrations: Counter[TypeNameCallback] = Counter()
        self._types_of: dict[TypeNameCallback, Counter[str]] = {}
        self._free: dict[TypeNameCallback, int] = {}
        self._told: dict[TypeNameCallback, Counter[str]] = {}
        self._later: dict[TypeNameCallback, asyncio.TimerHandle] = {}

    def __bool__(self) -> bool:
        return bool(self._registrations)

    def __contains__(self, callback: TypeNameCallback) -> bool:
        return callback in self._registrations

    def add(self, callback: TypeNameCallback, names: Sequence[str]) -> None:
        self._registrations[callback] += 1
        self._types_of.setdefault(callback, Counter()).update(dict.fromkeys(names, 1))

    def remove(self, callback: TypeNameCallback, names: Sequence[str]) -> None:
        """Undo one :meth:`add` of ``callback`` with these ``names``."""
        self._registrations[callback] -= 1
        self._types_of[callback].subtract(dict.fromkeys(names, 1))
        if self._registrations[callback] <= 0:
            del self._registrations[callback]
            self._types_of.pop(callback, None)
            self._free.pop(callback, None)
            self._told.pop(callback, None)
            self._forget_later(callback)

    def stop(self) -> None:
        """Look again at no listener (the consumer is closing)."""
        for callback in list(self._later):
            self._forget_later(callback)

    def wanted(self, outstanding: Mapping[str, int], types: Iterable[str]) -> list[str]:
        """Of ``types``, those of which a listener has a free slot for one more token: a
        slot the ``outstanding`` tokens (held or granted, by type) do not fill, however
        they are shared among the listeners of their types."""
        slots = self._slots(outstanding)
        return [name for name in types if slots.path(name) is not None]

    def surplus(self, outstanding: Mapping[str, int]) -> Counter[str]:
        """The ``outstanding`` tokens, by type, for which no listener has a free slot."""
        return self._slots(outstanding).unserved

    def _slots(self, outstanding: Mapping[str, int]) -> _Slots:
        free = {callback: self._free.get(callback, math.inf) for callback in self._registrations}
        return _Slots(free, self._types_of, outstanding)

    def tell(self, type_name: str) -> None:
        """A token of ``type_name`` is being announced to every listener of the type."""
        for callback, types in self._types_of.items():
            if types[type_name] > 0:
                self._told.setdefault(callback, Counter())[type_name] += 1

    def report(self, callback: TypeNameCallback, free_slots: int) -> None:
        """``callback``'s listener has ``free_slots`` free after a claim pass: announce
        to it again, up to that many, the held tokens of its types it was told of before
        its previous report (a token heard with a slot free is asked for by the next
        pass; one a whole pass left held was passed over, heard while every slot was
        busy); and look again :data:`ANNOUNCE_AGAIN_AFTER` seconds later, unless it
        reports first."""
        self._free[callback] = max(free_slots, 0)
        self._forget_later(callback)
        self._announce_again(callback)
        if any(self._held[name] for name, n in self._types_of[callback].items() if n > 0):
            self._later[callback] = asyncio.get_running_loop().call_later(
                ANNOUNCE_AGAIN_AFTER, self._look_again, callback
            )

    def _look_again(self, callback: TypeNameCallback) -> None:
        self._later.pop(callback, None)
        if callback in self._registrations:
            self._announce_again(callback)

    def _announce_again(self, callback: TypeNameCallback) -> None:
        """Announce the held tokens ``callback`` was not told of since the last look, up
        to its free slots; what is announced counts as told (so a listener that does not
        ask is not woken pass after pass)."""
        told = self._told.pop(callback, Counter())
        again: Counter[str] = Counter()
        left = self._free[callback]
        for name, listening in self._types_of[callback].items():
            count = max(min(self._held[name] - told[name], left), 0) if listening > 0 else 0
            for _ in range(count):
                self._announce(callback, name)
            again[name] = count
            left -= count
        if +again:
            self._told[callback] = +again

    def _forget_later(self, callback: TypeNameCallback) -> None:
        later = self._later.pop(callback, None)
        if later is not None:
            later.cancel()


class _Slots:
    """The outstanding tokens shared among the free slots of the listeners of their types,
    as many as can be (a maximum matching: a token given to one listener is moved to
    another when that makes room for one more); ``unserved`` counts the rest by type.
    A listener that has not reported has unbounded free slots."""

    def __init__(
        self,
        free: dict[TypeNameCallback, float],
        types_of: Mapping[TypeNameCallback, Counter[str]],
        outstanding: Mapping[str, int],
    ) -> None:
        self._left = free
        self._given: dict[TypeNameCallback, Counter[str]] = {c: Counter() for c in free}
        self._listeners: dict[str, list[TypeNameCallback]] = {}
        for callback in free:
            for name, listening in types_of[callback].items():
                if listening > 0:
                    self._listeners.setdefault(name, []).append(callback)
        self.unserved: Counter[str] = Counter()
        for name, count in outstanding.items():
            while count > 0 and (path := self.path(name)) is not None:
                count -= self._give(path, count)
            if count > 0:
                self.unserved[name] = count

    def path(self, name: str) -> list[tuple[str, TypeNameCallback]] | None:
        """How one more token of ``name`` gets a slot: ``(type, listener)`` steps, the
        first giving it to a listener of ``name``, each next one moving a token of its
        type from the previous step's listener to its own, the last listener's slot free;
        None when there is no way."""
        came_from: dict[TypeNameCallback, tuple[str, TypeNameCallback | None]] = {}
        queue: deque[TypeNameCallback] = deque()
        steps: Iterable[tuple[str, TypeNameCallback | None]] = [(name, None)]
        while True:
            for type_name, previous in steps:
                for callback in self._listeners.get(type_name, ()):
                    if callback not in came_from:
                        came_from[callback] = (type_name, previous)
                        queue.append(callback)
            if not queue:
                return None
            callback = queue.popleft()
            if self._left[callback] > 0:
                break
            steps = [(given, callback) for given, n in self._given[callback].items() if n > 0]
        path: list[tuple[str, TypeNameCallback]] = []
        at: TypeNameCallback | None = callback
        while at is not None:
            type_name, previous = came_from[at]
            path.append((type_name, at))
            at = previous
        return path[::-1]

    def _give(self, path: list[tuple[str, TypeNameCallback]], most: int) -> int:
        """Give up to ``most`` tokens along ``path``; how many."""
        moved = [self._given[frm][name] for (_, frm), (name, _) in pairwise(path)]
        count = int(min(most, self._left[path[-1][1]], *moved))
        self._left[path[-1][1]] -= count
        for (_, frm), (name, _) in pairwise(path):
            self._given[frm][name] -= count
        for name, callback in path:
            self._given[callback][name] += count
        return count
