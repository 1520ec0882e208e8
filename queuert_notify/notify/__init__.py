"""Notify adapters: how state changes wake workers and waiters — the protocol, the shared
listener, in-process, no-op, Postgres, NATS, and Redis in `redis/`. May import `errors` and
`state_adapters`; never the client or the worker."""
