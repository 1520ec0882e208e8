"""The adapter's steps, one per capability: starting, completion, finishing, failing, chain actions
and reads, pruning, inspection, type controls, limited claims, schedule ticks, job counts.
May import the root modules, `statements` and `transactions`; the `database` seam for types only.
"""
