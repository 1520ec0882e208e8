"""Leaderless services that ride in every worker: periodic schedules, retention (the pruner and
its pacing) and the reaper of expired leases. May import the package root, `client`, `observe`
and `state_adapters`; never `worker`.
"""
