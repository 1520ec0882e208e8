"""Whether a worker's next pass claims, and how long it sleeps when it does not.

A notification is a hint that costs one ``consume_wake_hint`` call; SQL is queried only
when the wake budget grants it, so a burst of n jobs wakes about n workers and a spent
budget keeps the rest of a crowd away from SQL.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime
from typing import Literal

from queuert_notify.notify.protocol import NotifyAdapter
from queuert_notify.worker.wake.bounds import CALL_LIMIT, CallGate
from state_adapters.outage_log import OutageLog

logger = logging.getLogger(__name__)

MIN_IDLE_SLEEP = 0.01
"""Floor of a sleep computed from a due time, so clock skew cannot make a hot loop."""
CLAIMER_GRACE = 0.25
"""Seconds a due job announced to another worker may stay pending before this one,
told by the wake budget that it has a claimer, looks again."""
HINT_RETRY = 1.0
"""Seconds between calls to a wake budget that failed or did not answer within
:data:`~queuert_notify.worker.wake.bounds.CALL_LIMIT` (every hint counts as granted
meanwhile)."""

Next = Literal["ask", "claim", "check_due"]


class WakePolicy:
    """The claim decision of one worker, as a small state machine.

    ``next`` says what the next pass with a free slot does:

    =========  =================================================================
    ``ask``    ask the wake budget once per announcement heard with a slot free
               since the last pass, then of each type in ``recheck`` (announced
               while every slot was busy, or run by a claim that filled the last
               slot); claim if one unit is granted; if every one is spent, do not
               claim (the jobs have claimers); with nothing to ask, claim
    ``claim``  claim
    ``check``  claim only if a job is due now (``check_due``)
    =========  =================================================================

    and ``more`` (a claim may find more work) makes any pass claim.

    ==================================  ===============================================
    event                               transition
    ==================================  ===============================================
    an announcement, a slot free        the loop wakes; its pass asks (above)
    an announcement, every slot busy    its type joins ``recheck``
    a pass claims anyway (next =        each announcement since the last pass is asked
    claim, more) after announcements    in a task of its own; a grant: next = claim
    the poll timer fires                next = claim, unless next is check_due
    a reconnect, a reap that returned   more = True
    jobs, our own continuation
    a claim fills all of >1 slots       more = True
    a claim fills the only free slot    more = False; its types join ``recheck``
    a claim leaves slots free           more = False; ``recheck`` emptied
    a due job while the budget is       next = check_due (unless claim), sleep
    spent (:meth:`idle_timeout`)        ``CLAIMER_GRACE``
    a pass decides (:meth:`should_      next = ask
    claim`)
    ==================================  ===============================================
    """

    def __init__(
        self,
        notify: NotifyAdapter,
        next_due_at: Callable[[], Awaitable[datetime | None]],
        wake: asyncio.Event,
        *,
        poll_interval: float,
        jitter: float,
        worker_id: str,
    ) -> None:
        self._notify = notify
        self._next_due_at = next_due_at
        self._wake = wake
        self._poll_interval = poll_interval
        self._jitter = jitter
        self._worker_id = worker_id
        self.next: Next = "ask"
        self.more = False
        self._recheck: set[str] = set()
        self._announced: list[str] = []
        """The announcements heard with a slot free since the last pass, one entry each
        (a lists-mode announcement is a token, each granted by its own ask)."""
        self._due_streak = 0
        self._hint_gate = CallGate(CALL_LIMIT, HINT_RETRY)
        self._hint_outage = OutageLog(logger, "consume_wake_hint")
        self._hint_tasks: set[asyncio.Task[None]] = set()

    # -- events ----------------------------------------------------------------------

    def poll_timer_fired(self) -> None:
        if self.next != "check_due":
            self.next = "claim"

    def more_may_wait(self) -> None:
        self.more = True

    def announced(self, type_name: str, free_slots: int) -> None:
        """Jobs of ``type_name`` became pending. With a free slot, wake the loop: its
        next pass asks the wake budget for one unit before it claims. With none, leave
        the hint to an idle worker and ask when a slot frees.

        The loop asks itself, not a task per announcement: the budget's answer resumes
        the loop, which claims at once (from a task, the grant would be handed over to
        the loop: one more pass of the event loop between the budget and the claim)."""
        if free_slots <= 0:
            self._recheck.add(type_name)
            return
        self._announced.append(type_name)
        self._wake.set()

    def tasks(self) -> set[asyncio.Task[None]]:
        """The wake-budget requests under way (cancelled when the worker stops)."""
        return set(self._hint_tasks)

    def _ask_later(self, type_name: str) -> None:
        """Ask for one unit in a task of its own (the pass claims meanwhile); a grant
        makes the next pass claim."""
        task = asyncio.create_task(self._consume_hint(type_name))
        self._hint_tasks.add(task)
        task.add_done_callback(self._hint_tasks.discard)

    async def _consume_hint(self, type_name: str) -> None:
        if await self.hint_granted(type_name):
            self.next = "claim"
            self._wake.set()

    def claimed(self, type_names: Iterable[str], got: int, free: int) -> None:
        """A claim of ``free`` slots got ``got`` jobs (of ``type_names``)."""
        full = got == free
        # Several slots filled: more may be waiting, look again when a slot frees. One
        # slot filled says nothing: ask the wake budget first.
        self.more = full and free > 1
        if not full:
            self._recheck.clear()  # every due job of our types is claimed
        elif free == 1:
            self._recheck.update(type_names)

    # -- decisions -------------------------------------------------------------------

    async def should_claim(self) -> bool:
        """Whether this pass claims (see the class docstring)."""
        decided, self.next = self.next, "ask"
        announced, self._announced = self._announced, []
        if decided == "claim" or self.more:
            # Not held up by the budget: it is asked meanwhile, as every announcement
            # is (a lists-mode token is acknowledged once granted).
            for type_name in announced:
                self._ask_later(type_name)
            return True
        if announced and await self._any_granted(announced):
            return True
        if decided == "check_due":
            due = await self._next_due_at()
            return due is not None and _aware(due) <= datetime.now(UTC)
        for type_name in sorted(self._recheck):
            if await self.hint_granted(type_name):
                return True
        if self._recheck or announced:
            self._recheck.clear()  # spent: every announced job has a claimer
            return False
        return True

    async def _any_granted(self, type_names: list[str]) -> bool:
        """Ask once per entry, all at once; whether any unit was granted."""
        if len(type_names) == 1:
            return await self.hint_granted(type_names[0])
        return any(await asyncio.gather(*(self.hint_granted(t) for t in type_names)))

    async def hint_granted(self, type_name: str) -> bool:
        """Ask the wake budget for one unit of ``type_name``. Unknown counts as granted
        (wake rather than miss), and so does an answer that takes longer than
        ``CALL_LIMIT`` (a hanging server); while the budget cannot be reached, it is
        asked at most once per ``HINT_RETRY`` (a failing call costs the client's
        retries, ~0.4 s for redis-py, which would otherwise slow every claim down)."""
        if not self._hint_gate.open:
            return True
        try:
            async with asyncio.timeout(self._hint_gate.limit):
                granted = await self._notify.consume_wake_hint(type_name)
        except Exception:
            self._hint_gate.failed()
            self._hint_outage.failed(
                "waking anyway", worker_id=self._worker_id, type_name=type_name
            )
            return True
        self._hint_outage.succeeded()
        return granted

    def poll_timeout(self) -> float:
        """The poll interval, spread by the jitter."""
        return self._poll_interval * random.uniform(1 - self._jitter, 1 + self._jitter)

    async def idle_timeout(self, *, acquired: bool, claimed: bool) -> float:
        """Seconds to sleep with free slots: until the next due job or the poll interval,
        whichever comes first (``claimed=False``: this pass skipped its claim because
        the wake budget is spent)."""
        timeout = self.poll_timeout()
        next_due = await self._next_due_at()
        if next_due is not None:
            until_due = (_aware(next_due) - datetime.now(UTC)).total_seconds()
            if until_due <= 0 and not claimed:
                # Due, but the spent budget says every announced job has a claimer: it
                # is being claimed right now. Give that claimer a moment, then claim
                # if a job is still due (one nobody announced, or a claimer gone).
                if self.next != "claim":
                    self.next = "check_due"
                until_due = CLAIMER_GRACE
            elif until_due <= 0 and not acquired:
                # Due but not claimable (another claimer holds it, or the clocks
                # disagree): back off a little more each time instead of spinning.
                self._due_streak += 1
                until_due = MIN_IDLE_SLEEP * 2 ** min(self._due_streak, 10)
            else:
                self._due_streak = 0
            timeout = min(timeout, until_due)
        return max(timeout, MIN_IDLE_SLEEP)


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
