"""The sync bridge: the adapter's SQL on a synchronous connection and job state on a
synchronous engine, for `SyncClient`. May import the root modules, `transactions` and `migrations`.
"""
