"""Driver scripts of ``python -m benchmarks peers`` (benchmarks/peer_queues.py): one per side."""
