"""The worker: `Worker` and its parts (claimer, slots, wake policy and subscriptions, job run
and outcome, completion batcher, lease keeper, shutdown, loop watchdog, startup checks,
settings) and the multi-process `Supervisor`. May import everything else in the package except
`cli`, `testing` and `dashboard`.

`Worker` is imported on first use (PEP 562): the CLI imports the `Supervisor` and the
start-up messages without loading the whole worker (and SQLAlchemy) before a command runs.
"""

from typing import TYPE_CHECKING

from state_adapters import lazy_exports

if TYPE_CHECKING:
    from queuert_notify.worker.worker import Worker

__getattr__, __dir__ = lazy_exports(__name__, {"Worker": "queuert_notify.worker.worker"})

__all__ = ["Worker"]
