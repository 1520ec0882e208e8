"""The job logs part of the state seam (:class:`~state_adapters.protocol.StateAdapter`
includes it): writing the lines jobs log, and reading them back in order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from state_adapters.model import JobLogLine, LogPosition

if TYPE_CHECKING:
    from state_adapters.protocol import CallerSession


class JobLogStore(Protocol):
    async def append_job_logs(self, lines: Sequence[JobLogLine]) -> None:
        """Write log lines (of any jobs) in a transaction of the adapter's own, kept
        whatever becomes of the jobs' transactions. A job's last lines go with its
        ``Completion.log_lines`` instead (written only if the completion holds)."""
        ...

    async def job_logs(
        self, job_id: str, *, after: LogPosition | None = None, session: CallerSession = None
    ) -> list[JobLogLine]:
        """The job's log lines by attempt then ``seq``, those after ``(attempt, seq)`` if
        given; none (not an error) for an unknown job."""
        ...


class JobLogStoreBase:
    """For an adapter without a log store (in :class:`~state_adapters.protocol.
    StateAdapterBase`): lines are not kept, and a job's log reads empty."""

    async def append_job_logs(self, lines: Sequence[JobLogLine]) -> None:
        return None

    async def job_logs(
        self, job_id: str, *, after: LogPosition | None = None, session: CallerSession = None
    ) -> list[JobLogLine]:
        return []
