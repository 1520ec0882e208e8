"""The queue's statements on Django's client-side binding psycopg cursor: their values
written into the text (``queuert_notify.contrib.django.literals``) read back on the
server as psycopg's own binding of the same values, and an enqueue stays one
statement."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest

from tests.django.conftest import Project

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("django")]

_SQL = (
    "SELECT %(text)s::text, %(quoted)s::text, %(count)s, 1 -%(negative)s, %(flag)s, "
    "%(none)s::text, %(at)s::TIMESTAMP WITH TIME ZONE, %(document)s::jsonb, '100%%', "
    "%(text)s::text = %(quoted)s::text"
)

_AT = datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=timezone(timedelta(hours=-3)))
_DOCUMENT = {"a": ["naïve 'q' \\ \"x\" \u2603 %s %(name)s", -7, 1.5, None, True]}


def _values(document: Any) -> dict[str, Any]:
    """The values of :data:`_SQL`, ``document`` being :data:`_DOCUMENT` as the driver
    is given it."""
    return {
        "text": "plain",
        "quoted": "it's a \\ backslash, %s and \u2603",
        "count": 2**40,
        # "1 -%(negative)s" written "1 --7" would end the statement at a comment.
        "negative": -7,
        "flag": True,
        "none": None,
        "at": _AT,
        "document": document,
    }


def _written_and_bound(render: Any, cursor: Any, sql: str, values: dict[str, Any]) -> Any:
    """The row of ``sql`` with ``values`` written into its text by ``render``, and the
    row of the driver's own binding of them."""
    text = render(sql, values)
    assert text is not None
    cursor.execute(text)
    written = cursor.fetchone()
    cursor.execute(sql, values)
    return written, cursor.fetchone()


def test_values_written_into_the_text_read_back_as_psycopg_binds_them(
    django_project: Project,
) -> None:
    from django.db import connections
    from psycopg import ClientCursor
    from psycopg.types.json import Jsonb

    from queuert_notify.contrib.django.literals import Literals

    values = _values(Jsonb(_DOCUMENT))
    with connections["default"].cursor() as cursor:
        assert isinstance(cursor.cursor, ClientCursor)
        written, bound = _written_and_bound(
            Literals().renderer(cursor.cursor), cursor, _SQL, values
        )
    assert written == bound
    # Django's cursor reads JSON as its text.
    assert json.loads(written[7]) == _DOCUMENT
    expected = (values["text"], values["quoted"], 2**40, 8, True, None, _AT)
    assert written[:7] == expected
    assert written[8:] == ("100%", False)


def test_values_written_into_the_text_read_back_as_psycopg2_binds_them(postgres_url: str) -> None:
    import psycopg2
    from sqlalchemy.engine import make_url

    from queuert_notify.contrib.django.literals import Literals

    url = make_url(postgres_url)
    # psycopg2 gets a document as its text (SQLAlchemy's psycopg2 JSON type).
    values = _values(json.dumps(_DOCUMENT))
    sql = _SQL.replace("%(at)s::TIMESTAMP WITH TIME ZONE", "%(at)s")
    connection = psycopg2.connect(
        host=url.host, port=url.port, user=url.username, password=url.password, dbname=url.database
    )
    try:
        cursor = connection.cursor()
        render = Literals(psycopg2=True).renderer(cursor)
        written, bound = _written_and_bound(render, cursor, sql, values)
        for value in (Decimal("1.5"), 1.5, datetime(2031, 5, 6), "NUL \x00 inside", b"bytes"):
            assert render("SELECT %(value)s", {"value": value}) is None
    finally:
        connection.close()
    assert written == bound
    expected = (values["text"], values["quoted"], 2**40, 8, True, None, _AT, _DOCUMENT)
    assert written[:8] == expected
    assert written[8:] == ("100%", False)


@pytest.mark.parametrize("at_connect", ["on", "off"])
@pytest.mark.parametrize("later", ["on", "off"])
def test_psycopg2_text_reads_back_whatever_standard_conforming_strings_became(
    postgres_url: str, at_connect: str, later: str
) -> None:
    import psycopg2
    from sqlalchemy.engine import make_url

    from queuert_notify.contrib.django.literals import Literals

    url = make_url(postgres_url)
    connection = psycopg2.connect(
        host=url.host,
        port=url.port,
        user=url.username,
        password=url.password,
        dbname=url.database,
        options=f"-c standard_conforming_strings={at_connect}",
    )
    tricky = ["a\\'; SELECT 1; --", "\\", "'", "\\'", "''\\\\", "naïve \\x41 'q'"]
    try:
        cursor = connection.cursor()
        cursor.execute(f"SET standard_conforming_strings = {later}")
        render = Literals(psycopg2=True).renderer(cursor)
        read_back = []
        for value in tricky:
            written = render("SELECT %(value)s::text", {"value": value})
            assert written is not None
            cursor.execute(written)
            read_back.append(cursor.fetchall())
    finally:
        connection.close()
    # One row each, the value itself: no quote ended early, no second statement ran.
    assert read_back == [[(value,)] for value in tricky]


def test_values_it_does_not_write_are_left_to_psycopg(django_project: Project) -> None:
    from django.db import connections

    from queuert_notify.contrib.django.literals import Literals

    class Name(str):
        pass

    with connections["default"].cursor() as cursor:
        render = Literals().renderer(cursor.cursor)
        for value in (Decimal("1.5"), 1.5, Name("x"), "NUL \x00 inside", b"bytes"):
            assert render("SELECT %(value)s", {"value": value}) is None
        assert render("SELECT %(value)s", {"other": 1}) is None


def test_an_enqueue_is_one_statement_in_the_caller_s_transaction(django_project: Project) -> None:
    from django.db import connections, transaction
    from django.test.utils import CaptureQueriesContext
    from shop.tasks import count_run

    # Rolled back: no job is left for the workers of the other tests.
    with transaction.atomic():
        with CaptureQueriesContext(connections["default"]) as queries:
            result = count_run.using(priority=30).enqueue("it's one", {"%s": "\\"})
        assert len(queries.captured_queries) == 1
        stored = count_run.get_backend().get_result(result.id)
        assert (stored.args, stored.task.priority) == (["it's one", {"%s": "\\"}], 30)
        transaction.set_rollback(True)


def test_a_statement_is_split_once_and_other_placeholder_forms_are_left_to_psycopg() -> None:
    from queuert_notify.contrib.django.literals import template

    # One field per parameter however often it appears; "%%" is a "%"; braces stay text.
    assert template("SELECT %(a)s, %(b)s, %(a)s, '{x}', '100%%'") == (
        "SELECT {0}, {1}, {0}, '{{x}}', '100%'",
        ("a", "b"),
    )
    # A placeholder the pattern does not take is never sent as text.
    for sql in ("SELECT %s", "SELECT %(a-b)s", "SELECT %(a)s, %(b)d"):
        assert template(sql) is None, sql
