"""Claims of limited job types: ``concurrency`` (running jobs of the type),
``key_concurrency`` (running jobs per ``concurrency_key``) and ``rate`` starts per
``per_seconds``, held across every worker and process.

Invariants:

- **Never exceeded.** The claims of one limited type run one after the other: each
  holds the type's control row (Postgres ``FOR UPDATE``; SQLite's one writer holds
  the database) from before it counts the running jobs until it commits, and it
  counts them on a snapshot taken after the lock was granted, so every claim
  committed before is counted; a completion only lowers the count. The running jobs
  are counted from the jobs themselves (no counter to drift), and a job whose lease
  expired counts until it is reaped.
- **The rate holds in every window.** The control row keeps the starts of the last
  ``per_seconds`` (:class:`RateWindow`); a claim starts at most ``rate`` minus the
  starts after ``now - per``. Each claim so bounds the window ending at
  its own instant, and every window of length ``per`` lies within such a window
  ending at the last claim inside it. Instants are taken once the lock is held and
  never go back (a claimer whose clock is behind records the newest instant
  instead); starts are recorded at the end of their step of ``per / RATE_STEPS``,
  never before they happened, so the window stays small (:data:`RATE_STEPS`). A
  token bucket would allow twice the rate across a window boundary.
- **No head-of-line blocking, keys served round robin.** With ``key_concurrency``
  the claim walks the type's keys that have pending jobs, one index probe per key,
  starting after the key it served last (stored in the row), and takes each key's
  best due job while the key is below its cap; when every visited key with
  capacity got one and slots remain, it goes round again for second jobs. A key at
  its cap costs one probe, whatever waits behind it. Jobs without a key form one
  key of their own, served where the walk wraps around.
- **Bounded.** A claim visits at most :data:`MAX_KEYS_VISITED` keys; the ones it did
  not reach are first in line for the next claim.

Where it runs differs, for the round trips: on Postgres the claim is one call of
the PL/pgSQL function ``{prefix}claim_limited`` (migration 0007), in autocommit: each
statement of a VOLATILE function takes a new snapshot, so the count after the lock
sees the claims committed while it waited, and the lock, the count, the key walk,
the claim and the saved window cost one round trip instead of six or more. On
SQLite, :func:`claim_type` here runs the same steps as statements of the write
transaction it is given (the claim joins the completions' transaction), reading the
control row and the running jobs in one statement and writing the row back only when
it changed. Both read their outcome with :func:`settled`; the conformance cases in
``queuert_notify.testing.state_cases.controls`` hold both to the same behaviour.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from state_adapters.model import JobRecord
from state_adapters.statements.limited_claims import LimitedClaimStatements

if TYPE_CHECKING:
    from state_adapters.database import Conn

RATE_STEPS = 64
"""A claim's starts are recorded at the end of the ``1/RATE_STEPS`` of ``per`` they
fall in (seconds since the epoch, on that grid), together with the other starts of
that step: the window keeps at most ``RATE_STEPS`` entries and the newest step however
many claims it saw (one entry per claim made every claim read and write thousands),
and a start is never recorded before it happened, so the rate still holds; it only
leaves the window up to ``per / RATE_STEPS`` late."""
MAX_KEYS_VISITED = 2_000
"""Most concurrency keys one claim looks at."""
RECHECK = timedelta(seconds=2)
"""How soon a worker looks again at jobs held back by ``concurrency`` or
``key_concurrency`` without a wake-up (the completion that frees a slot wakes one
at once; this covers a wake-up lost with the notify server)."""
_KEYS_SLACK = 16
"""Keys walked beyond the free slots and the keys at their cap, for keys whose jobs
are not due yet."""
_UNKEYED = ""
"""``next_key_after`` once the jobs without a key were served (keys are non-empty)."""


@dataclass
class LimitedClaim:
    """What one claim of a limited type did."""

    jobs: list[JobRecord] = field(default_factory=list)
    retry_at: datetime | None = None
    """When jobs it held back may be claimed without a wake-up (a rate window frees);
    ``None``: a completion's wake-up frees them, or none were held back."""
    uncontrolled: bool = False
    """The type is no longer paused or limited: claim it the plain way."""
    held: bool = False
    """``concurrency`` or ``key_concurrency`` held jobs back: the completions that free
    slots are worth a wake-up."""


def settled(
    jobs: list[JobRecord],
    *,
    limit: int,
    budget: int,
    rate_bound: bool,
    frees_at: datetime | None,
    keyed: bool,
    picked: int,
    now: datetime,
) -> LimitedClaim:
    """What a claim asked for ``limit`` jobs did, given the ``budget`` its limits
    left it (``rate_bound``: the rate cut it, and ``frees_at`` is when the window's
    oldest start leaves it), the jobs it claimed and, with ``key_concurrency``
    (``keyed``), how many the key walk ``picked``; ``now`` is the claim's instant."""
    if budget <= 0:
        if rate_bound:
            return LimitedClaim(retry_at=frees_at)
        return LimitedClaim(retry_at=now + RECHECK, held=True)
    retry_at = None
    held = budget < limit and not rate_bound  # cut by concurrency
    if rate_bound and len(jobs) == budget:
        retry_at = frees_at
    elif keyed and picked < budget:
        retry_at, held = now + RECHECK, True  # keys at their cap may hold jobs back
    return LimitedClaim(jobs, retry_at, held=held)


