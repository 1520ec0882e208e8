"""The notify-adapter conformance cases, one module per area, composed by
:class:`~queuert_notify.testing.notify_conformance.NotifyAdapterConformance`."""
