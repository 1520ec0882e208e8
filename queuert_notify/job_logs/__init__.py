"""A job's own log lines: collected per attempt while its handler runs
(:mod:`~queuert_notify.job_logs.attempt_log`), written in batches
(:mod:`~queuert_notify.job_logs.writer`)."""

from queuert_notify.job_logs.attempt_log import JobLogHandler

__all__ = ["JobLogHandler"]