async def claim_type(
    sql: LimitedClaimStatements,
    conn: Conn,
    type_name: str,
    *,
    worker_id: str,
    leased_until: datetime,
    limit: int,
    now: datetime,
) -> LimitedClaim:
    """Claim up to ``limit`` due jobs of ``type_name`` within its limits, in the
    SQLite write transaction ``conn`` (see the module docstring)."""
    control = (await conn.execute(*sql.read_control(type_name))).first()
    if control is None or not _limited(control):
        return LimitedClaim(uncontrolled=control is None or not control.paused)
    if control.paused:
        return LimitedClaim()
    # The claim's instant is taken once the database is held, so that the claims of
    # one type are in the order of their instants (the rate's window needs that).
    locked_at = datetime.now(UTC)
    if locked_at > now:
        leased_until += locked_at - now
        now = locked_at
    running: dict[str | None, int] = {key or None: n for key, n in control.running}
    budget = limit
    if control.concurrency is not None:
        budget = min(budget, control.concurrency - sum(running.values()))
    window = RateWindow.of(control, now)
    rate_bound = window is not None and window.allowance < budget
    if window is not None:
        budget = min(budget, window.allowance)
    jobs: list[JobRecord] = []
    ids: list[str] = []
    next_key_after = control.next_key_after
    if budget > 0 and control.key_concurrency is None:
        claimed = await conn.execute(
            *sql.claim_best(
                type_name, budget, worker_id=worker_id, leased_until=leased_until, now=now
            )
        )
        jobs = [JobRecord(*row) for row in claimed.all()]
    elif budget > 0:
        walk = KeyWalk(sql, conn, type_name, control.key_concurrency, running, now)
        ids, next_key_after = await walk.pick(budget, control.next_key_after)
        if ids:
            claimed = await conn.execute(
                *sql.claim_ids(ids, worker_id=worker_id, leased_until=leased_until)
            )
            jobs = [JobRecord(*row) for row in claimed.all()]
    if window is not None and jobs:
        window.started(len(jobs))
    if (window is not None and window.changed) or next_key_after != control.next_key_after:
        await conn.execute(*sql.save_state(type_name, window, next_key_after))
    return settled(
        jobs,
        limit=limit,
        budget=budget,
        rate_bound=rate_bound,
        frees_at=None if window is None else window.frees_at(),
        keyed=control.key_concurrency is not None,
        picked=len(ids),
        now=now,
    )


def _limited(control: Any) -> bool:
    return (
        control.concurrency is not None
        or control.key_concurrency is not None
        or control.rate is not None
    )


def forgotten_starts(
    old_rate: int | None, old_per: float | None, rate: int | None, per: float | None
) -> int:
    """Starts to count, at a change of limits, for the ones the window has forgotten.

    The window keeps the starts of the last ``old_per`` only; when ``per`` grows, the
    starts between ``per`` and ``old_per`` ago are gone. They are counted as the old
    limits allowed them at most (``old_rate`` per ``old_per``), recorded in the newest
    step: every forgotten start happened before it, so they leave the window no later
    than the starts they stand for. So a window of the new ``per`` never holds more
    than the larger of the new rate and what the old limits allowed in it; the price is
    that a type that did not use its old rate in full waits up to one new ``per``
    longer after the change."""
    if old_rate is None or old_per is None or rate is None or per is None or per <= old_per:
        return 0
    return old_rate * math.ceil((per - old_per) / old_per)


class RateWindow:
    """The starts of one type in the last ``per`` seconds, recorded per step of
    ``per / RATE_STEPS`` at the step's end (seconds since the epoch).

    The newest step is kept in two numbers, ``step_at`` and ``step_starts``, and the
    earlier steps of the window as ``[instant, starts]`` pairs with their sum,
    ``earlier_starts``: a claim within the newest step reads and changes numbers only.
    The first claim of a later step folds the newest step into the earlier ones and
    drops the entries that left the window; that holds for the whole step, as the
    instants lie on the steps' grid (an entry is kept while any instant of the step
    could still count it). A claimer whose clock is behind the newest step counts as
    starting in it."""

    def __init__(
        self,
        rate: int,
        per: float,
        *,
        entries: list[list[float]],
        earlier_starts: int,
        step_at: float | None,
        step_starts: int,
        now: float,
    ) -> None:
        self.rate = rate
        self.per = per
        step = per / RATE_STEPS
        at = math.ceil(now / step) * step
        self.folded = step_at is None or at > step_at
        """Whether this claim began a step (then the earlier entries are saved too)."""
        if self.folded:
            if step_at is not None and step_starts:
                entries = [*entries, [step_at, step_starts]]
            cut = at - step - per
            entries = [e for e in entries if e[0] > cut]
            earlier_starts = int(sum(e[1] for e in entries))
            step_at, step_starts = at, 0
        self.entries = entries
        self.earlier_starts = earlier_starts
        self.step_at: float = step_at if step_at is not None else at
        self.step_starts = step_starts
        self.changed = self.folded
        """Whether it differs from the stored window (then it is saved)."""

    @classmethod
    def of(cls, control: Any, now: datetime) -> RateWindow | None:
        if control.rate is None or control.per_seconds is None:
            return None
        return cls(
            control.rate,
            control.per_seconds,
            entries=control.recent_starts if isinstance(control.recent_starts, list) else [],
            earlier_starts=control.earlier_starts,
            step_at=control.step_at,
            step_starts=control.step_starts,
            now=now.timestamp(),
        )

    @property
    def allowance(self) -> int:
        """Starts allowed now."""
        return max(0, self.rate - self.earlier_starts - self.step_starts)

    def started(self, count: int) -> None:
        """Record ``count`` starts in the newest step."""
        self.step_starts += count
        self.changed = True

    def frees_at(self) -> datetime:
        """When the oldest start leaves the window (then at least one more may start)."""
        oldest = self.entries[0][0] if self.entries else self.step_at
        return datetime.fromtimestamp(oldest + self.per, UTC)


