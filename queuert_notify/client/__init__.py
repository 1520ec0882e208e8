"""The clients: the async `Client` (chains started, read and acted on), the synchronous
`SyncClient`, the operations they share, and the after-commit announcers of a sync app.
May import the package root (errors, jobs, events), `observe`, `notify`, `maintenance.prune_pacing`
and `state_adapters`; never `worker`.
"""

from queuert_notify.client.chain_spec import ChainSpec
from queuert_notify.client.client import Client

__all__ = ["ChainSpec", "Client"]
