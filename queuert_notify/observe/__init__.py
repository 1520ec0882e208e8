"""What lets people see the queue from code: the instrumentation seam and the log format.
The OpenTelemetry implementation is `queuert_notify.otel` and the web view
`queuert_notify.dashboard` (their documented paths). May import `state_adapters` and, for
types only, the rest of the package.
"""
