"""Conformance kits: pytest base classes that define the adapter contracts.

Importing this package needs pytest and pytest-asyncio (the ``dev`` extra).
"""

from queuert_notify.testing.notify_conformance import NotifyAdapterConformance, Recorder
from queuert_notify.testing.state_conformance import StateAdapterConformance

__all__ = ["NotifyAdapterConformance", "Recorder", "StateAdapterConformance"]
