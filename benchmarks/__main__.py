"""``python -m benchmarks <name> [options]``."""

from benchmarks.cli import main

main()
