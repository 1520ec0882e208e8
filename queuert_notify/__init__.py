"""queuert-notify: a durable job queue in your own SQL database, woken by notify adapters.

Every public name is imported on first use (PEP 562): ``import queuert_notify`` loads
none of SQLAlchemy, redis-py or nats-py, so the ``queuert-notify`` command starts
without them (``--help`` in well under half a second) and an adapter whose driver is an
optional extra imports only when it is used."""

from typing import TYPE_CHECKING

from state_adapters import lazy_exports

if TYPE_CHECKING:
    from queuert_notify.client.chain_spec import ChainSpec
    from queuert_notify.client.client import Client
    from queuert_notify.client.sync_client import SyncClient
    from queuert_notify.errors import (
        ChainInUseError,
        ChainNotFoundError,
        ConfigurationError,
        DatabaseUnavailableError,
        InvalidInputError,
        JobNotFoundError,
        JobOwnershipLostError,
        NotifyAdapterClosedError,
        QueuertError,
        WaitChainTimeoutError,
    )
    from queuert_notify.events import WorkerEvent
    from queuert_notify.job_logs import JobLogHandler
    from queuert_notify.jobs import Job, JobContext
    from queuert_notify.maintenance.schedules import Schedule
    from queuert_notify.notify.in_process import InProcessNotifyAdapter
    from queuert_notify.notify.nats import NatsNotifyAdapter
    from queuert_notify.notify.noop import NoopNotifyAdapter
    from queuert_notify.notify.postgres import PostgresNotifyAdapter
    from queuert_notify.notify.protocol import NotifyAdapter, Unsubscribe
    from queuert_notify.notify.redis.adapter import RedisNotifyAdapter
    from queuert_notify.worker.worker import Worker
    from state_adapters.health import HealthReport, HealthThresholds
    from state_adapters.model import WorkerRecord

_ERRORS = "queuert_notify.errors"
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "ChainInUseError": _ERRORS,
        "ChainNotFoundError": _ERRORS,
        "ChainSpec": "queuert_notify.client.chain_spec",
        "Client": "queuert_notify.client.client",
        "ConfigurationError": _ERRORS,
        "DatabaseUnavailableError": _ERRORS,
        "HealthReport": "state_adapters.health",
        "HealthThresholds": "state_adapters.health",
        "InProcessNotifyAdapter": "queuert_notify.notify.in_process",
        "InvalidInputError": _ERRORS,
        "Job": "queuert_notify.jobs",
        "JobContext": "queuert_notify.jobs",
        "JobLogHandler": "queuert_notify.job_logs",
        "JobNotFoundError": _ERRORS,
        "JobOwnershipLostError": _ERRORS,
        "NatsNotifyAdapter": "queuert_notify.notify.nats",
        "NoopNotifyAdapter": "queuert_notify.notify.noop",
        "NotifyAdapter": "queuert_notify.notify.protocol",
        "NotifyAdapterClosedError": _ERRORS,
        "PostgresNotifyAdapter": "queuert_notify.notify.postgres",
        "QueuertError": _ERRORS,
        "RedisNotifyAdapter": "queuert_notify.notify.redis.adapter",
        "Schedule": "queuert_notify.maintenance.schedules",
        "SyncClient": "queuert_notify.client.sync_client",
        "Unsubscribe": "queuert_notify.notify.protocol",
        "WaitChainTimeoutError": _ERRORS,
        "Worker": "queuert_notify.worker.worker",
        "WorkerEvent": "queuert_notify.events",
        "WorkerRecord": "state_adapters.model",
    },
)


__all__ = [
    "ChainInUseError",
    "ChainNotFoundError",
    "ChainSpec",
    "Client",
    "ConfigurationError",
    "DatabaseUnavailableError",
    "HealthReport",
    "HealthThresholds",
    "InProcessNotifyAdapter",
    "InvalidInputError",
    "Job",
    "JobContext",
    "JobLogHandler",
    "JobNotFoundError",
    "JobOwnershipLostError",
    "NatsNotifyAdapter",
    "NoopNotifyAdapter",
    "NotifyAdapter",
    "NotifyAdapterClosedError",
    "PostgresNotifyAdapter",
    "QueuertError",
    "RedisNotifyAdapter",
    "Schedule",
    "SyncClient",
    "Unsubscribe",
    "WaitChainTimeoutError",
    "Worker",
    "WorkerEvent",
    "WorkerRecord",
]