class KeyWalk:
    """The round-robin pick of due jobs across concurrency keys (module docstring)."""

    def __init__(
        self,
        sql: LimitedClaimStatements,
        conn: Conn,
        type_name: str,
        key_concurrency: int,
        running: dict[str | None, int],
        now: datetime,
    ) -> None:
        self._sql = sql
        self._conn = conn
        self._type = type_name
        self._cap = key_concurrency
        self._running = running
        self._now = now
        self._stretches: list[tuple[str, int, str | None]] = []
        """The walked stretches of keys: (after, how many, up to and including)."""

    async def pick(self, budget: int, after: str | None) -> tuple[list[str], str | None]:
        """Up to ``budget`` job ids, and the key to start after next time."""
        at_cap = sum(1 for k, n in self._running.items() if k is not None and n >= self._cap)
        chunk = min(budget + at_cap + _KEYS_SLACK, MAX_KEYS_VISITED)
        order: list[str | None] = []  # keys in visit order; None: the jobs without a key
        heads: dict[str | None, str | None] = {}
        start: str = after if after is not None else _UNKEYED
        if after is None:
            order.append(None)
        cursor, wrapped, visited = start, False, 0
        while visited < MAX_KEYS_VISITED:
            bound = after if wrapped else None
            rows = await self._walk(cursor, chunk, 0, bound)
            self._stretches.append((cursor, chunk, bound))
            for key, job_id in rows:
                order.append(key)
                heads[key] = job_id
            visited += chunk
            eligible = sum(1 for k in order if k is not None and heads.get(k) and self._free(k))
            if eligible >= budget:
                break
            if len(rows) == chunk:
                cursor = rows[-1][0]
                continue
            if wrapped or after is None:
                break  # every key was visited
            wrapped, cursor = True, _UNKEYED
            order.append(None)
        unkeyed: list[str] = []
        if None in order and self._free(None):
            found = await self._conn.execute(
                *self._sql.unkeyed_due(self._type, min(self._free(None), budget), self._now)
            )
            unkeyed = [row.id for row in found.all()]
        picked: list[str] = []
        last: str | None = after
        for round_ in range(self._cap):
            took = False
            if round_ > 0:
                heads = await self._heads(round_)
            for visit in order:
                if len(picked) >= budget:
                    return picked, last
                if visit is None:
                    job_id = unkeyed[round_] if round_ < len(unkeyed) else None
                else:
                    job_id = heads.get(visit)
                if job_id is None or self._free(visit) <= round_:
                    continue
                picked.append(job_id)
                last, took = (_UNKEYED if visit is None else visit), True
            if not took or len(picked) >= budget:
                break
        # Slots left: every key visited had its turn; start the next claim after them.
        if order:
            last = _UNKEYED if order[-1] is None else order[-1]
        return picked, last

    def _free(self, key: str | None) -> int:
        return max(0, self._cap - self._running.get(key, 0))

    async def _walk(
        self, after: str, keys: int, offset: int, up_to: str | None
    ) -> list[tuple[str, str | None]]:
        query = self._sql.walk_keys(
            self._type, after=after, keys=keys, offset=offset, now=self._now
        )
        rows = [(row.key, row.job_id) for row in (await self._conn.execute(*query)).all()]
        if up_to is not None:
            rows = [(k, j) for k, j in rows if k <= up_to]
        return rows

    async def _heads(self, offset: int) -> dict[str | None, str | None]:
        """Each walked key's due job at ``offset``."""
        heads: dict[str | None, str | None] = {}
        for after, keys, up_to in self._stretches:
            for key, job_id in await self._walk(after, keys, offset, up_to):
                heads[key] = job_id
        return heads


def earliest(moments: Sequence[datetime | None]) -> datetime | None:
    """The earliest of the given instants (``None`` for none)."""
    known = [m for m in moments if m is not None]
    return min(known) if known else None
