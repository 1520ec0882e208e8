"""The Redis notify adapter: single server, cluster, Pub/Sub or wake lists (lanes, blocking
pops), its transports, shared keys and Lua scripts (`lua/`). May import `notify`'s shared modules,
`errors` and `state_adapters`.
"""

from queuert_notify.notify.redis.adapter import RedisNotifyAdapter

__all__ = ["RedisNotifyAdapter"]
