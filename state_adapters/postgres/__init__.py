"""Postgres (psycopg 3): its `Database` implementation and the SQL only Postgres has.
May import the root modules, `statements`, `steps` and `transactions`; nothing imports it but the
root `database` chooser.
"""
