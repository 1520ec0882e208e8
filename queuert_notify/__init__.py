"""queuert-notify: a durable job queue in your own SQL database, woken by notify adapters."""

from typing import TYPE_CHECKING, Any

from queuert_notify.client.chain_spec import ChainSpec
from queuert_notify.client.client import Client
from queuert_notify.errors import (
    ChainInUseError,
    ChainNotFoundError,
    ConfigurationError,
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
from queuert_notify.notify.noop import NoopNotifyAdapter
from queuert_notify.notify.protocol import NotifyAdapter, Unsubscribe
from queuert_notify.worker.worker import Worker
from state_adapters.health import HealthReport, HealthThresholds

if TYPE_CHECKING:
    from queuert_notify.client.sync_client import SyncClient
    from queuert_notify.notify.nats import NatsNotifyAdapter
    from queuert_notify.notify.postgres import PostgresNotifyAdapter
    from queuert_notify.notify.redis.adapter import RedisNotifyAdapter

# Adapters whose driver is an optional extra (and the sync client) are imported on
# first use, so `import queuert_notify` works without redis-py installed.
_OPTIONAL = {
    "NatsNotifyAdapter": "queuert_notify.notify.nats",
    "PostgresNotifyAdapter": "queuert_notify.notify.postgres",
    "RedisNotifyAdapter": "queuert_notify.notify.redis.adapter",
    "SyncClient": "queuert_notify.client.sync_client",
}


def __getattr__(name: str) -> Any:
    if name in _OPTIONAL:
        from importlib import import_module

        return getattr(import_module(_OPTIONAL[name]), name)
    raise AttributeError(f"module 'queuert_notify' has no attribute {name!r}")


__all__ = [
    "ChainInUseError",
    "ChainNotFoundError",
    "ChainSpec",
    "Client",
    "ConfigurationError",
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
]
