"""Where statements run and what happens when that goes wrong: the caller's or the adapter's own
transaction, the atomic handler's transaction, after-commit delivery, connection loss and lost
commits, and the connection lanes workers keep. May import the root modules and `sync`.
"""
