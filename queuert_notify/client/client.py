"""Start, await and inspect chains from application code.

The :class:`Client` ties one state adapter (the truth) to one notify adapter (the
hints). Every write either joins the caller's SQLAlchemy transaction (``session=``),
in which case its notifications are published only after that transaction commits,
or runs in a transaction of its own and publishes right after its commit.
"""

from __future__ import annotations

import asyncio
import logging
import warnings
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import suppress
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from queuert_notify.client.chain_actions import ChainActions
from queuert_notify.client.chain_spec import ChainSpec
from queuert_notify.client.operations import QueueOperations
from queuert_notify.errors import (
    ConfigurationError,
    DatabaseUnavailableError,
    InvalidInputError,
    NotifyAdapterClosedError,
    WaitChainTimeoutError,
)
from queuert_notify.notify.noop import NoopNotifyAdapter
from queuert_notify.notify.protocol import NotifyAdapter
from queuert_notify.observe import instrumentation
from state_adapters.backoff import DEFAULT_MAX_ATTEMPTS
from state_adapters.errors import cannot_connect, cannot_connect_reason
from state_adapters.ids import new_id
from state_adapters.model import (
    FINAL_STATUSES,
    ChainRecord,
    DedupScope,
    JobLogLine,
    JobRecord,
    JobStatus,
    Page,
    StartedChain,
)
from state_adapters.notifications import NotificationBuffer, send_later, wait_for_notifications
from state_adapters.protocol import StateAdapter
from state_adapters.transactions.after_commit import buffer_for_transaction
from state_adapters.transactions.connection_loss import is_connection_loss, retry_on_connection_loss
from state_adapters.transactions.lost_commit import start_again

if TYPE_CHECKING:
    from state_adapters.protocol import CallerSession

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_AWAIT_POLL_INTERVAL = 5.0
"""``await_chain`` re-reads the database at least this often (seconds), so a lost
chain-completed notification costs at most this much latency."""


DEFAULT_DATABASE_TIMEOUT = 5.0
"""Seconds a client call keeps trying a database that does not answer (a restart or a
quick failover fits) before it raises ``DatabaseUnavailableError``: a web request fails
in seconds instead of hanging. ``Client(database_timeout=...)`` changes it."""


CLOSE_FLUSH_LIMIT = 5.0
"""Seconds ``Client.close()`` waits for owed notifications to be sent."""
CONNECT_LIMIT = 5.0
"""Seconds ``Client.connect()`` waits for the notify adapter to connect."""


