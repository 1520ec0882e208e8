"""The worker loop: wake on hints, claim jobs in batches, run handlers under a lease.

One worker holds one job-scheduled subscription and one ``on_reconnect`` hook for its
whole lifetime. A notification for a type costs one ``consume_wake_hint`` call and
queries SQL only when that returns True, so a burst of n jobs wakes about n workers.
SQL decides ownership (leases fenced by token); notifications are only hints, and the
loop also wakes at the next due job and at the poll interval.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack, suppress
from datetime import UTC, datetime
from typing import Any, Literal

from queuert_notify.client import CLOSE_FLUSH_LIMIT, Client
from queuert_notify.completion_batcher import BatchWriter, CompletionBatcher, CompletionResult
from queuert_notify.errors import (
    ConfigurationError,
    InvalidInputError,
    NotifyAdapterClosedError,
)
from queuert_notify.events import EventEmitter, WorkerEvent
from queuert_notify.job_outcome import OutcomeWriter
from queuert_notify.job_run import JobRun
from queuert_notify.jobs import Handler, HandlerRegistry, Job, JobContext
from queuert_notify.lease_keeper import LeaseKeeper
from queuert_notify.loop_watchdog import LoopWatchdog
from queuert_notify.notify.protocol import Unsubscribe
from queuert_notify.reaper import Reaper
from queuert_notify.shutdown import Shutdown, settle
from queuert_notify.wake_policy import WakePolicy
from queuert_notify.wake_subscriptions import WakeSubscriptions
from state_adapters.notifications import NotificationBuffer, wait_for_notifications
from state_adapters.protocol import Completion, JobRecord
from state_adapters.validation import check_positive_int, check_seconds

logger = logging.getLogger(__name__)

WorkerMode = Literal["atomic", "staged"]

_MAX_ERROR_BACKOFF = 30.0
_NO_SUCH_JOB = "0" * 32
"""A job id no job has (ids begin with their creation time): the start-up table check."""


class Worker:
    """Runs handlers for the job types in ``handlers``.

    Guarantees: a job is run only while this worker holds its lease, and every write
    for it is fenced by the lease token; a worker never claims a type it has no
    handler for; at most ``concurrency`` handlers run at once; after ``stop()`` (or
    SIGTERM/SIGINT under ``run()`` in the main thread) it claims nothing new, lets
    running handlers finish for up to ``drain_timeout`` seconds, cancels the rest
    (their leases expire and the jobs are retried) and leaves no task behind.

    A notify server that does not answer at start does not stop the worker: it polls
    every ``poll_interval`` and subscribes once the server answers (unless the client
    was built with ``require_notify=True``: then ``run()`` raises ConfigurationError).

    ``mode="atomic"``: ``ctx.session`` is an ``AsyncSession`` whose transaction the
    completion and any ``continue_with`` commit in. ``mode="staged"``: the handler runs
    outside any transaction and the completion is written in a new fenced one, batched
    with other completions that finish close together.

    In atomic mode a handler that never wrote through ``ctx.session`` (no statement run,
    no object added) has nothing to commit with its completion, which is then batched
    as in staged mode. A handler that did write commits its completion alone, in its own
    session's transaction: its rows commit with exactly its completion, and a job that
    fails never rolls back another's. A slot is free again once the handler returns;
    the completion is written meanwhile (at most ``concurrency`` completions wait).
    """

    def __init__(
        self,
        client: Client,
        handlers: Mapping[str, Handler],
        *,
        concurrency: int = 10,
        poll_interval: float = 60.0,
        lease: float = 60.0,
        mode: WorkerMode = "atomic",
        worker_id: str | None = None,
        handler_timeout: float | None = None,
        retry_backoff: Callable[[int], float] | None = None,
        drain_timeout: float = 30.0,
        reap_interval: float | None = None,
        jitter: float = 0.1,
        on_event: Callable[[WorkerEvent], object] | None = None,
        completion_batch_size: int = 100,
        completion_linger: float = 0.0,
        loop_lag_threshold: float | None = 0.5,
    ) -> None:
        """
        ``poll_interval``: seconds between SQL polls when no hint arrives (± ``jitter``
        as a fraction); ``lease``: seconds a claim lasts without renewal (renewed every
        third of it); ``handler_timeout``: seconds after which a handler's attempt fails;
        ``retry_backoff(attempt) -> seconds`` overrides the state adapter's capped
        exponential backoff; ``reap_interval``: how often an idle worker returns expired
        leases to pending (default ``lease / 2``); ``on_event``: called with a
        :class:`WorkerEvent` for every started/completed/retried/failed/ownership_lost/
        reaped/progress/loop_blocked; ``loop_lag_threshold``: seconds the event loop may
        be blocked before a warning names the running jobs (``None``: no watchdog).
        """
        check_positive_int(concurrency, "concurrency")
        check_seconds(poll_interval, "poll_interval", allow_zero=False)
        check_seconds(lease, "lease", allow_zero=False)
        check_seconds(drain_timeout, "drain_timeout", allow_zero=True)
        check_positive_int(completion_batch_size, "completion_batch_size")
        if handler_timeout is not None:
            check_seconds(handler_timeout, "handler_timeout", allow_zero=False)
        if reap_interval is not None:
            check_seconds(reap_interval, "reap_interval", allow_zero=False)
        if loop_lag_threshold is not None:
            check_seconds(loop_lag_threshold, "loop_lag_threshold", allow_zero=False)
        if not 0 <= jitter < 1:
            raise InvalidInputError(f"jitter must be a fraction in [0, 1), got {jitter!r}")
        if retry_backoff is not None and not callable(retry_backoff):
            raise InvalidInputError(
                f"retry_backoff must be a callable attempt -> seconds, got {retry_backoff!r}"
            )
        if mode not in ("atomic", "staged"):
            raise InvalidInputError(f"mode must be 'atomic' or 'staged', got {mode!r}")
        self.client = client
        self.registry = HandlerRegistry(handlers)
        self.type_names = self.registry.type_names
        self.concurrency = concurrency
        self.poll_interval = poll_interval
        self.lease = lease
        self.mode: WorkerMode = mode
        self.worker_id = worker_id or f"worker-{uuid.uuid4().hex[:12]}"
        self.handler_timeout = handler_timeout
        self.retry_backoff = retry_backoff
        self.drain_timeout = drain_timeout
        self.reap_interval = reap_interval if reap_interval is not None else lease / 2
        self.jitter = jitter
        self.on_event = on_event
        self._emit = EventEmitter(on_event, worker_id=self.worker_id)
        self._no_session_reason = (
            "ctx.session exists only in atomic mode; this worker runs in staged mode "
            "(Worker(..., mode='atomic') to write in the completion's transaction)"
            if mode == "staged"
            else f"ctx.session needs a state adapter with handler transactions; "
            f"{type(client.state).__name__} has none"
        )
        self._batch_size = completion_batch_size
        self._linger = completion_linger
        self._watchdog = (
            LoopWatchdog(loop_lag_threshold, on_lag=self._on_loop_lag, active=self._running_ids)
            if loop_lag_threshold is not None
            else None
        )

        self._runs: dict[str, JobRun] = {}  # lease token -> run, until its outcome is written
        self._leases = LeaseKeeper(
            client.state, lease, lambda: self._runs.values(), worker_id=self.worker_id
        )
        self._busy = 0  # runs holding a slot: their handler has not finished
        self._wake = asyncio.Event()
        self._policy = WakePolicy(
            client.notify,
            lambda: client.state.next_due_at(self.type_names),
            poll_interval=poll_interval,
            jitter=jitter,
            worker_id=self.worker_id,
        )
        self._shutdown = Shutdown(drain_timeout)
        self._started = asyncio.Event()
        self._done = asyncio.Event()
        self._hint_tasks: set[asyncio.Task[None]] = set()
        self._subscriptions = WakeSubscriptions(
            client.notify,
            self.type_names,
            on_scheduled=self._on_job_scheduled,
            on_reconnect=self._on_reconnect,
            worker_id=self.worker_id,
        )
        self._renewer: asyncio.Task[None] | None = None
        self._reaper: asyncio.Task[None] | None = None
        self._reaping = Reaper(
            client,
            self.type_names,
            interval=self.reap_interval,
            jitter=jitter,
            reaped=lambda job_id: self._emit("reaped", job_id=job_id),
            woke=self._on_reconnect,
            worker_id=self.worker_id,
        )
        self._batcher: CompletionBatcher | None = None
        self._outcomes: OutcomeWriter | None = None
        self._run_task: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------------------

    async def __aenter__(self) -> Worker:
        """Start ``run()`` in a background task; returns once the worker listens."""
        self._run_task = asyncio.create_task(
            self.run(handle_signals=False), name=f"queuert-worker-{self.worker_id}"
        )
        started = asyncio.create_task(self._started.wait())
        await asyncio.wait({self._run_task, started}, return_when=asyncio.FIRST_COMPLETED)
        if not started.done():
            started.cancel()
            with suppress(asyncio.CancelledError):
                await started
        if self._run_task.done():
            self._run_task.result()  # re-raise why it could not start
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def stop(self, *, force: bool = False) -> None:
        """Stop claiming, drain running handlers (cancelled at once with ``force``) and
        wait until ``run()`` has returned (not when called from inside a handler)."""
        self._request_stop(force=force)
        if self._batcher is None or self._called_from_inside():
            return
        await self._done.wait()
        if self._run_task is not None:
            await asyncio.gather(self._run_task, return_exceptions=True)

    def _called_from_inside(self) -> bool:
        current = asyncio.current_task()
        if current is self._run_task:
            return True
        return any(current is r.task for r in self._runs.values())

    async def run(self, *, handle_signals: bool = True) -> None:
        """Run until ``stop()``. With ``handle_signals`` in the main thread, SIGTERM and
        SIGINT start a graceful drain and a second signal cancels running handlers."""
        if self._batcher is not None:
            raise RuntimeError("a Worker runs once; create a new Worker to run again")
        loop = asyncio.get_running_loop()
        installed = self._install_signal_handlers(loop) if handle_signals else []
        held = AsyncExitStack()
        self._batcher = CompletionBatcher(
            self._batch_writer(),
            self.client.flush,
            max_batch=self._batch_size,
            max_delay=self._linger,
        )
        self._outcomes = OutcomeWriter(
            self.client,
            self._batcher,
            emit=self._emit,
            release_slot=self._release_slot,
            continued=self._continued,
            retry_backoff=self.retry_backoff,
            worker_id=self.worker_id,
        )
        try:
            await self.client.connect()
            self._check_pool_size()
            await self._check_tables()
            # Claims and completions on connections kept out of the pool while the
            # worker runs (when the adapter keeps any).
            await held.enter_async_context(self.client.state.holding_connections())
            try:
                await self._subscriptions.open()
            except Exception as exc:
                if self.client.require_notify or isinstance(exc, NotifyAdapterClosedError):
                    raise
                logger.warning(
                    "cannot listen for wakeups; polling every %.1fs until the notify "
                    "adapter answers: %s",
                    self.poll_interval,
                    exc,
                    extra={"worker_id": self.worker_id},
                )
                self._subscriptions.open_later()
            self._started.set()
            self._renewer = asyncio.create_task(self._leases.run(), name="queuert-lease-renewer")
            self._reaper = asyncio.create_task(self._reaping.run(), name="queuert-reaper")
            if self._watchdog is not None:
                self._watchdog.start()
            logger.info(
                "worker started",
                extra={"worker_id": self.worker_id, "type_names": list(self.type_names)},
            )
            await self._run_until_stopped()
        finally:
            await self._release(held)
            for signum in installed:
                loop.remove_signal_handler(signum)
            self._shutdown.request(force=False)
            self._done.set()
            logger.info("worker stopped", extra={"worker_id": self.worker_id})

    async def _release(self, held: AsyncExitStack) -> None:
        """Cancel the worker's own tasks, write what is queued and give back what the run
        held. Bounded: once the worker gave up on its jobs (drain timeout, forced stop,
        an error) everything left gets ``CANCEL_GRACE`` from then."""
        loop = asyncio.get_running_loop()
        runs = {r.task for r in self._runs.values() if r.task}
        if runs:
            self._abandon(runs)
        until = self._shutdown.give_up_at or loop.time() + CLOSE_FLUSH_LIMIT
        own = [
            self._subscriptions.background_task(),
            self._renewer,
            self._reaper,
            *self._hint_tasks,
        ]
        for task in own:
            if task is not None:
                task.cancel()
        await settle([*runs, *(t for t in own if t is not None)], until)
        await self._subscriptions.close()
        assert self._batcher is not None
        await settle({asyncio.ensure_future(self._batcher.close())}, until)
        await settle({asyncio.ensure_future(held.aclose())}, until)
        if self._watchdog is not None:
            await self._watchdog.close()
        # Completions committed in handler sessions publish from after-commit tasks.
        await wait_for_notifications(timeout=max(until - loop.time(), 0.0))

    async def _check_tables(self) -> None:
        """Raise the state adapter's ConfigurationError at start on a database whose
        queue tables were never migrated, instead of failing every claim of the loop.

        One primary-key read of the jobs table, for an id no job has (ids begin with
        their creation time); its JobNotFoundError means the table is there. Anything
        else (the database is down) is left to the loop, which retries it."""
        try:
            await self.client.state.get_job(_NO_SUCH_JOB)
        except ConfigurationError:
            raise
        except Exception:
            return

    def _check_pool_size(self) -> None:
        size = self.client.state.connection_capacity()
        if self.mode != "atomic" or size is None:
            return
        # A session per handler, the two connections claims and completions keep, and two
        # for the rest (reaping, renewals, failures).
        wanted = self.concurrency + 4
        if size < wanted:
            # Connections beyond the pool are opened and closed per use, which costs more
            # than the job itself when every handler writes through ctx.session.
            logger.info(
                "the engine's pool (pool_size=%s) is smaller than concurrency + 4 = %s; "
                "handlers that use ctx.session will open a connection per job. "
                "Pass create_async_engine(..., pool_size=%s).",
                size,
                wanted,
                wanted,
                extra={"worker_id": self.worker_id},
            )

    def _install_signal_handlers(self, loop: asyncio.AbstractEventLoop) -> list[int]:
        if threading.current_thread() is not threading.main_thread():
            return []
        installed: list[int] = []
        for signum in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(signum, self._on_signal, signum)
            except (NotImplementedError, RuntimeError):  # e.g. Windows event loops
                continue
            installed.append(signum)
        return installed

    def _on_signal(self, signum: int) -> None:
        force = self._shutdown.requested
        logger.info(
            "signal received; %s",
            "cancelling running handlers" if force else "draining running jobs",
            extra={"worker_id": self.worker_id, "signal": signum},
        )
        self._request_stop(force=force)

    def _request_stop(self, *, force: bool) -> None:
        self._shutdown.request(force=force)
        self._wake.set()
        if force:
            self._cancel_handlers("worker stopped without drain")

    async def _run_until_stopped(self) -> None:
        """Run the loop until a stop is requested, then drain (see :class:`Shutdown`):
        whatever is left after ``drain_timeout`` is cancelled wherever it waits (a
        handler, a completion being written, a claim), and its job runs again once its
        lease expires, as after a kill."""
        loop_task = asyncio.create_task(self._loop(), name=f"queuert-loop-{self.worker_id}")
        await self._shutdown.until_requested(loop_task)
        if loop_task.done():
            loop_task.result()  # why it ended before a stop (a ConfigurationError)
        running = len(self._runs)
        if running and not self._shutdown.forced:
            logger.info(
                "draining running jobs", extra={"worker_id": self.worker_id, "running": running}
            )
        left = await self._shutdown.drain(
            lambda: [loop_task, *(r.task for r in self._runs.values() if r.task)]
        )
        if left:
            if not self._shutdown.forced:
                logger.warning(
                    "drain timeout: cancelling running jobs; they will be retried when their "
                    "leases expire",
                    extra={"worker_id": self.worker_id, "running": len(self._runs)},
                )
            self._abandon(left)
            await settle(left, self._shutdown.give_up())
        if loop_task.done() and not loop_task.cancelled():
            loop_task.result()

    def _abandon(self, tasks: set[asyncio.Task[None]]) -> None:
        """Cancel everything still running, wherever it waits, and give it
        ``CANCEL_GRACE`` to end."""
        self._shutdown.give_up()
        self._cancel_handlers("worker stopped")
        assert self._batcher is not None
        self._batcher.abort()
        for task in tasks:
            task.cancel()

    # -- wakeups ---------------------------------------------------------------------

    def _free_slots(self) -> int:
        """Handlers that may start now. A finished handler gives its slot back before its
        completion is written (claiming overlaps writing), but at most twice
        ``concurrency`` completions wait to be written (a batch in flight and the next),
        so a slow database slows claiming down."""
        return min(self.concurrency - self._busy, 3 * self.concurrency - len(self._runs))

    def _on_job_scheduled(self, type_name: str) -> None:
        if self._shutdown.requested:
            return
        if self._free_slots() <= 0:
            # Busy: leave the hint to an idle worker; ask for it when a slot frees.
            self._policy.busy(type_name)
            return
        task = asyncio.create_task(self._consume_hint(type_name))
        self._hint_tasks.add(task)
        task.add_done_callback(self._hint_tasks.discard)

    async def _consume_hint(self, type_name: str) -> None:
        if await self._policy.hint_granted(type_name):
            self._policy.granted()
            self._wake.set()

    def _on_reconnect(self) -> None:
        # Notifications may have been missed while the transport was down, or the
        # reaper returned jobs: claim now.
        self._policy.more_may_wait()
        self._wake.set()

    # -- the loop --------------------------------------------------------------------

    async def _loop(self) -> None:
        error_backoff = 0.0
        while not self._shutdown.requested:
            # Cleared before querying so a wake arriving during the query is kept.
            self._wake.clear()
            timeout: float | None = None
            try:
                free = self._free_slots()
                if free > 0:
                    # Not claiming (the wake budget says the jobs are taken) sleeps as
                    # after an empty claim: until the next due job.
                    claim = await self._policy.should_claim()
                    claimed_at = asyncio.get_running_loop().time()
                    records = await self._claim(free) if claim else []
                    for record in records:
                        self._start(record, claimed_at)
                    self._policy.claimed((r.type_name for r in records), len(records), free)
                    if len(records) < free:
                        timeout = await self._policy.idle_timeout(
                            acquired=bool(records), claimed=claim
                        )
                error_backoff = 0.0
            except ConfigurationError as exc:
                # Not transient (the tables were dropped): retrying cannot help.
                logger.error("worker stopped: %s", exc, extra={"worker_id": self.worker_id})
                raise
            except Exception:
                error_backoff = min(max(error_backoff * 2, 0.5), _MAX_ERROR_BACKOFF)
                logger.warning(
                    "worker loop failed; retrying in %.1fs",
                    error_backoff,
                    exc_info=True,
                    extra={"worker_id": self.worker_id},
                )
                timeout = min(error_backoff, self.poll_interval)
            if self._shutdown.requested:
                break
            if timeout is None:
                if self._free_slots() > 0:
                    # A slot freed while this pass claimed: nothing else would wake
                    # the loop for it.
                    continue
                # All slots are busy: a freed slot wakes the loop.
                timeout = self._policy.poll_timeout()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                # The poll interval or the next due job (see WakePolicy).
                self._policy.poll_timer_fired()

    async def _claim(self, limit: int) -> list[JobRecord]:
        """Claim up to ``limit`` jobs. Completions waiting to be written go along when
        the state adapter says that is cheaper (``completes_with_claims``: SQLite, one
        writer at a time); otherwise the batcher writes them while this claims."""
        state = self.client.state
        assert self._batcher is not None
        taken = self._batcher.take() if state.completes_with_claims else []
        if not taken:
            return await state.acquire(
                self.type_names, worker_id=self.worker_id, lease_seconds=self.lease, limit=limit
            )
        return await self._batcher.write_with(
            taken,
            lambda completions, notes: state.complete_and_acquire(
                completions,
                notes=notes,
                type_names=self.type_names,
                worker_id=self.worker_id,
                lease_seconds=self.lease,
                limit=limit,
            ),
        )

    def _batch_writer(self) -> BatchWriter:
        """How the batcher writes completions alone: ``complete_and_acquire`` with no
        claim (it reads back no job rows)."""
        state = self.client.state

        async def write(
            completions: list[Completion], notes: NotificationBuffer
        ) -> Sequence[CompletionResult]:
            written, _ = await state.complete_and_acquire(
                completions,
                notes=notes,
                type_names=self.type_names,
                worker_id=self.worker_id,
                lease_seconds=self.lease,
                limit=0,
            )
            return list(written)

        return write

    # -- running one job -------------------------------------------------------------

    def _start(self, record: JobRecord, claimed_at: float) -> None:
        if record.lease_token is None:
            logger.error(
                "acquired a job without a lease token; skipping it",
                extra={"worker_id": self.worker_id, "job_id": record.id},
            )
            return
        run = JobRun(Job.from_record(record), record.lease_token, record.leased_until)
        self._leases.granted(run, claimed_at)
        self._runs[run.lease_token] = run
        self._busy += 1
        run.task = asyncio.create_task(self._execute(run), name=f"queuert-job-{record.id}")
        run.task.add_done_callback(lambda _: self._finished(run))

    def _finished(self, run: JobRun) -> None:
        was_full = self._free_slots() <= 0
        self._runs.pop(run.lease_token, None)
        if run.holds_slot:
            run.holds_slot = False
            self._busy -= 1
        if not self._shutdown.requested and (self._policy.more or was_full):
            self._wake.set()

    def _release_slot(self, run: JobRun) -> None:
        """The handler finished: let another job start while this one's outcome is written."""
        if not run.holds_slot:
            return
        was_full = self._free_slots() <= 0
        run.holds_slot = False
        self._busy -= 1
        if not self._shutdown.requested and (self._policy.more or was_full):
            self._wake.set()

    async def _execute(self, run: JobRun) -> None:
        job = run.job
        ctx = JobContext(
            job,
            state=self.client.state,
            worker_id=self.worker_id,
            lease_token=run.lease_token,
            lease_seconds=self.lease,
            transaction=self.client.state.handler_transaction() if self.mode == "atomic" else None,
            no_session_reason=self._no_session_reason,
            on_progress=lambda progress: self._emit("progress", job, progress=progress),
            on_lease_renewed=lambda until: self._leases.renewed(run, until),
        )
        self._emit("started", job)
        unsubscribe: Unsubscribe | None = None
        try:
            unsubscribe = await self._subscriptions.listen_for_ownership_loss(
                job.id, lambda: self._leases.check_ownership(run), _job_extra(job, self.worker_id)
            )
            result, error = await run.run_handler(
                lambda: self.registry.call(run.job, ctx), self.handler_timeout
            )
            assert self._outcomes is not None
            await self._outcomes.finish(run, ctx, result, error)
        finally:
            if run.checks:
                for check in list(run.checks):
                    check.cancel()
                await asyncio.gather(*run.checks, return_exceptions=True)
            if ctx.transaction is not None:
                await ctx.transaction.close()
            if unsubscribe is not None:
                with suppress(Exception):
                    await unsubscribe()

    def _continued(self, type_name: str) -> None:
        """A completion created the chain's next job, of ``type_name``."""
        if type_name in self.registry:
            # We handle the continuation ourselves: look for it now instead of waiting
            # for the notification round trip.
            self._policy.more_may_wait()
            self._wake.set()

    def _cancel_handlers(self, reason: str) -> None:
        """Abandon running jobs: they keep their lease until it expires, then run again."""
        for run in list(self._runs.values()):
            run.abandon(reason)

    # -- a blocked event loop --------------------------------------------------------

    def _running_ids(self) -> list[str]:
        return [run.job.id for run in self._runs.values()]

    def _on_loop_lag(self, lag: float, job_ids: frozenset[str]) -> None:
        running = sorted(job_ids)
        logger.warning(
            "event loop blocked for %.2fs while jobs %s were running; a handler is probably "
            "doing blocking work in an async def (make it a plain def, which runs in a "
            "thread, or wrap the blocking call in asyncio.to_thread)",
            lag,
            ", ".join(running) or "(none)",
            extra={"worker_id": self.worker_id, "job_ids": running, "lag": lag},
        )
        self._emit("loop_blocked", lag=lag, job_ids=tuple(running))


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _job_extra(job: Job, worker_id: str) -> dict[str, Any]:
    return {
        "job_id": job.id,
        "type_name": job.type_name,
        "attempt": job.attempt,
        "worker_id": worker_id,
    }
