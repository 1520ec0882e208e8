"""The worker: `Worker` and its parts (claimer, slots, wake policy and subscriptions, job run
and outcome, completion batcher, lease keeper, shutdown, loop watchdog, startup checks,
settings) and the multi-process `Supervisor`. May import everything else in the package except
`cli`, `testing` and `dashboard`.
"""

from queuert_notify.worker.worker import Worker

__all__ = ["Worker"]
