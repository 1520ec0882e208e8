"""The queue's statements on Django's SQLite and psycopg2 connections: their arguments,
bound without SQLAlchemy's processors for the queue's times and documents, are the ones
SQLAlchemy's make, and on SQLite the driver's cursor under Django's still answers to
what watches Django's queries."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from tests.django.conftest import Project

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("django")]

_DOCUMENTS: list[Any] = [
    {"task": "shop.tasks.count_run", "args": ["it's \\ 100% \u2603 %s %(x)s"], "kwargs": {}},
    {"nested": [[-7, 1.5, None, True, False], {"": '"quoted"'}], "n": -(2**63)},
    "a bare string",
    None,
    0,
]
_TIMES = [
    datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=timezone(timedelta(hours=-3))),
    datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC),  # no microseconds: still written
    datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=timezone(timedelta(hours=5, minutes=30))),
    datetime(2031, 1, 2, 3, 4, 5, 6, tzinfo=timezone(timedelta(0), "Z")),  # UTC, not UTC's object
]


def _first_job_rows() -> list[dict[str, Any]]:
    from state_adapters.statements.records import job_row
    from state_adapters.validation import new_job

    rows = []
    for index, (document, at) in enumerate(zip(_DOCUMENTS, [*_TIMES, *_TIMES], strict=False)):
        job = new_job(
            "django:default",
            document,
            run_at=at,
            delay=None,
            priority=-index,
            max_attempts=None if index % 2 else 20,
            trace_context="00-abc-def-01" if index % 2 else None,
            concurrency_key="k'ey" if index % 2 else None,
        )
        row = job_row(
            job,
            job_id=f"id{index}",
            chain_id=f"id{index}",
            chain_index=0,
            now=_TIMES[index % len(_TIMES)],
            dedup_key="d\\edup" if index % 2 else None,
            blockers_pending=index,
        )
        rows.append(row)
    return rows


def _enqueue_statements(psycopg2: bool) -> tuple[Any, list[tuple[Any, dict[str, Any]]]]:
    """The queue tables of SQLite or psycopg2, and an enqueue's statements with their
    parameters for each of :func:`_first_job_rows`."""
    from queuert_notify.contrib.django.statements import queue_tables

    vendor = "postgresql" if psycopg2 else "sqlite"
    tables = queue_tables(vendor, table_prefix="queuert_", psycopg2=psycopg2)
    database: Any = tables.state.database
    statements = []
    for row in _first_job_rows():
        if psycopg2:
            query = database._own.insert_first_job(row)
            statements.append((query.statement, query.params))
        else:
            statement, chains = database.sql.insert_chains([row])
            statements += [(statement, chains[0]), (database._insert_new_jobs, row)]
    return tables, statements


@pytest.mark.parametrize("psycopg2", [False, True], ids=["sqlite", "psycopg2"])
def test_an_enqueue_s_arguments_are_the_ones_sqlalchemy_s_processors_make(psycopg2: bool) -> None:
    from state_adapters.statements.compiled import CompiledStatement

    tables, statements = _enqueue_statements(psycopg2)
    for statement, params in statements:
        ours = tables.compiled(statement).arguments(params)
        sqlalchemy_s = CompiledStatement(statement, tables.dialect).arguments(params)
        # repr: a time's zone too (equal times in two zones compare equal).
        assert repr(ours) == repr(sqlalchemy_s)


def test_the_driver_s_text_is_the_one_django_s_sqlite_cursor_sends() -> None:
    from django.db.backends.sqlite3.base import SQLiteCursorWrapper

    tables, statements = _enqueue_statements(psycopg2=False)
    for statement, _ in statements:
        sql = tables.compiled(statement).sql
        assert tables.qmark(sql) == SQLiteCursorWrapper.convert_query(None, sql)  # type: ignore[arg-type]


@pytest.mark.parametrize("psycopg2", [False, True], ids=["sqlite", "psycopg2"])
def test_a_naive_time_is_refused_as_sqlalchemy_s_type_refuses_it(psycopg2: bool) -> None:
    from state_adapters.statements.compiled import CompiledStatement

    tables, statements = _enqueue_statements(psycopg2)
    statement, params = statements[0]
    naive = {**params, "created_at": datetime(2031, 5, 6)}
    for compiled in (tables.compiled(statement), CompiledStatement(statement, tables.dialect)):
        with pytest.raises(ValueError, match="naive datetime"):
            compiled.arguments(naive)


def test_an_enqueue_s_statements_reach_execute_wrappers_and_the_debug_log(
    django_project: Project,
) -> None:
    from django.db import connections, transaction
    from django.test.utils import CaptureQueriesContext
    from shop.tasks import lite_count

    connection = connections["lite"]
    seen: list[str] = []

    def watch(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append(sql)
        return execute(sql, params, many, context)

    # Rolled back: no job is left for the workers of the other tests.
    with transaction.atomic(using="lite"):
        with connection.execute_wrapper(watch):
            watched = lite_count.enqueue("watched")
        with CaptureQueriesContext(connection) as queries:
            logged = lite_count.enqueue("logged")
        plain = lite_count.enqueue("it's \\ 100% \u2603")
        for result in (watched, logged, plain):
            assert lite_count.get_result(result.id).args == result.args
        transaction.set_rollback(True, using="lite")
    assert [sql.split(" (")[0] for sql in seen] == [
        "INSERT INTO queuert_chains",
        "INSERT INTO queuert_jobs",
    ]
    inserts = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("INSERT")]
    assert len(inserts) == 2


@pytest.mark.parametrize("wraps", [False, True], ids=["replaced", "functools.wraps"])
def test_an_enqueue_s_statements_reach_an_instrumentation_that_replaced_execute(
    django_project: Project, monkeypatch: pytest.MonkeyPatch, wraps: bool
) -> None:
    import functools

    from django.db import transaction
    from django.db.backends.utils import CursorWrapper
    from shop.tasks import lite_count

    seen: list[str] = []
    django_execute = CursorWrapper.execute

    def execute(self: Any, sql: str, params: Any = None) -> Any:  # as APM agents patch it
        seen.append(sql)
        return django_execute(self, sql, params)

    monkeypatch.setattr(
        CursorWrapper, "execute", functools.wraps(django_execute)(execute) if wraps else execute
    )
    with transaction.atomic(using="lite"):
        result = lite_count.enqueue("traced")
        assert lite_count.get_result(result.id).args == ["traced"]
        transaction.set_rollback(True, using="lite")
    assert [sql.split(" (")[0] for sql in seen if sql.startswith("INSERT")] == [
        "INSERT INTO queuert_chains",
        "INSERT INTO queuert_jobs",
    ]


def test_a_driver_error_on_the_direct_path_is_django_s(django_project: Project) -> None:
    from django.db import IntegrityError, connections, transaction

    from queuert_notify.contrib.django.statements import queue_tables
    from state_adapters.sync.bridge import run_to_completion

    tables = queue_tables("sqlite", table_prefix="queuert_")
    database: Any = tables.state.database
    statement, chains = database.sql.insert_chains(_first_job_rows()[:1])
    with transaction.atomic(using="lite"):
        with connections["lite"].cursor() as cursor:
            conn = tables.on(cursor)
            run_to_completion(conn.execute(statement, chains))
            with pytest.raises(IntegrityError):
                run_to_completion(conn.execute(statement, chains))
        transaction.set_rollback(True, using="lite")
