"""The seam an observer of the queue plugs into (``queuert_notify.otel`` is one).

The client and the worker report what they do to the active :class:`Instrumentation`:
each ``start_chains`` call, each run of a job and its outcome, each worker's lifetime.
The default, :data:`NO_INSTRUMENTATION`, answers every report with a shared object that
does nothing, so an uninstrumented queue imports nothing and allocates nothing for it.

An instrumentation must never raise into the queue and never block the event loop:
its methods run on the client's and the worker's paths.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Literal, TypeVar

if TYPE_CHECKING:
    from types import TracebackType

    from queuert_notify.client.chain_spec import ChainSpec
    from queuert_notify.jobs import Job
    from state_adapters.model import StartedChain
    from state_adapters.protocol import StateAdapter

T = TypeVar("T")

RunOutcome = Literal["completed", "retried", "failed", "ownership_lost", "abandoned"]
"""How a run ended, as the worker's events name it (see ``queuert_notify.events``)."""


class ChainsStart:
    """One ``start_chains`` call, used as a context manager around its write (which may
    raise). This base observes nothing."""

    trace_context: str | None = None
    """Stored with the first job of every chain the call starts."""

    def __enter__(self) -> ChainsStart:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        return None

    def started(self, chains: Sequence[StartedChain]) -> None:
        """The chains are written (committed, or in the caller's transaction)."""


class RunTrace:
    """One run of one job, used as a context manager from the handler's start until its
    outcome is written; the handler runs inside it (in its task, or its thread for a
    plain ``def``), so what it observes is nested under the run. This base observes
    nothing."""

    def __enter__(self) -> RunTrace:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        return None

    def handling(self, call: Callable[[], Awaitable[T]]) -> Callable[[], Awaitable[T]]:
        """``call`` (the handler) as it is to run inside this trace."""
        return call

    def outcome(self, outcome: RunOutcome, error: BaseException | str | None = None) -> None:
        """How the run ended (reported at most once, before the context exits); ``error``:
        the exception of a failed attempt, or why the run lost its job."""

    def continuation_context(self) -> str | None:
        """The trace context to store with a ``continue_with`` job made by this run."""
        return None


class Instrumentation:
    """What the queue reports to. Subclass it and :func:`install` the instance; this base
    (:data:`NO_INSTRUMENTATION`) observes nothing."""

    def starting_chains(self, specs: Sequence[ChainSpec]) -> ChainsStart:
        """A ``start_chains`` (or ``start_chain``) call of ``specs`` begins."""
        return _NO_START

    def running(self, job: Job, trace_context: str | None) -> RunTrace:
        """A worker is about to run ``job``, stored with ``trace_context``; nothing is
        observed before the returned trace is entered."""
        return NO_RUN_TRACE

    def observing(
        self, state: StateAdapter, type_names: Sequence[str]
    ) -> AbstractAsyncContextManager[None]:
        """Held open by a worker of ``type_names`` for as long as it runs (a place for
        periodic observations of the queue, owned and ended with the worker)."""
        return _nothing_observed()


NO_INSTRUMENTATION = Instrumentation()
_NO_START = ChainsStart()
NO_RUN_TRACE = RunTrace()
"""The trace of a run nobody observes."""
_active = NO_INSTRUMENTATION


def active() -> Instrumentation:
    """The instrumentation the client and workers report to now."""
    return _active


def install(instrumentation: Instrumentation) -> None:
    """Make ``instrumentation`` the one reported to from now on (:data:`NO_INSTRUMENTATION`
    to stop). Runs already under way keep the trace they started with."""
    global _active
    _active = instrumentation


@asynccontextmanager
async def _nothing_observed() -> AsyncIterator[None]:
    yield
