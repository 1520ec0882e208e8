"""The schema's migration history (Alembic), applied by ``SqlAlchemyStateAdapter.migrate()``,
its runner, the autogenerate hook and the never-migrated check. May import the root `schema`
and `errors` only."""
