"""The schema's migration history (Alembic), applied by ``SqlAlchemyStateAdapter.migrate()``."""
