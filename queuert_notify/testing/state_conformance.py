"""The state-adapter contract as a pytest base class.

Subclass :class:`StateAdapterConformance` and provide an async fixture named
``state`` that yields a migrated adapter with tables of the test's own (a
unique table prefix), dropped at teardown::

    class TestMyState(StateAdapterConformance):
        @pytest.fixture
        async def state(self, tmp_path):
            engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path}/jobs.db")
            adapter = SqlAlchemyStateAdapter(engine, table_prefix="t_")
            await adapter.migrate()
            yield adapter
            await engine.dispose()

The transactional tests (``session=``) need the adapter's ``engine`` attribute
(an ``AsyncEngine``) and are skipped without one. Timing-based tests use leases
of a fraction of a second, so the suite runs in well under a minute.
"""

from __future__ import annotations

from queuert_notify.testing.state_cases.acquiring import AcquiringCases
from queuert_notify.testing.state_cases.actions import ActionsCases
from queuert_notify.testing.state_cases.blockers import BlockersCases
from queuert_notify.testing.state_cases.completing import CompletingCases
from queuert_notify.testing.state_cases.controls import ControlsCases
from queuert_notify.testing.state_cases.deduplication import DeduplicationCases
from queuert_notify.testing.state_cases.health import HealthCases
from queuert_notify.testing.state_cases.inspecting import InspectingCases
from queuert_notify.testing.state_cases.job_logs import JobLogsCases
from queuert_notify.testing.state_cases.leases import LeasesCases
from queuert_notify.testing.state_cases.listing import ListingCases
from queuert_notify.testing.state_cases.pruning import PruningCases
from queuert_notify.testing.state_cases.reaping import ReapingCases
from queuert_notify.testing.state_cases.retrying import RetryingCases
from queuert_notify.testing.state_cases.schedules import ScheduleCases
from queuert_notify.testing.state_cases.starting import StartingCases
from queuert_notify.testing.state_cases.trace_context import TraceContextCases
from queuert_notify.testing.state_cases.transactions import TransactionsCases


class StateAdapterConformance(
    StartingCases,
    AcquiringCases,
    LeasesCases,
    CompletingCases,
    RetryingCases,
    ReapingCases,
    ActionsCases,
    ListingCases,
    InspectingCases,
    BlockersCases,
    DeduplicationCases,
    TransactionsCases,
    TraceContextCases,
    PruningCases,
    ScheduleCases,
    ControlsCases,
    HealthCases,
    JobLogsCases,
):
    """Behaviour every state adapter must show; see the module docstring. Each base class
    holds the cases of one area (queuert_notify/testing/state_cases/)."""
