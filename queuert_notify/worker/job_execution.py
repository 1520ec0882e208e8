"""Running one claimed job: its context, its handler under the lease (watched for a
lost lease), and its outcome written. The per-job part of the worker; the loop
(:mod:`queuert_notify.worker.worker`) only claims and hands each run over."""

from __future__ import annotations

from queuert_notify.client.client import Client
from queuert_notify.events import EventEmitter
from queuert_notify.job_logs.attempt_log import running_attempt
from queuert_notify.jobs import HandlerRegistry, JobContext
from queuert_notify.notify.protocol import Unsubscribe
from queuert_notify.observe import instrumentation
from queuert_notify.worker.job_outcome import OutcomeWriter
from queuert_notify.worker.job_run import JobRun
from queuert_notify.worker.lease_keeper import LeaseKeeper
from queuert_notify.worker.settings import WorkerSettings
from queuert_notify.worker.wake.subscriptions import WakeSubscriptions
from state_adapters.model import JobLogLine


class JobExecution:
    """Runs a worker's claimed jobs, one :meth:`execute` per run: a handler runs only
    while its run holds the lease, its context ends (the atomic session closed, the
    ownership-loss subscription dropped) however it ends, and its outcome is written
    through ``outcomes``."""

    def __init__(
        self,
        client: Client,
        registry: HandlerRegistry,
        settings: WorkerSettings,
        *,
        subscriptions: WakeSubscriptions,
        leases: LeaseKeeper,
        outcomes: OutcomeWriter,
        emit: EventEmitter,
    ) -> None:
        self.client = client
        self.registry = registry
        self.worker_id = settings.worker_id
        self.lease = settings.lease
        self.mode = settings.mode
        self.handler_timeout = settings.handler_timeout
        self._subscriptions = subscriptions
        self._leases = leases
        self._outcomes = outcomes
        self._logs = outcomes.logs
        self._emit = emit
        self._no_session_reason = (
            "ctx.session exists only in atomic mode; this worker runs in staged mode "
            "(Worker(..., mode='atomic') to write in the completion's transaction)"
            if self.mode == "staged"
            else f"ctx.session needs a state adapter with handler transactions; "
            f"{type(client.state).__name__} has none"
        )

    async def execute(self, run: JobRun) -> None:
        job = run.job
        run.trace = instrumentation.active().running(job, run.trace_context)
        log = self._logs.open(job.id, job.attempt)
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
            log=log,
            trace=run.trace,
        )
        self._emit("started", job)
        # JobLogHandler finds the attempt through this, in the handler's task or thread.
        logging_to = running_attempt.set(log)
        unsubscribe: Unsubscribe | None = None
        unwritten: list[JobLogLine] = []

        def lost() -> None:
            self._leases.check_ownership(run)

        try:
            with run.trace:
                # The worker's one listener for every job's loss: a table entry, no await.
                if not self._subscriptions.watch_ownership_loss(job.id, lost):
                    unsubscribe = await self._subscriptions.listen_for_ownership_loss(job, lost)
                result, error = await run.run_handler(
                    run.trace.handling(lambda: self.registry.call(run.job, ctx)),
                    self.handler_timeout,
                )
                running_attempt.reset(logging_to)
                lines = self._logs.close_attempt(log)
                unwritten = await self._outcomes.finish(run, ctx, result, error, lines)
        finally:
            if running_attempt.get() is log:
                running_attempt.reset(logging_to)
            if run.checks:
                await run.cancel_checks()
            if ctx.transaction is not None and ctx.transaction.opened:
                await ctx.transaction.close()
            if unsubscribe is None:
                self._subscriptions.forget_ownership_loss(job.id, lost)
            else:
                await self._subscriptions.stop_listening_for_ownership_loss(unsubscribe)
            # However the run ended, its lines are written (with its outcome if any), once
            # the handler's transaction is closed (on SQLite it may hold the write lock).
            left = unwritten + self._logs.close_attempt(log)
            if left:
                await self._logs.write(left)
