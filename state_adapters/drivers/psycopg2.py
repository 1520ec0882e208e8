"""psycopg2 (sync engines, for ``SyncClient``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class Psycopg2:
    """psycopg2 never prepares statements on the server."""

    name = "psycopg2"
    pooler_connect_args: dict[str, Any] = {}

    def keeps_prepared_statements(self, dbapi_connection: Any) -> bool:
        return False

    def reported_backend_pid(self, dbapi_connection: Any) -> int:
        return int(dbapi_connection.info.backend_pid)

    def leaves_connection_broken(self, error: BaseException) -> bool:
        return False  # the dialect's is_disconnect knows every way it breaks

    def fetch_sync(self, dbapi_connection: Any, sql: str, arguments: Any) -> Sequence[Any]:
        with dbapi_connection.cursor() as cursor:
            cursor.execute(sql, arguments)
            rows: Sequence[Any] = cursor.fetchall() if cursor.description else ()
            return rows
