"""A worker's subscriptions to its notify adapter, for the worker's whole lifetime."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import TYPE_CHECKING

from queuert_notify.errors import NotifyAdapterClosedError
from queuert_notify.notify.protocol import NotifyAdapter, Unsubscribe
from queuert_notify.worker.wake.bounds import CALL_LIMIT, SUBSCRIBE_LIMIT, CallGate
from state_adapters.backoff import Backoff
from state_adapters.outage_log import OutageLog

if TYPE_CHECKING:
    from queuert_notify.jobs import Job

logger = logging.getLogger(__name__)

_RESUBSCRIBE_FIRST_DELAY, _RESUBSCRIBE_MAX_DELAY = 0.1, 5.0
_CALL_PAUSE = 5.0
"""Seconds an acknowledgement or an ownership listen is skipped after one failed."""


class WakeSubscriptions:
    """Job-scheduled notifications for the worker's types and ``on_reconnect``,
    subscribed once and kept until :meth:`close`; per-job ownership listening.

    Each run listens for its job's ownership loss (:meth:`listen_for_ownership_loss`)
    and leaves when it ends (:meth:`stop_listening_for_ownership_loss`). Where the
    adapter has one channel for every job's loss (``listen_every_job_ownership_lost``),
    the worker listens on it once, at :meth:`open`, and a run only enters and leaves a
    table keyed by job id (:meth:`watch_ownership_loss`, :meth:`forget_ownership_loss`:
    no adapter call, nothing to await or bound, per run). Otherwise (Redis
    Cluster's channel per job, an adapter without it) each run listens on its own.

    When the notify adapter does not answer at :meth:`open`, :meth:`open_later` keeps
    trying with backoff and calls ``on_reconnect`` once it succeeds (jobs may have been
    announced meanwhile); until then :attr:`listening` is False and per-job
    ownership listening is skipped (lease renewal fences the run all the same).

    After every claim pass :meth:`claimed` tells the adapter the wakes it granted are
    used and how many slots are free (``acknowledge_wakes``: durable wake tokens are
    acknowledged, and no more are taken than the worker has slots for).

    Every call to the adapter is bounded (:mod:`queuert_notify.worker.wake.bounds`): one that
    does not answer in time counts as failed, and a failed acknowledgement or ownership
    listen is not tried again for ``_CALL_PAUSE`` seconds, so an adapter that hangs
    never holds the claim path or a run for longer than one bounded wait per pause.
    """

    def __init__(
        self,
        notify: NotifyAdapter,
        type_names: Sequence[str],
        *,
        on_scheduled: Callable[[str], None],
        on_reconnect: Callable[[], None],
        worker_id: str,
    ) -> None:
        self._notify = notify
        self._type_names = type_names
        self._on_scheduled = on_scheduled
        self._on_reconnect = on_reconnect
        self._worker_id = worker_id
        self._held: list[Unsubscribe] = []
        self._retrying: asyncio.Task[None] | None = None
        self._owls_outage = OutageLog(logger, "listening for ownership loss")
        self._ack_outage = OutageLog(logger, "acknowledging wakes")
        self._ack_gate = CallGate(CALL_LIMIT, _CALL_PAUSE)
        self._owls_gate = CallGate(CALL_LIMIT, _CALL_PAUSE)
        self._every_job = False
        """Whether one listener, held with the others, hears every job's loss."""
        self._watched: dict[str, list[Callable[[], None]]] = {}
        """Job id -> the callbacks of its runs here (two runs of one job may overlap:
        a run that lost its lease still writes while the job runs again)."""

    @property
    def listening(self) -> bool:
        """Whether the subscriptions are in place."""
        return bool(self._held)

    async def open(self) -> None:
        """Subscribe; raises what the notify adapter raised (nothing is left held)."""
        notify = self._notify
        held: list[Unsubscribe] = []
        try:
            async with asyncio.timeout(SUBSCRIBE_LIMIT):
                held.append(await notify.listen_job_scheduled(self._type_names, self._on_scheduled))
            every_job = await self._listen_every_job()
            if every_job is not None:
                held.append(every_job)
            held.append(notify.on_reconnect(self._on_reconnect))
        except BaseException:
            for unsubscribe in held:
                with suppress(Exception):
                    async with asyncio.timeout(CALL_LIMIT):
                        await unsubscribe()
            raise
        self._held = held
        self._every_job = every_job is not None

    async def _listen_every_job(self) -> Unsubscribe | None:
        """The one listener for every job's ownership loss, or ``None``: runs listen
        one by one (the adapter has no such channel, or it failed: the wakeups are in
        place, so the worker does not poll for it)."""
        try:
            async with asyncio.timeout(SUBSCRIBE_LIMIT):
                return await self._notify.listen_every_job_ownership_lost(self._on_job_lost)
        except Exception as exc:
            logger.info(
                "listening for ownership loss per run: %s",
                exc if str(exc) else repr(exc),
                extra={"worker_id": self._worker_id},
            )
            return None

    def _on_job_lost(self, job_id: str) -> None:
        for callback in self._watched.get(job_id, ()):
            callback()

    async def open_or_poll(self, *, required: bool, poll_interval: float) -> None:
        """:meth:`open`; when the notify adapter does not answer, keep trying in the
        background (the worker polls every ``poll_interval`` meanwhile), unless
        ``required`` (the client's ``require_notify``) or the adapter is closed: then
        raise what it raised."""
        try:
            await self.open()
        except Exception as exc:
            if required or isinstance(exc, NotifyAdapterClosedError):
                raise
            logger.warning(
                "cannot listen for wakeups; polling every %.1fs until the notify "
                "adapter answers: %s",
                poll_interval,
                exc if str(exc) else repr(exc),
                extra={"worker_id": self._worker_id},
            )
            self.open_later()

    async def claimed(self, free_slots: int) -> None:
        """After a claim pass: the wakes consumed for it are used (durable adapters
        acknowledge them) and ``free_slots`` slots are free. A failure is logged; an
        unacknowledged wake costs at most one empty claim elsewhere."""
        if not self.listening or not self._ack_gate.open:
            return
        try:
            async with asyncio.timeout(self._ack_gate.limit):
                await self._notify.acknowledge_wakes(self._on_scheduled, free_slots)
        except Exception:
            self._ack_gate.failed()
            self._ack_outage.failed("a lost acknowledgement costs one empty claim")
        else:
            self._ack_outage.succeeded()

    def open_later(self) -> None:
        """Keep trying :meth:`open` in the background until it succeeds."""
        self._retrying = asyncio.create_task(self._open_when_reachable())

    def watch_ownership_loss(self, job_id: str, callback: Callable[[], None]) -> bool:
        """Enter ``job_id`` in the table the worker's one listener for every job's loss
        reads (no adapter call, nothing to await); False when there is no such listener,
        and the run listens on its own (:meth:`listen_for_ownership_loss`)."""
        if not self._every_job:
            return False
        self._watched.setdefault(job_id, []).append(callback)
        return True

    async def listen_for_ownership_loss(
        self, job: Job, callback: Callable[[], None]
    ) -> Unsubscribe | None:
        """Where :meth:`watch_ownership_loss` found no listener for every job: call
        ``callback`` when another party takes ``job``, until
        :meth:`stop_listening_for_ownership_loss` with what this returned: the run's own
        unsubscribe, or ``None`` (not listening: the adapter is unreachable or refused)."""
        if not self.listening or not self._owls_gate.open:
            return None
        try:
            async with asyncio.timeout(self._owls_gate.limit):
                return await self._notify.listen_job_ownership_lost(job.id, callback)
        except Exception:
            self._owls_gate.failed()
            self._owls_outage.failed(
                "relying on lease renewal",
                job_id=job.id,
                type_name=job.type_name,
                attempt=job.attempt,
                worker_id=self._worker_id,
            )
            return None

    def forget_ownership_loss(self, job_id: str, callback: Callable[[], None]) -> None:
        """Undo :meth:`watch_ownership_loss` (nothing when it was not entered)."""
        callbacks = self._watched.get(job_id)
        if callbacks is not None and callback in callbacks:
            callbacks.remove(callback)
            if not callbacks:
                del self._watched[job_id]

    async def stop_listening_for_ownership_loss(self, unsubscribe: Unsubscribe) -> None:
        """Undo :meth:`listen_for_ownership_loss` (which returned ``unsubscribe``); never
        raises, and waits for the adapter at most one bounded call."""
        with suppress(Exception):
            async with asyncio.timeout(CALL_LIMIT):
                await unsubscribe()

    def background_task(self) -> asyncio.Task[None] | None:
        """The retrying task of :meth:`open_later`, for the worker to cancel."""
        return self._retrying

    async def close(self) -> None:
        """Unsubscribe everything (the retrying task is the worker's to cancel)."""
        held, self._held = self._held, []
        self._every_job = False
        for unsubscribe in held:
            try:
                async with asyncio.timeout(CALL_LIMIT):
                    await unsubscribe()
            except Exception:
                logger.warning("unsubscribe failed on worker stop", exc_info=True)

    async def _open_when_reachable(self) -> None:
        backoff = Backoff(_RESUBSCRIBE_FIRST_DELAY, _RESUBSCRIBE_MAX_DELAY)
        while True:
            await backoff.sleep()
            try:
                await self.open()
            except NotifyAdapterClosedError:
                return
            except Exception as exc:
                logger.debug("notify adapter still unreachable: %s", exc)
                continue
            logger.info(
                "notify adapter answers; listening for wakeups",
                extra={"worker_id": self._worker_id},
            )
            self._on_reconnect()
            return
