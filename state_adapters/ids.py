"""Identifiers for chains and jobs."""

from __future__ import annotations

import os
import threading
import time

_lock = threading.Lock()
_last_millis = 0
_counter = 0
_COUNTER_BITS = 12


def new_id() -> str:
    """A new 32-hex-digit id, unique and time-ordered (UUIDv7 layout).

    The first 48 bits are the Unix time in milliseconds, so ids sort by creation
    time (listing newest first is ``ORDER BY id DESC``, and B-tree inserts stay
    local). The next 12 bits count up within a millisecond, so ids made by one
    process are strictly increasing; the last 62 bits are random.
    """
    global _last_millis, _counter
    # One system call per id: 9 random bytes, the first the counter's starting
    # point on the first id of a millisecond, the other 8 the random bits.
    rand = int.from_bytes(os.urandom(9), "big")
    with _lock:
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
