"""The listeners of one wake-lists consumer: the types each listens to, the free slots
each last reported, and the tokens each was told of since (see
:class:`~queuert_notify.notify.redis.lists.RedisWakeLists`)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Sequence

from queuert_notify.notify.protocol import TypeNameCallback


class WakeListeners:
    """Invariants: a listener is known from its first registration to its last
    unregistration, however many overlap; ``told`` counts, per listener, the tokens
    announced to it since its last report, and only of types it listens to."""

    def __init__(self) -> None:
        self._registrations: Counter[TypeNameCallback] = Counter()
        self._types_of: dict[TypeNameCallback, Counter[str]] = {}
        self._free: dict[TypeNameCallback, int] = {}
        self._told: dict[TypeNameCallback, Counter[str]] = {}

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

    def demand(self) -> float:
        """How many tokens listeners want at once (unbounded until every one reported)."""
        if not self._registrations:
            return 0
        if any(callback not in self._free for callback in self._registrations):
            return math.inf
        return sum(self._free.values())

    def tell(self, type_name: str) -> None:
        """A token of ``type_name`` is being announced to every listener of the type."""
        for callback, types in self._types_of.items():
            if types[type_name] > 0:
                self._told.setdefault(callback, Counter())[type_name] += 1

    def report(
        self, callback: TypeNameCallback, free_slots: int, held: Counter[str]
    ) -> Iterator[str]:
        """``callback``'s listener has ``free_slots`` free after a claim pass: the type of
        every ``held`` token to announce to it again, up to that many. Those it was told
        of since its previous report are left out (a token heard with a slot free is
        asked for by the next pass; one a whole pass left held was passed over, heard
        while every slot was busy). What is announced again counts as told, so a
        listener that does not ask (its budget calls failing, every hint counted as
        granted) is not woken pass after pass."""
        self._free[callback] = max(free_slots, 0)
        told = self._told.pop(callback, Counter())
        again: Counter[str] = Counter()
        left = free_slots
        for type_name, listening in self._types_of[callback].items():
            count = max(min(held[type_name] - told[type_name], left), 0) if listening > 0 else 0
            again[type_name] = count
            left -= count
        if +again:
            self._told[callback] = +again
        return again.elements()
