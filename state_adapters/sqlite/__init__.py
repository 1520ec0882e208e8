"""SQLite (aiosqlite): its `Database` implementation, its connection settings and the driver that
runs each of the adapter's transactions in one trip to the aiosqlite thread. May import the root
modules, `statements`, `steps`, `transactions` and `migrations`.
"""
