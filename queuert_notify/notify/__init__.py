"""Notify adapters: how state changes wake workers and waiters."""
