"""Repeating a start whose connection was lost, without starting any chain twice.

A connection lost while COMMIT was in flight leaves open whether the start was
written. The client makes the chain ids before the first attempt, so the repeat can
read by id what the lost attempt did.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from sqlalchemy.exc import IntegrityError

from state_adapters.model import NewChain, StartedChain
from state_adapters.notifications import NotificationBuffer
from state_adapters.protocol import StateAdapter

logger = logging.getLogger(__name__)


async def start_again(
    state: StateAdapter, chains: Sequence[NewChain], notes: NotificationBuffer
) -> list[StartedChain]:
    """Repeat a start whose connection was lost, starting no chain twice.

    The chains keep the ids the lost attempt used, and that attempt wrote every
    chain it created in one transaction: all of them are stored (its COMMIT
    succeeded) or none is. One read by id tells which: none found, start them now
    under the same ids; found, return what the lost attempt returned.
    """
    answer = await _answer_of_lost_start(state, chains, notes)
    if answer is not None:
        return answer
    try:
        return await state.start_chains(chains, notes=notes)
    except IntegrityError:
        # Our ids are taken: the lost attempt's COMMIT reached the server only after
        # the read above (a proxy kept it going), and the insert waited for it.
        answer = await _answer_of_lost_start(state, chains, notes)
        if answer is None:
            raise
        return answer


async def _answer_of_lost_start(
    state: StateAdapter, chains: Sequence[NewChain], notes: NotificationBuffer
) -> list[StartedChain] | None:
    """What a start whose COMMIT succeeded unseen returned, or ``None`` when none of
    its chains is stored (it did not commit, or it only deduplicated).

    A chain it created is returned with ``deduplicated=False``, and its wakeup,
    lost with the connection, is owed again while the job is pending. A chain it
    did not create had a dedup key and was deduplicated: that key is asked again,
    which returns the chain holding it now (the one the lost attempt returned,
    unless that chain finished or was deleted meanwhile).
    """
    stored = {chain.id: chain for chain in await state.get_chains([c.id for c in chains if c.id])}
    if not stored:
        return None
    logger.info(
        "a start lost its connection after its COMMIT succeeded; returning its chains",
        extra={"chain_ids": list(stored)},
    )
    for chain in stored.values():
        if chain.status == "pending":
            notes.job_scheduled(chain.last_job.type_name)
    deduplicated = [c for c in chains if c.id not in stored and c.dedup_key is not None]
    asked_again = iter(await state.start_chains(deduplicated, notes=notes) if deduplicated else ())
    # A chain without a dedup key that is not stored was created and deleted since.
    return [
        StartedChain(str(chain.id), chain.job.type_name, deduplicated=False)
        if chain.id in stored or chain.dedup_key is None
        else next(asked_again)
        for chain in chains
    ]
