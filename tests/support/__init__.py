"""Helpers shared by the tests: fixtures, real-server helpers, fault injection."""
