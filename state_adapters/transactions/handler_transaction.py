"""The transaction an atomic-mode handler writes in (``ctx.session``) and its
completion commits in."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from sqlalchemy.ext.asyncio import AsyncSession

from state_adapters.errors import JobOwnershipLostError
from state_adapters.notifications import Publisher
from state_adapters.transactions.after_commit import buffer_for_transaction

if TYPE_CHECKING:
    from state_adapters.model import Completion
    from state_adapters.protocol import StateAdapter


class HandlerTransaction:
    """One job run's session, opened on first use of :attr:`session`: a handler that
    never touches it costs no transaction.

    Invariant: the handler's rows commit with exactly its job's completion (and any
    continuation), or not at all — a refused completion (the lease was lost) or a
    failed attempt rolls them back.
    """

    def __init__(self, sessions: Callable[[], AsyncSession], committed: Callable[[], None]) -> None:
        """``committed`` is called once a completion has committed (a limited type's
        slot is free only then: a claim that ran before saw it taken)."""
        self._sessions = sessions
        self._committed = committed
        self._session: AsyncSession | None = None

    @property
    def session(self) -> AsyncSession:
        if self._session is None:
            self._session = self._sessions()
        return self._session

    @property
    def opened(self) -> bool:
        """Whether the handler used :attr:`session` (only then is there one to close)."""
        return self._session is not None

    def holds_work(self) -> bool:
        """Whether the handler began a transaction in the session or left objects in
        it to flush: then its completion must commit in that transaction, alone."""
        session = self._session
        if session is None:
            return False
        return session.in_transaction() or bool(session.new or session.dirty or session.deleted)

    async def complete(
        self, state: StateAdapter, completion: Completion, notify: Publisher
    ) -> JobOwnershipLostError | None:
        """Write ``completion`` in the handler's transaction and commit both (the
        wakeups go out after the COMMIT); a stale lease rolls both back instead."""
        session = self.session
        notes = buffer_for_transaction(session, notify)
        (outcome,) = await state.complete_jobs([completion], notes=notes, session=session)
        if isinstance(outcome, JobOwnershipLostError):
            # The handler's writes must not outlive the lease they were made under.
            await session.rollback()
            return outcome
        await session.commit()
        self._committed()
        return None

    async def rollback(self) -> None:
        if self._session is not None:
            await self._session.rollback()

    async def close(self) -> None:
        if self._session is not None:
            # Shielded so a cancelled run still returns its connection to the pool.
            await asyncio.shield(self._session.close())
