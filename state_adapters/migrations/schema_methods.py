"""Creating and upgrading a state adapter's tables: the ``migrate()`` of
:class:`~state_adapters.sqlalchemy.SqlAlchemyStateAdapter`, and the address its
messages name. Alembic is imported on the first ``migrate()``, not before."""

from __future__ import annotations

from typing import TYPE_CHECKING

from state_adapters.errors import mask_url
from state_adapters.transactions.connection_loss import begin_or_explain

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from state_adapters.database import Database
    from state_adapters.schema import Tables


class SchemaMethods:
    """The schema methods of :class:`~state_adapters.sqlalchemy.SqlAlchemyStateAdapter`."""

    engine: AsyncEngine
    tables: Tables
    _db: Database

    @property
    def address(self) -> str:
        return mask_url(self.engine.url.render_as_string(hide_password=False))

    async def migrate(self, *, adopt: bool = False) -> None:
        """Create or upgrade the tables to the latest shipped migration.

        Idempotent, and safe when several processes run it at once: they take
        turns (Postgres advisory lock, SQLite write lock) and all but the first
        find nothing to do. Queue tables created by someone else (the application's
        own Alembic) are a :class:`ConfigurationError`; with ``adopt`` they are
        checked against the newest migration and, when they match, taken over by
        stamping the version table (see docs/databases.md). A database that does not
        answer is the CLI's one-line :class:`ConfigurationError` naming it.
        """
        from state_adapters.migrations.runner import upgrade

        async with begin_or_explain(self.engine) as connection:
            await self._db.take_migration_lock(
                connection, f"{self.tables.schema}.{self.tables.table_prefix}"
            )
            await connection.run_sync(upgrade, self.tables, adopt=adopt)
