"""The notify-adapter contract as runnable tests: subclass, provide ``adapter``, run pytest.

Example (needs pytest and pytest-asyncio)::

    import pytest
    from queuert_notify import InProcessNotifyAdapter
    from queuert_notify.testing import NotifyAdapterConformance

    class TestMyAdapter(NotifyAdapterConformance):
        @pytest.fixture
        async def adapter(self):
            async with InProcessNotifyAdapter() as adapter:
                yield adapter

Fixtures a subclass provides:

- ``adapter`` (required): a connected adapter; the suite may close it, so its
  teardown must tolerate a second ``close()`` (the contract says it does).
- ``peer_adapter`` (optional): a second connected adapter on the same
  transport (same server and prefix). Every delivery test listens on
  ``adapter`` and publishes from ``peer_adapter``, and budgets provided on
  one are consumed on the other, so cross-process behaviour is exercised.
  Defaults to ``adapter`` itself.
- ``poison_wake_budget`` (optional): see :meth:`NotifyAdapterConformance.poison_wake_budget`.
- ``force_reconnect`` (optional): see :meth:`NotifyAdapterConformance.force_reconnect`.

Class attributes describe what the adapter promises:

- ``delivers``: False for adapters that never call listeners (noop).
- ``supports_hints``: False for adapters whose ``provide_wake_hint`` is a
  no-op and whose ``consume_wake_hint`` always returns True.
- ``wake_per_unit``: True for adapters whose wakes are the budget itself (one
  unit, one call of one listening adapter: ``RedisNotifyAdapter(wake="lists")``),
  so ``notify_jobs_scheduled({t: 2})`` calls a listener of ``t`` twice.
- ``delivery_timeout``: how long a delivery may take before the test fails.
- ``quiet_period``: how long to wait before concluding "nothing arrives"
  where no later message can prove it.

Negative checks ("this listener is not called") are proven with a sentinel
published afterwards on the same channel, so they cost no sleeps and need
only per-channel ordering from one publisher.

The cases live in ``queuert_notify/testing/notify_cases/``, one module per area
(listening, unsubscribing, hints, reconnect, closing).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import ClassVar

import pytest
import pytest_asyncio

from queuert_notify.notify.protocol import NotifyAdapter
from queuert_notify.testing.notify_cases.closing import ClosingCases
from queuert_notify.testing.notify_cases.hints import HintsCases
from queuert_notify.testing.notify_cases.listening import ListeningCases
from queuert_notify.testing.notify_cases.reconnect import ReconnectCases
from queuert_notify.testing.notify_cases.support import ForceReconnect, PoisonBudget, Recorder
from queuert_notify.testing.notify_cases.unsubscribing import UnsubscribingCases

__all__ = ["ForceReconnect", "NotifyAdapterConformance", "PoisonBudget", "Recorder"]


class NotifyAdapterConformance(
    ListeningCases,
    UnsubscribingCases,
    HintsCases,
    ReconnectCases,
    ClosingCases,
):
    """Base class of the notify-adapter conformance tests (not collected by itself); see
    the module docstring. Each base class holds the cases of one area."""

    pytestmark: ClassVar[list[pytest.MarkDecorator]] = [pytest.mark.asyncio]

    @pytest_asyncio.fixture
    async def adapter(self) -> AsyncIterator[NotifyAdapter]:
        """Override: yield a connected adapter."""
        pytest.fail("subclass NotifyAdapterConformance and provide an `adapter` fixture")
        yield  # pragma: no cover

    @pytest_asyncio.fixture
    async def peer_adapter(self, adapter: NotifyAdapter) -> AsyncIterator[NotifyAdapter]:
        """Override: yield a second connected adapter on the same transport."""
        yield adapter

    @pytest_asyncio.fixture
    async def poison_wake_budget(self) -> AsyncIterator[PoisonBudget]:
        """Override (adapters whose budgets are stored where others can write them):
        yield ``poison(type_name, kind)`` that stores, as the budget of ``type_name``,
        what a stranger or a bug might: ``kind`` "text" (a string that is no integer)
        or "list" (a value of another type)."""
        pytest.skip("this adapter does not say how its stored budgets could be poisoned")
        yield  # pragma: no cover

    @pytest_asyncio.fixture
    async def force_reconnect(self) -> AsyncIterator[ForceReconnect]:
        """Override (adapters that hold a connection to a server): yield an async
        ``force_reconnect()`` that makes ``adapter`` lose its subscription connection
        while the server stays up (Redis: ``CLIENT KILL``; Postgres:
        ``pg_terminate_backend``), so that the adapter reconnects by itself."""
        pytest.skip("this adapter has no connection to lose, or says not how to drop it")
        yield  # pragma: no cover
