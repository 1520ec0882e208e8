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
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack, suppress
from datetime import timedelta

from queuert_notify.client.client import CLOSE_FLUSH_LIMIT, Client
from queuert_notify.errors import ConfigurationError
from queuert_notify.events import EventEmitter, WorkerEvent
from queuert_notify.jobs import Handler, HandlerRegistry
from queuert_notify.maintenance.schedules import Schedule
from queuert_notify.maintenance.services import MaintenanceServices
from queuert_notify.observe import instrumentation
from queuert_notify.worker.claimer import Claimer
from queuert_notify.worker.job_execution import JobExecution
from queuert_notify.worker.job_outcome import OutcomeWriter
from queuert_notify.worker.job_run import JobRun
from queuert_notify.worker.lease_keeper import LeaseKeeper
from queuert_notify.worker.loop_watchdog import LoopWatchdog, warn_blocked
from queuert_notify.worker.settings import WorkerMode, WorkerSettings
from queuert_notify.worker.shutdown import Shutdown, settle, stop_signals, stopping_line
from queuert_notify.worker.slots import Slots
from queuert_notify.worker.startup_checks import check_at_start
from queuert_notify.worker.wake.policy import WakePolicy
from queuert_notify.worker.wake.subscriptions import WakeSubscriptions
from state_adapters.backoff import Backoff
from state_adapters.model import JobRecord
from state_adapters.notifications import wait_for_notifications
from state_adapters.outage_log import OutageLog

__all__ = ["Worker", "WorkerMode", "WorkerSettings"]

logger = logging.getLogger(__name__)

_ERROR_BACKOFF_FIRST, _ERROR_BACKOFF_MAX = 0.5, 30.0
"""Seconds the loop pauses after a failed pass: doubling from the first to the maximum."""


