"""Identifiers for chains and jobs."""

from __future__ import annotations

import os
import threading
import time

_lock = threading.Lock()
_last_millis = 0
_counter = 0
_COUNTER_BITS = 12
_ID_RANDOM_BYTES = 9
_BUFFERED_IDS = 256
# Random bytes for the next ids, drawn from os.urandom a few kilobytes at a time: one
# system call per id was a tenth of the CPU of starting chains in batches.
_random = b""
_random_used = 0


def _forget_random() -> None:
    # A forked child must not reuse the parent's bytes: its ids would repeat the parent's.
    global _random, _random_used
    _random, _random_used = b"", 0


os.register_at_fork(after_in_child=_forget_random)


def new_id() -> str:
    """A new 32-hex-digit id, unique and time-ordered (UUIDv7 layout).

    The first 48 bits are the Unix time in milliseconds, so ids sort by creation
    time (listing newest first is ``ORDER BY id DESC``, and B-tree inserts stay
    local). The next 12 bits count up within a millisecond, so ids made by one
    process are strictly increasing; the last 62 bits are random.
    """
    global _last_millis, _counter, _random, _random_used
    with _lock:
        # 9 random bytes: the first the counter's starting point on the first id of a
        # millisecond, the other 8 the random bits.
        if _random_used >= len(_random):
            _random, _random_used = os.urandom(_ID_RANDOM_BYTES * _BUFFERED_IDS), 0
        start = _random_used
        _random_used += _ID_RANDOM_BYTES
        rand = int.from_bytes(_random[start:_random_used], "big")
        millis = time.time_ns() // 1_000_000
        if millis > _last_millis:
            _last_millis = millis
            # Start low in the counter space so a burst rarely overflows it.
            _counter = rand >> 64
        else:
            _counter += 1
            if _counter >= 1 << _COUNTER_BITS:
                _last_millis += 1
                _counter = 0
        millis, counter = _last_millis, _counter
    rand_b = rand & ((1 << 62) - 1)
    value = (millis & ((1 << 48) - 1)) << 80 | 0x7 << 76 | counter << 64 | 0b10 << 62 | rand_b
    return f"{value:032x}"