class Client(ChainActions, QueueOperations):
    """Application-side access to the queue.

    ``async with Client(state=..., notify=...)`` connects the notify adapter on enter
    and closes it on exit (the state adapter and its engine stay the caller's). Workers
    built on this client use the same adapters, so keep the client open while they run.

    When the notify server does not answer at ``connect()``, the client works without
    notifications (they are hints: workers poll) and logs a warning; each later call
    tries the server again, and a worker keeps retrying its subscriptions until they
    succeed. With ``require_notify=True``, ``connect()`` (and so ``Worker.run()``)
    raises the adapter's ``ConfigurationError`` naming the address instead.

    A call that runs in a transaction of its own (no ``session=``) is repeated, with
    backoff, when its database connection is lost under it or cannot be made, for at
    most ``database_timeout`` seconds (default :data:`DEFAULT_DATABASE_TIMEOUT`); then
    it raises ``DatabaseUnavailableError``, one line naming the database; in the caller's session it
    is not (that transaction died with the connection: the caller retries it whole).
    A connection lost while COMMIT was in flight leaves unknown whether the change was
    made, so every write is safe to repeat after a COMMIT that succeeded: each
    method's docstring says why.
    """

    def __init__(
        self,
        *,
        state: StateAdapter,
        notify: NotifyAdapter,
        require_notify: bool = False,
        database_timeout: float = DEFAULT_DATABASE_TIMEOUT,
    ) -> None:
        if not database_timeout > 0:
            raise ConfigurationError(f"database_timeout must be > 0, got {database_timeout!r}")
        self.state = state
        self.notify = notify
        self.require_notify = require_notify
        self.database_timeout = database_timeout

    async def __aenter__(self) -> Client:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def connect(self) -> None:
        """Connect the notify adapter (idempotent), waiting at most
        :data:`CONNECT_LIMIT` seconds. An adapter that cannot connect (a server down,
        any other error, no answer in time) is logged and the client works without
        notifications; with ``require_notify=True`` it raises ``ConfigurationError``. A
        closed adapter always raises."""
        try:
            async with asyncio.timeout(CONNECT_LIMIT):
                await self.notify.connect()
        except (NotifyAdapterClosedError, ConfigurationError) as exc:
            if isinstance(exc, NotifyAdapterClosedError) or self.require_notify:
                raise
            self._log_unreachable(exc)
        except Exception as exc:
            if self.require_notify:
                raise ConfigurationError(
                    f"the notify adapter did not connect: {exc!r} (require_notify=True)"
                ) from exc
            self._log_unreachable(exc)

    @staticmethod
    def _log_unreachable(exc: Exception) -> None:
        logger.warning(
            "notify adapter unreachable; working without notifications (workers poll) "
            "until it answers: %s",
            exc if str(exc) else repr(exc),
        )

    async def close(self) -> None:
        """Publish what committed transactions still owe (waiting at most
        :data:`CLOSE_FLUSH_LIMIT` seconds for a notify server that does not answer),
        then close the notify adapter (idempotent). The state adapter is left open, with
        no connection of its engine's pool kept for the next start."""
        async with self.state.holding_connections():
            pass  # leaving the last hold gives back what the state adapter kept
        if not await wait_for_notifications(timeout=CLOSE_FLUSH_LIMIT):
            logger.warning(
                "the notify adapter did not take every notification within %.0fs; closing "
                "anyway (workers find the jobs on their next poll)",
                CLOSE_FLUSH_LIMIT,
            )
        await self.notify.close()

    async def migrate(self, *, adopt: bool = False) -> None:
        """Create or upgrade the queue's tables (the state adapter's ``migrate``); a
        database that does not answer is one ``ConfigurationError`` line naming it,
        as from the CLI and ``SyncClient.migrate()``."""
        await self.state.migrate(adopt=adopt)

    # -- starting chains -------------------------------------------------------------

    async def start_chain(
        self,
        type_name: str,
        input: Any = None,
        *,
        session: CallerSession = None,
        dedup_key: str | None = None,
        dedup_scope: DedupScope = "incomplete",
        dedup_window: float | None = None,
        run_at: datetime | None = None,
        delay: float | None = None,
        priority: int = 0,
        blockers: Sequence[str] = (),
        max_attempts: int | None = DEFAULT_MAX_ATTEMPTS,
        concurrency_key: str | None = None,
    ) -> StartedChain:
        """Start a chain whose first job is ``type_name`` with ``input``.

        With ``session`` the chain is written in the caller's transaction, which this
        call never commits; the wakeup is published after that transaction commits and
        dropped if it rolls back. ``dedup_key`` returns an existing chain (with
        ``deduplicated=True``) instead of creating one; ``run_at`` (timezone-aware) or
        ``delay`` (seconds) postpone it; ``blockers`` are chain ids that must complete
        first; ``max_attempts`` bounds the runs of every job of the chain (its
        continuations inherit it; ``None`` retries forever); ``concurrency_key`` is
        what a type's ``key_concurrency`` limit counts by (e.g. ``"customer-42"``; its
        continuations inherit it). Invalid arguments raise ``InvalidInputError``
        before anything is written.
        """
        spec = ChainSpec(
            type_name=type_name,
            input=input,
            dedup_key=dedup_key,
            dedup_scope=dedup_scope,
            dedup_window=dedup_window,
            run_at=run_at,
            delay=delay,
            priority=priority,
            blockers=blockers,
            max_attempts=max_attempts,
            concurrency_key=concurrency_key,
        )
        (started,) = await self.start_chains([spec], session=session)
        return started

    async def start_chains(
        self, specs: Sequence[ChainSpec], *, session: CallerSession = None
    ) -> list[StartedChain]:
        """Start several chains in one transaction (all or none), in order.

        Every spec is validated before anything is written; one notify round trip
        covers the whole batch. Chain ids are made here, before the first attempt, so a
        start repeated after a lost connection first reads whether the lost attempt
        committed and then returns its chains instead of starting them twice (see
        :func:`state_adapters.transactions.lost_commit.start_again`); on the happy path that costs
        nothing.
        """
        if isinstance(specs, ChainSpec):
            raise InvalidInputError("start_chains takes a list of ChainSpec; use start_chain")
        specs = list(specs)
        for spec in specs:
            if not isinstance(spec, ChainSpec):
                raise InvalidInputError(f"start_chains takes ChainSpec items, got {spec!r}")
        if not specs:
            return []
        with instrumentation.active().starting_chains(specs) as observed:
            chains = [
                spec.to_new_chain(new_id(), trace_context=observed.trace_context) for spec in specs
            ]
            started = await self._write(
                session,
                lambda notes: self.state.start_chains(chains, notes=notes, session=session),
                again=lambda notes: start_again(self.state, chains, notes),
            )
            observed.started(started)
        return started

    # -- waiting ---------------------------------------------------------------------

    async def await_chain(
        self,
        chain_id: str,
        timeout: float | None = None,  # noqa: ASYNC109  # public API fixed by DESIGN
        *,
        poll_interval: float = DEFAULT_AWAIT_POLL_INTERVAL,
    ) -> ChainRecord:
        """Wait until the chain is completed, failed or cancelled, and return it.

        Woken by the chain-completed notification; the database is the truth and is
        re-read at least every ``poll_interval`` seconds, so a lost notification costs
        latency, never the result. Raises ``WaitChainTimeoutError`` after ``timeout``
        seconds (``None``: wait forever) and ``ChainNotFoundError`` for an unknown id.
        """
        if poll_interval <= 0:
            raise InvalidInputError(f"poll_interval must be > 0, got {poll_interval!r}")
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        signal = asyncio.Event()
        # Subscribe before the first read so a completion that lands between the
        # read and the wait still wakes us.
        unsubscribe = await self._listen_chain_completed(chain_id, signal.set)
        try:
            while True:
                # Cleared before each read: a signal arriving during the read re-sets it.
                signal.clear()
                chain = await self.get_chain(chain_id)
                if chain.status in FINAL_STATUSES:
                    return chain
                wait = poll_interval
                if deadline is not None:
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        raise WaitChainTimeoutError(
                            f"chain {chain_id} is still {chain.status} after {timeout}s; "
                            "is a worker with a handler for its job type running?"
                        )
                    wait = min(wait, remaining)
                with suppress(TimeoutError):
                    await asyncio.wait_for(signal.wait(), wait)
        finally:
            if unsubscribe is not None:
                try:
                    await unsubscribe()
                except Exception:
                    logger.warning(
                        "unsubscribing from chain completion failed",
                        exc_info=True,
                        extra={"chain_id": chain_id},
                    )

    async def _listen_chain_completed(
        self, chain_id: str, callback: Callable[[], object]
    ) -> Callable[[], Awaitable[None]] | None:
        try:
            return await self.notify.listen_chain_completed(chain_id, callback)
        except NotifyAdapterClosedError:
            raise
        except Exception:
            # The database stays the truth: without the subscription we only poll.
            logger.warning(
                "cannot listen for chain completion; polling only",
                exc_info=True,
                extra={"chain_id": chain_id},
            )
            return None

    # -- inspecting ------------------------------------------------------------------

    async def get_chain(self, chain_id: str, *, session: CallerSession = None) -> ChainRecord:
        """The chain as stored now; raises ``ChainNotFoundError``."""
        return await self._retried(session, lambda: self.state.get_chain(chain_id, session=session))

    async def get_job(self, job_id: str, *, session: CallerSession = None) -> JobRecord:
        """The job as stored now; raises ``JobNotFoundError``."""
        return await self._retried(session, lambda: self.state.get_job(job_id, session=session))

    async def job_logs(
        self, job_id: str, *, after: tuple[int, int] | None = None
    ) -> list[JobLogLine]:
        """The lines job ``job_id`` logged (``ctx.log``, ``JobLogHandler``) by attempt, in
        order; ``after=(line.attempt, line.seq)`` of the last line read gives the later ones."""
        return await self._retried(None, lambda: self.state.job_logs(job_id, after=after))

    async def list_chains(
        self,
        *,
        status: JobStatus | None = None,
        type_name: str | None = None,
        limit: int = 50,
        after: str | None = None,
    ) -> Page:
        """Chains newest first; pass ``page.next_cursor`` as ``after`` for the next page."""
        return await self._retried(
            None,
            lambda: self.state.list_chains(
                status=status, type_name=type_name, limit=limit, after=after
            ),
        )

    async def list_jobs(
        self,
        *,
        chain_id: str | None = None,
        status: JobStatus | None = None,
        type_name: str | None = None,
        limit: int = 50,
        after: str | None = None,
    ) -> Page:
        """Jobs newest first (in chain order inside one chain), keyset-paginated."""
        return await self._retried(
            None,
            lambda: self.state.list_jobs(
                chain_id=chain_id, status=status, type_name=type_name, limit=limit, after=after
            ),
        )

    async def count_jobs(self, *, type_names: Sequence[str] | None = None) -> Mapping[str, int]:
        """Number of jobs per status."""
        return await self._retried(None, lambda: self.state.count_jobs(type_names=type_names))

    # -- old names -------------------------------------------------------------------

    async def cancel(self, chain_id: str, *, session: CallerSession = None) -> ChainRecord:
        """Deprecated alias of :meth:`cancel_chain` (removed in the next release)."""
        _renamed("cancel", "cancel_chain")
        return await self.cancel_chain(chain_id, session=session)

    async def trigger(self, chain_id: str, *, session: CallerSession = None) -> ChainRecord:
        """Deprecated alias of :meth:`trigger_chain` (removed in the next release)."""
        _renamed("trigger", "trigger_chain")
        return await self.trigger_chain(chain_id, session=session)

    # -- state calls -----------------------------------------------------------------

    async def _retried(
        self,
        session: CallerSession,
        call: Callable[[], Awaitable[T]],
        *,
        again: Callable[[], Awaitable[T]] | None = None,
    ) -> T:
        """``call()`` in the caller's session as it is; in a transaction of its own,
        repeated after a lost connection -- by ``again()`` when given (it first finds
        out what the lost attempt did), else by ``call()``, which must then be safe to
        repeat after a COMMIT that succeeded unseen -- for at most ``database_timeout``
        seconds, then ``DatabaseUnavailableError``."""
        if session is not None:
            return await call()
        attempts = 0

        async def attempt() -> T:
            nonlocal attempts
            attempts += 1
            return await (call() if attempts == 1 or again is None else again())

        until = asyncio.get_running_loop().time() + self.database_timeout
        try:
            return await retry_on_connection_loss(attempt, what="a client call", until=until)
        except Exception as exc:  # the state layer judges it (drivers raise their own)
            if not is_connection_loss(exc):
                raise
            reason = cannot_connect_reason(exc, None)
            raise DatabaseUnavailableError(
                f"gave up after {self.database_timeout:g}s (Client(database_timeout=...)): "
                + cannot_connect(self.state.address, reason, sqlite=False)
            ) from None

    async def _write(
        self,
        session: CallerSession,
        write: Callable[[NotificationBuffer], Awaitable[T]],
        *,
        again: Callable[[NotificationBuffer], Awaitable[T]] | None = None,
    ) -> T:
        """``write`` through :meth:`_retried`; its notifications are published after
        the COMMIT (the caller's, or its own)."""
        if session is not None:
            # Published by the buffer after the caller's COMMIT, dropped on rollback.
            return await write(buffer_for_transaction(session, self.notify))
        # The adapter adds to ``notes`` only when a write succeeded: one buffer serves
        # every attempt.
        notes = NotificationBuffer()
        result = await self._retried(
            None,
            lambda: write(notes),
            again=None if again is None else lambda: again(notes),
        )
        await self.flush(notes)
        return result

    # -- notifications ---------------------------------------------------------------

    async def flush(self, notes: NotificationBuffer) -> None:
        """Publish ``notes`` (already committed) without waiting for the notify server:
        they go out on the adapter's sender task, in commit order, so a slow or hung
        server never holds up the write that owes them. Notifications are hints: a
        transport failure is logged, never raised, and workers find the jobs on their
        next poll. The noop adapter publishes nowhere: nothing is sent to it (no sender
        task per write)."""
        if type(self.notify) is NoopNotifyAdapter:
            notes.clear()
            return
        send_later(self.notify, notes)


def _renamed(old: str, new: str) -> None:
    warnings.warn(
        f"Client.{old} is renamed Client.{new}; the old name goes in the next release",
        DeprecationWarning,
        stacklevel=3,
    )
