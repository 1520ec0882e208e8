"""``@pytest.mark.alone``: a test that no other test of the run may run beside.

Under pytest-xdist (``./dev test``) every worker takes a lock of the run before each
test: a shared one for an ordinary test, an exclusive one for an ``alone`` test, so an
``alone`` test starts once the tests running on the other workers have ended, and none
starts until it is over. A gate in front keeps the other workers from taking shared
turns forever while one waits to be alone. ``tests/conftest.py`` puts every ``alone``
test in one xdist group, so they run back to back on one worker, which keeps the lock
from one to the next (one wait for the others, not one per test).

For the few tests whose latency bound is below what a machine busy with the rest of
the suite gives (a wakeup within 100 ms); serially (no xdist) the lock is not taken.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

import pytest

ALONE_GROUP = "alone"
"""The xdist group of every ``alone`` test."""


def is_alone(item: pytest.Item | None) -> bool:
    return item is not None and item.get_closest_marker("alone") is not None


class RunLock:
    """The lock of one xdist run: two files in the run's base temporary directory,
    which every worker's own (``--basetemp``, set by xdist) lies in."""

    def __init__(self, directory: Path) -> None:
        self._gate: IO[bytes] = (directory / "alone.gate").open("ab")
        self._lock: IO[bytes] = (directory / "alone.lock").open("ab")
        self._held: str | None = None

    @classmethod
    def of_this_run(cls, config: pytest.Config) -> RunLock | None:
        """The run's lock on an xdist worker; None when tests run serially."""
        basetemp = config.option.basetemp
        if "PYTEST_XDIST_WORKER" not in os.environ or not basetemp:
            return None
        return cls(Path(basetemp).resolve().parent)

    def before(self, alone: bool) -> None:
        """Wait for this test's turn: alone, or beside other ordinary tests."""
        if alone and self._held == "alone":
            return  # the previous test was alone too: still holding it
        self.after(keep=False)
        if alone:
            fcntl.flock(self._gate, fcntl.LOCK_EX)  # no new shared turn from now on
            fcntl.flock(self._lock, fcntl.LOCK_EX)  # once the running tests have ended
            self._held = "alone"
        else:
            fcntl.flock(self._gate, fcntl.LOCK_SH)  # not while one waits to be alone
            fcntl.flock(self._lock, fcntl.LOCK_SH)
            fcntl.flock(self._gate, fcntl.LOCK_UN)
            self._held = "shared"

    def after(self, keep: bool) -> None:
        """Release the turn, unless ``keep`` (the next test on this worker is alone
        too and this one holds it)."""
        if self._held is None or (keep and self._held == "alone"):
            return
        fcntl.flock(self._lock, fcntl.LOCK_UN)
        if self._held == "alone":
            fcntl.flock(self._gate, fcntl.LOCK_UN)
        self._held = None

    def close(self) -> None:
        self.after(keep=False)
        self._gate.close()
        self._lock.close()
