"""``SyncClient``: enqueue from synchronous applications (Flask, Django-style code on a
SQLAlchemy ``Session``). Workers stay asyncio processes; the rows and the wire layout
are the async client's."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any

from queuert_notify.client.chain_spec import ChainSpec
from queuert_notify.client.client import CLOSE_FLUSH_LIMIT, DEFAULT_AWAIT_POLL_INTERVAL
from queuert_notify.client.sync_announcers import announcer_for
from queuert_notify.client.sync_operations import SyncQueueOperations
from queuert_notify.errors import InvalidInputError, WaitChainTimeoutError
from queuert_notify.observe import instrumentation
from state_adapters.backoff import DEFAULT_MAX_ATTEMPTS
from state_adapters.health import HealthReport, HealthThresholds
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
from state_adapters.schema import DEFAULT_TABLE_PREFIX
from state_adapters.storable import check_json
from state_adapters.sync.state import SyncSession, SyncStateAdapter

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from queuert_notify.notify.protocol import NotifyAdapter

_FIRST_POLL = 0.01
"""Seconds before ``await_chain``'s second read; each later wait doubles, up to the
``poll_interval``."""


class SyncClient(SyncQueueOperations):
    """The application side of the queue for synchronous code.

    ``SyncClient(engine, notify=..., table_prefix=...)`` takes a sync ``Engine``
    (``postgresql+psycopg://`` or ``sqlite://``) and any shipped notify adapter,
    constructed as usual: Postgres wakeups are NOTIFYs inside the write's transaction;
    Redis wakeups use that adapter's wire layout and script from a sender thread after
    COMMIT, one round trip per committed transaction (on a Redis Cluster one script per
    hash slot, all sent at once); ``None`` leaves the jobs to the workers' poll. NATS and
    in-process adapters are refused with ``ConfigurationError``: their clients live on an
    event loop.

    With ``session=`` (a ``Session`` or ``Connection``) a call joins the caller's
    transaction and never commits it: a rollback drops the chain and its wakeup, and
    so does the rollback of the savepoint it was written in. Safe to share between
    threads.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        notify: NotifyAdapter | None = None,
        table_prefix: str = DEFAULT_TABLE_PREFIX,
    ) -> None:
        self._state = SyncStateAdapter(engine, table_prefix=table_prefix)
        self._announcer = announcer_for(notify)

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Send the wakeups still owed (at most a few seconds) and stop the sender; the
        engine stays the caller's."""
        self._announcer.close(CLOSE_FLUSH_LIMIT)

    def migrate(self, *, adopt: bool = False) -> None:
        """Create or upgrade the queue's tables, as :meth:`Client.migrate
        <queuert_notify.Client.migrate>` (an unreachable database is the same one-line
        ``ConfigurationError``)."""
        self._state.migrate(adopt=adopt)

    def start_chain(
        self,
        type_name: str,
        input: Any = None,
        *,
        session: SyncSession = None,
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
        """Start a chain whose first job is ``type_name`` with ``input``; options and
        result as :meth:`Client.start_chain`. Invalid arguments raise
        ``InvalidInputError`` before anything is written."""
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
        (started,) = self.start_chains([spec], session=session)
        return started

    def start_chains(
        self, specs: Sequence[ChainSpec], *, session: SyncSession = None
    ) -> list[StartedChain]:
        """Start several chains atomically (all or none), in order."""
        specs = list(specs)
        with instrumentation.active().starting_chains(specs) as observed:
            chains = [spec.to_new_chain(trace_context=observed.trace_context) for spec in specs]
            started = self._state.write(
                session,
                self._announcer,
                lambda state, conn, notes: state.start_chains(chains, notes=notes, session=conn),
            )
            observed.started(started)
        return started

    def get_chain(self, chain_id: str, *, session: SyncSession = None) -> ChainRecord:
        """The chain as stored; raises ``ChainNotFoundError``."""
        return self._state.read(
            session, lambda state, conn, _: state.get_chain(chain_id, session=conn)
        )

    def job_logs(self, job_id: str, *, after: tuple[int, int] | None = None) -> list[JobLogLine]:
        """The lines job ``job_id`` logged, in order (see :meth:`Client.job_logs`)."""
        return self._state.read(
            None, lambda state, conn, _: state.job_logs(job_id, after=after, session=conn)
        )

    def await_chain(
        self,
        chain_id: str,
        timeout: float | None = None,
        *,
        poll_interval: float = DEFAULT_AWAIT_POLL_INTERVAL,
    ) -> ChainRecord:
        """Block the calling thread until the chain is completed, failed or cancelled,
        and return it: re-read after 10 ms, then twice as long each time up to
        ``poll_interval``. Raises ``WaitChainTimeoutError`` after ``timeout`` seconds
        (``None``: wait forever) and ``ChainNotFoundError`` for an unknown id."""
        if poll_interval <= 0:
            raise InvalidInputError(f"poll_interval must be > 0, got {poll_interval!r}")
        deadline = None if timeout is None else time.monotonic() + timeout
        wait = min(_FIRST_POLL, poll_interval)
        while True:
            chain = self.get_chain(chain_id)
            if chain.status in FINAL_STATUSES:
                return chain
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WaitChainTimeoutError(
                        f"chain {chain_id} is still {chain.status} after {timeout}s"
                    )
                wait = min(wait, left)
            time.sleep(wait)
            wait = min(wait * 2, poll_interval)

    def cancel_chain(self, chain_id: str, *, session: SyncSession = None) -> ChainRecord:
        """Cancel the chain's unfinished job (a worker running it cancels its handler);
        a final chain is returned as it is."""
        return self._state.write(
            session,
            self._announcer,
            lambda state, conn, notes: state.cancel_chain(chain_id, notes=notes, session=conn),
        )

    def retry_chain(self, chain_id: str, *, session: SyncSession = None) -> ChainRecord:
        """Run a failed or cancelled chain again from its last job (see
        :meth:`Client.retry_chain`)."""
        return self._state.write(
            session,
            self._announcer,
            lambda state, conn, notes: state.retry_chain(chain_id, notes=notes, session=conn),
        )

    def trigger_chain(self, chain_id: str, *, session: SyncSession = None) -> ChainRecord:
        """Make the chain's pending job due now (see :meth:`Client.trigger_chain`)."""
        return self._state.write(
            session,
            self._announcer,
            lambda state, conn, notes: state.trigger_chain(chain_id, notes=notes, session=conn),
        )

    def complete_chain(
        self, chain_id: str, output: Any = None, *, session: SyncSession = None
    ) -> ChainRecord:
        """Complete the chain from application code, without a worker (see
        :meth:`Client.complete_chain`)."""
        check_json(output, "output")
        return self._state.write(
            session,
            self._announcer,
            lambda state, conn, notes: state.complete_chain(
                chain_id, output, notes=notes, session=conn
            ),
        )

    def delete_chain(self, chain_id: str, *, session: SyncSession = None) -> None:
        """Delete the chain and its jobs; raises ``ChainInUseError`` while other jobs
        are blocked on it."""
        self._state.write(
            session,
            self._announcer,
            lambda state, conn, _: state.delete_chain(chain_id, session=conn),
        )

    # -- inspecting ------------------------------------------------------------------

    def get_job(self, job_id: str, *, session: SyncSession = None) -> JobRecord:
        """The job as stored; raises ``JobNotFoundError``."""
        return self._state.read(session, lambda state, conn, _: state.get_job(job_id, session=conn))

    def list_chains(
        self,
        *,
        status: JobStatus | None = None,
        type_name: str | None = None,
        limit: int = 50,
        after: str | None = None,
    ) -> Page:
        """Chains newest first; pass ``page.next_cursor`` as ``after`` for the next page."""
        return self._state.read(
            None,
            lambda state, conn, _: state.list_chains(
                status=status, type_name=type_name, limit=limit, after=after, session=conn
            ),
        )

    def list_jobs(
        self,
        *,
        chain_id: str | None = None,
        status: JobStatus | None = None,
        type_name: str | None = None,
        limit: int = 50,
        after: str | None = None,
    ) -> Page:
        """Jobs newest first (in chain order inside one chain), keyset-paginated."""
        return self._state.read(
            None,
            lambda state, conn, _: state.list_jobs(
                chain_id=chain_id,
                status=status,
                type_name=type_name,
                limit=limit,
                after=after,
                session=conn,
            ),
        )

    def count_jobs(self, *, type_names: Sequence[str] | None = None) -> Mapping[str, int]:
        """Number of jobs per status."""
        return self._state.read(
            None, lambda state, conn, _: state.count_jobs(type_names=type_names, session=conn)
        )

    def health(self, *, thresholds: HealthThresholds | None = None) -> HealthReport:
        """The queue's health (see :meth:`Client.health`), on a connection of the
        engine's pool."""
        return self._state.read(
            None, lambda state, conn, _: state.health(thresholds=thresholds, session=conn)
        )
