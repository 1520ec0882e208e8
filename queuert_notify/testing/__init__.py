"""Testing helpers: ``run_until_idle`` for an application's own tests, and the
conformance kits (pytest base classes that define the adapter contracts).

``run_until_idle`` needs nothing beyond the package; importing a conformance kit
needs pytest and pytest-asyncio (the ``dev`` extra), so they load on first use. May
import the whole package and ``state_adapters``; nothing in either imports it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from queuert_notify.testing.idle import run_until_idle

if TYPE_CHECKING:
    from queuert_notify.testing.notify_conformance import NotifyAdapterConformance, Recorder
    from queuert_notify.testing.state_conformance import StateAdapterConformance

_KITS = {
    "NotifyAdapterConformance": "queuert_notify.testing.notify_conformance",
    "Recorder": "queuert_notify.testing.notify_conformance",
    "StateAdapterConformance": "queuert_notify.testing.state_conformance",
}

__all__ = ["NotifyAdapterConformance", "Recorder", "StateAdapterConformance", "run_until_idle"]


def __getattr__(name: str) -> Any:
    if name in _KITS:
        return getattr(importlib.import_module(_KITS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
