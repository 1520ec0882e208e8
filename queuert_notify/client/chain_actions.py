"""Acting on one chain from a :class:`~queuert_notify.Client`: trigger, cancel, retry,
complete and delete. Each call joins the caller's transaction (``session=``) or runs in
one of its own that is repeated after a lost connection, so each says why it is safe to
repeat."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import TYPE_CHECKING, Any

from queuert_notify.client.operations import ClientCalls
from queuert_notify.errors import ChainNotFoundError
from state_adapters.model import FINAL_STATUSES, ChainRecord
from state_adapters.notifications import NotificationBuffer
from state_adapters.storable import check_json

if TYPE_CHECKING:
    from state_adapters.protocol import CallerSession


class ChainActions:
    """The chain actions of :class:`~queuert_notify.Client`."""

    async def trigger_chain(
        self: ClientCalls, chain_id: str, *, session: CallerSession = None
    ) -> ChainRecord:
        """Make the chain's pending job due now (skipping its delay or retry backoff).

        Safe to repeat: a job still pending is made due now again (and announced
        again), one claimed meanwhile is left alone."""
        return await self._write(
            session,
            lambda notes: self.state.trigger_chain(chain_id, notes=notes, session=session),
        )

    async def cancel_chain(
        self: ClientCalls, chain_id: str, *, session: CallerSession = None
    ) -> ChainRecord:
        """Cancel the chain's unfinished job; a worker running it loses ownership and
        its handler is cancelled.

        Safe to repeat: a final chain is returned as it is, so a repeat after a lost
        COMMIT that succeeded returns the cancelled chain (and announces its end again,
        since the lost attempt's notifications were lost with it)."""
        return await _finish_chain(
            self,
            session,
            lambda notes: self.state.cancel_chain(chain_id, notes=notes, session=session),
        )

    async def retry_chain(
        self: ClientCalls, chain_id: str, *, session: CallerSession = None
    ) -> ChainRecord:
        """Run a failed or cancelled chain again from its last job, with its attempts
        starting over; workers are woken for it. Raises ``ChainNotFoundError``, or
        ``InvalidInputError`` for a chain that is not failed or cancelled.

        Jobs of other chains that waited on this one were released when it failed;
        they are not held back again.

        Safe to repeat: a repeat after a lost COMMIT that finds the chain running
        again returns it as it is."""

        async def retry_again(notes: NotificationBuffer) -> ChainRecord:
            chain = await self.state.get_chain(chain_id)
            if chain.status in FINAL_STATUSES:
                return await self.state.retry_chain(chain_id, notes=notes)
            notes.job_scheduled(chain.last_job.type_name)
            return chain

        return await self._write(
            session,
            lambda notes: self.state.retry_chain(chain_id, notes=notes, session=session),
            again=retry_again,
        )

    async def complete_chain(
        self: ClientCalls, chain_id: str, output: Any = None, *, session: CallerSession = None
    ) -> ChainRecord:
        """Complete the chain from application code, without a worker (e.g. an
        approval step); a worker running its job loses ownership.

        Safe to repeat, like :meth:`cancel_chain`: the repeat finds the chain final and
        returns it with the output the lost attempt stored."""
        check_json(output, "output")
        return await _finish_chain(
            self,
            session,
            lambda notes: self.state.complete_chain(chain_id, output, notes=notes, session=session),
        )

    async def delete_chain(
        self: ClientCalls, chain_id: str, *, session: CallerSession = None
    ) -> None:
        """Delete the chain and its jobs; raises ``ChainInUseError`` while other jobs
        are blocked on it.

        Safe to repeat: a repeat after a lost connection that finds the chain gone
        returns, since the lost attempt (or someone else) deleted it."""

        async def delete_again() -> None:
            with suppress(ChainNotFoundError):
                await self.state.delete_chain(chain_id)

        await self._retried(
            session, lambda: self.state.delete_chain(chain_id, session=session), again=delete_again
        )


async def _finish_chain(
    client: ClientCalls,
    session: CallerSession,
    finish: Callable[[NotificationBuffer], Awaitable[ChainRecord]],
) -> ChainRecord:
    """``finish`` (cancel or complete) through :meth:`Client._write`; a repeat that finds the
    chain final owes the announcements the lost attempt may have made."""

    async def finish_again(notes: NotificationBuffer) -> ChainRecord:
        chain = await finish(notes)
        if chain.status in FINAL_STATUSES:
            notes.chain_completed(chain.id)
            notes.ownership_lost(chain.last_job.id)
        return chain

    return await client._write(session, finish, again=finish_again)
