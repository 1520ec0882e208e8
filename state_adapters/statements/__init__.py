"""Statement builders: the SQL of the queue's path, chains, inspection, type controls and limited
claims, on any dialect through `dialect.SqlDialect`, plus compiled statements and row records.
May import the root `model`, `schema`, `ids` and `errors`, and `steps` for types only.
"""