class Worker:
    """Runs handlers for the job types in ``handlers``.

    Guarantees: a job is run only while this worker holds its lease, and every write
    for it is fenced by the lease token; a worker never claims a type it has no
    handler for; at most ``concurrency`` handlers run at once; after ``stop()`` (or
    SIGTERM/SIGINT under ``run()`` in the main thread) it claims nothing new, lets
    running handlers and the jobs claimed ahead finish for up to ``drain_timeout``
    seconds, cancels the rest (their leases expire and the jobs are retried) and leaves
    no task behind. With ``claim_ahead`` (see :class:`WorkerSettings`) a claim during a
    backlog also takes jobs ahead of the free slots, leased while they wait for one.

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
        schedules: Sequence[Schedule] = (),
        retention: timedelta | None = None,
        startup_timeout: float = 30.0,
        job_log_lines: int = 1000,
        job_log_bytes: int = 256 * 1024,
        claim_ahead: bool = False,
    ) -> None:
        """The keyword arguments are :class:`WorkerSettings`' (documented there) and
        ``on_event``: called with a :class:`WorkerEvent` for every started/completed/
        retried/failed/ownership_lost/reaped/progress/loop_blocked. Checked here: a bad
        value raises InvalidInputError."""
        settings = WorkerSettings(
            concurrency=concurrency,
            poll_interval=poll_interval,
            lease=lease,
            mode=mode,
            worker_id=worker_id or "",
            handler_timeout=handler_timeout,
            retry_backoff=retry_backoff,
            drain_timeout=drain_timeout,
            reap_interval=reap_interval,
            jitter=jitter,
            completion_batch_size=completion_batch_size,
            completion_linger=completion_linger,
            loop_lag_threshold=loop_lag_threshold,
            schedules=tuple(schedules),
            retention=retention,
            startup_timeout=startup_timeout,
            job_log_lines=job_log_lines,
            job_log_bytes=job_log_bytes,
            claim_ahead=claim_ahead,
        )
        self.settings = settings
        self.client = client
        self.registry = HandlerRegistry(handlers)
        self.type_names = self.registry.type_names
        self.concurrency = concurrency
        self.poll_interval = poll_interval
        self.lease = lease
        self.mode: WorkerMode = mode
        self.worker_id = settings.worker_id
        self.handler_timeout = handler_timeout
        self.retry_backoff = retry_backoff
        self.drain_timeout = drain_timeout
        self.reap_interval = settings.reap_every
        self.jitter = jitter
        self.on_event = on_event
        self._emit = EventEmitter(on_event, worker_id=self.worker_id)

        # What the loop reads: free slots, a reason to claim (the wake policy, set by
        # hints, reconnects, finished runs and timers through _wake), a stop request.
        self._slots = Slots(concurrency)
        self._wake = asyncio.Event()
        self._policy = WakePolicy(
            client.notify,
            lambda: client.state.next_due_at(self.type_names),
            self._wake,
            poll_interval=poll_interval,
            jitter=jitter,
            worker_id=self.worker_id,
        )
        self._shutdown = Shutdown(drain_timeout)
        self._started = asyncio.Event()
        self._done = asyncio.Event()
        self._subscriptions = WakeSubscriptions(
            client.notify,
            self.type_names,
            on_scheduled=self._on_job_scheduled,
            on_reconnect=self._on_reconnect,
            worker_id=self.worker_id,
        )
        # Timers of their own, started by run() and cancelled when it ends.
        self._leases = LeaseKeeper(client.state, lease, self._slots, worker_id=self.worker_id)
        self._maintenance = MaintenanceServices(
            client,
            self.type_names,
            reap_interval=self.reap_interval,
            jitter=jitter,
            schedules=settings.schedules,
            retention=settings.retention,
            reaped=lambda job_id: self._emit("reaped", job_id=job_id),
            woke=self._on_reconnect,
            worker_id=self.worker_id,
            slots=concurrency,
        )
        self._watchdog = None
        if (lag := loop_lag_threshold) is not None:
            self._watchdog = LoopWatchdog(lag, on_lag=self._on_loop_lag, active=self._slots.job_ids)
        self._timers: list[asyncio.Task[None]] = []
        # Built by run(): the writes of claims and completions, and each job's run.
        self._claimer: Claimer | None = None
        self._execution: JobExecution | None = None
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
        if self._claimer is None or self._called_from_inside():
            return
        await self._done.wait()
        if self._run_task is not None:
            await asyncio.gather(self._run_task, return_exceptions=True)

    @property
    def abandoned_jobs(self) -> int:
        """Running jobs this worker gave up on when it stopped (the drain timeout passed,
        a forced stop): each runs again once its lease expires. 0 after a full drain."""
        return self._slots.abandoned

    def _called_from_inside(self) -> bool:
        current = asyncio.current_task()
        return current is self._run_task or current in self._slots.tasks()

    async def run(self, *, handle_signals: bool = True) -> None:
        """Run until ``stop()``. With ``handle_signals`` in the main thread, SIGTERM and
        SIGINT start a graceful drain and a second signal cancels running handlers."""
        if self._claimer is not None:
            raise RuntimeError("a Worker runs once; create a new Worker to run again")
        held = AsyncExitStack()
        self._claimer = claimer = Claimer(
            self.client.state,
            self.type_names,
            worker_id=self.worker_id,
            lease=self.lease,
            flush=self.client.flush,
            max_batch=self.settings.completion_batch_size,
            max_delay=self.settings.completion_linger,
        )
        outcomes = OutcomeWriter(
            self.client,
            claimer.batcher,
            emit=self._emit,
            release_slot=self._release_slot,
            continued=self._continued,
            settings=self.settings,
        )
        self._execution = JobExecution(
            self.client,
            self.registry,
            self.settings,
            subscriptions=self._subscriptions,
            leases=self._leases,
            outcomes=outcomes,
            emit=self._emit,
        )
        with stop_signals(self._on_signal, enabled=handle_signals):
            try:
                await self.client.connect()
                await check_at_start(self.client.state, self.settings)
                # Claims and completions on connections kept out of the pool while the
                # worker runs (when the adapter keeps any).
                await held.enter_async_context(self.client.state.holding_connections())
                await held.enter_async_context(
                    instrumentation.active().observing(self.client.state, self.type_names)
                )
                await self._subscriptions.open_or_poll(
                    required=self.client.require_notify, poll_interval=self.poll_interval
                )
                self._started.set()
                self._start_timers()
                logger.info(
                    "worker started",
                    extra={"worker_id": self.worker_id, "type_names": list(self.type_names)},
                )
                await self._run_until_stopped()
            finally:
                await self._release(held)
                self._shutdown.request(force=False)
                self._done.set()
                logger.info("worker stopped", extra={"worker_id": self.worker_id})

    def _start_timers(self) -> None:
        """The worker's own periodic tasks, next to the loop; each is cancelled when
        ``run()`` ends (:meth:`_release`)."""
        self._timers = [
            asyncio.create_task(self._leases.run(), name="queuert-lease-renewer"),
            *self._maintenance.start(),
        ]
        if self._watchdog is not None:
            self._watchdog.start()

    async def _release(self, held: AsyncExitStack) -> None:
        """Cancel the worker's own tasks, write what is queued and give back what the run
        held. Bounded: once the worker gave up on its jobs (drain timeout, forced stop,
        an error) everything left gets ``CANCEL_GRACE`` from then."""
        loop = asyncio.get_running_loop()
        runs = self._slots.tasks()
        if runs:
            self._abandon(runs)
        until = self._shutdown.give_up_at or loop.time() + CLOSE_FLUSH_LIMIT
        retrying = self._subscriptions.background_task()
        own = [*self._timers, *self._policy.tasks(), *([retrying] if retrying else [])]
        for task in own:
            task.cancel()
        await settle([*runs, *own], until)
        await self._subscriptions.close()
        assert self._claimer is not None
        await settle({asyncio.ensure_future(self._claimer.batcher.close())}, until)
        await settle({asyncio.ensure_future(held.aclose())}, until)
        if self._watchdog is not None:
            await self._watchdog.close()
        # Completions committed in handler sessions publish from after-commit tasks.
        await wait_for_notifications(timeout=max(until - loop.time(), 0.0))

    def _on_signal(self, signum: int) -> None:
        force = self._shutdown.requested
        logger.warning(
            stopping_line(len(self._slots), self.drain_timeout, force=force),
            extra={"worker_id": self.worker_id, "signal": signum},
        )
        self._request_stop(force=force)

    def _request_stop(self, *, force: bool) -> None:
        self._shutdown.request(force=force)
        self._wake.set()
        if force:
            self._slots.abandon_all("worker stopped without drain")

    async def _run_until_stopped(self) -> None:
        """Run the loop until a stop is requested, then drain (see :class:`Shutdown`):
        whatever is left after ``drain_timeout`` is cancelled wherever it waits (a
        handler, a completion being written, a claim), and its job runs again once its
        lease expires, as after a kill."""
        loop_task = asyncio.create_task(self._loop(), name=f"queuert-loop-{self.worker_id}")
        await self._shutdown.until_requested(loop_task)
        if loop_task.done():
            loop_task.result()  # why it ended before a stop (a ConfigurationError)
        running = len(self._slots)
        if running and not self._shutdown.forced:
            logger.info(
                "draining running jobs", extra={"worker_id": self.worker_id, "running": running}
            )
        left = await self._shutdown.drain(lambda: [loop_task, *self._slots.tasks()])
        if left:
            if not self._shutdown.forced:
                logger.warning(
                    "drain timeout: cancelling running jobs; they will be retried when their "
                    "leases expire",
                    extra={"worker_id": self.worker_id, "running": len(self._slots)},
                )
            self._abandon(left)
            await settle(left, self._shutdown.give_up())
        if loop_task.done() and not loop_task.cancelled():
            loop_task.result()

    def _abandon(self, tasks: set[asyncio.Task[None]]) -> None:
        """Cancel everything still running, wherever it waits, and give it
        ``CANCEL_GRACE`` to end."""
        self._shutdown.give_up()
        self._slots.abandon_all("worker stopped")
        assert self._claimer is not None
        self._claimer.batcher.abort()
        for task in tasks:
            task.cancel()

    # -- reasons to claim ------------------------------------------------------------

    def _on_job_scheduled(self, type_name: str) -> None:
        if not self._shutdown.requested:
            self._policy.announced(type_name, self._slots.free())

    def _on_reconnect(self) -> None:
        # Notifications may have been missed while the transport was down, or the
        # reaper returned jobs: claim now.
        self._policy.more_may_wait()
        self._wake.set()

    def _continued(self, type_name: str) -> None:
        """A completion created the chain's next job, of ``type_name``."""
        if type_name in self.registry:
            # We handle the continuation ourselves: look for it now instead of waiting
            # for the notification round trip.
            self._policy.more_may_wait()
            self._wake.set()

    def _slot_freed(self, was_full: bool) -> None:
        """A run gave its slot back: start a run claimed ahead (also while a stop drains),
        and wake the loop if it may claim."""
        if not self._shutdown.forced:
            run = self._slots.next_waiting()
            if run is not None:
                self._launch(run)
                if not self._slots.room_ahead():
                    return  # enough claimed ahead: no claim yet
        if not self._shutdown.requested and (self._policy.more or was_full):
            self._wake.set()

    # -- the loop --------------------------------------------------------------------

    async def _loop(self) -> None:
        """Until a stop is requested: claim what the free slots take and start a run per
        job, then wait for a reason to claim again (a hint, a reconnect, a freed slot, a
        timer). A failed pass is retried after a backoff; a ConfigurationError (the
        tables are gone) stops the worker."""
        errors = Backoff(_ERROR_BACKOFF_FIRST, _ERROR_BACKOFF_MAX)
        # An outage (a database restarting, backends terminated) fails pass after pass:
        # one line when it starts, one a minute while it lasts, one when it ends.
        failures = OutageLog(logger, "worker loop", interval=60.0, tracebacks=False)
        while not self._shutdown.requested:
            # Cleared before claiming, so a reason arriving meanwhile is kept.
            self._wake.clear()
            try:
                sleep = await self._claim_and_start()
                errors.reset()
                failures.succeeded()
            except ConfigurationError as exc:
                logger.error("worker stopped: %s", exc, extra={"worker_id": self.worker_id})
                raise
            except Exception:
                sleep = min(errors.next(), self.poll_interval)
                failures.failed(f"retrying in {sleep:.1f}s", worker_id=self.worker_id)
            if self._shutdown.requested:
                break
            if sleep is None:
                if self._slots.free() > 0:
                    continue  # a slot freed during the claim: nothing else would wake us
                sleep = self._policy.poll_timeout()  # all slots busy: a freed one wakes us
            await self._wait_for_reason(sleep)

    async def _claim_and_start(self) -> float | None:
        """One pass: claim up to the free slots (and ahead), if the wake policy says jobs
        may wait, and start a run per job claimed. Returns how long to sleep when fewer
        jobs came than asked for (``None``: no sleep of the policy's, claim again)."""
        # Draining a backlog (the last claim was full): claim ahead too if asked to.
        backlog = self.settings.claim_ahead and self._policy.more and not self._shutdown.requested
        limit = max(self._slots.free(), 0) + (self._slots.room_ahead() if backlog else 0)
        if limit <= 0:
            return None
        # Not claiming (the wake budget says the jobs are taken) sleeps as after an
        # empty claim: until the next due job.
        claim = await self._policy.should_claim()
        claimed_at = asyncio.get_running_loop().time()
        assert self._claimer is not None
        records = await self._claimer.claim(limit) if claim else []
        for record in records:
            self._start(record, claimed_at)
        self._policy.claimed((r.type_name for r in records), len(records), limit)
        await self._subscriptions.claimed(self._slots.free())
        if len(records) < limit:
            return await self._policy.idle_timeout(acquired=bool(records), claimed=claim)
        return None

    async def _wait_for_reason(self, seconds: float) -> None:
        """Sleep until a wake (hint, reconnect, freed slot, stop), ``seconds`` at most."""
        try:
            async with asyncio.timeout(seconds):  # no task per wait, unlike wait_for
                await self._wake.wait()
        except TimeoutError:  # the poll interval or the next due job (see WakePolicy)
            self._policy.poll_timer_fired()

    # -- running one job -------------------------------------------------------------

    def _start(self, record: JobRecord, claimed_at: float) -> None:
        run = JobRun.claimed(record, worker_id=self.worker_id)
        if run is None:
            return
        self._leases.granted(run, claimed_at)
        if self._slots.free() > 0:
            self._slots.take(run)
            self._launch(run)
        else:
            self._slots.wait(run)  # claimed ahead: starts once a slot frees

    def _launch(self, run: JobRun) -> None:
        """Run ``run`` (it holds a slot) in a task of its own."""
        assert self._execution is not None
        name = f"queuert-job-{run.job.id}"
        run.task = asyncio.create_task(self._execution.execute(run), name=name)
        run.task.add_done_callback(lambda _: self._slot_freed(self._slots.remove(run)))

    def _release_slot(self, run: JobRun) -> None:
        """The handler finished: let another job start while this one's outcome is written."""
        if run.holds_slot:
            self._slot_freed(self._slots.release(run))

    def _on_loop_lag(self, lag: float, job_ids: frozenset[str]) -> None:
        running = warn_blocked(lag, job_ids, worker_id=self.worker_id)
        self._emit("loop_blocked", lag=lag, job_ids=running)
