"""Benchmarks of queuert-notify on real Postgres, SQLite and Redis.

Run ``python -m benchmarks --help`` for the list; each benchmark is one module
here and prints a markdown section (command, tables, machine notes) ready for
``docs/benchmarks.md``.
"""
