"""The queue's statements as text with their values written in, for the client-side
binding cursor of Django's psycopg 3 backend (its default) and for psycopg2's.

Those cursors bind on the client anyway: psycopg writes every value into the
statement's text on every run, through a dumper looked up per value and a quoting
call per value (psycopg2 through an adapter per value). Here a statement's text is
split at its placeholders once (a ``str.format`` string per statement), and each run
writes its values in, then hands the cursor the statement without parameters, still
one statement:

- text, times and JSON documents (as their text, :attr:`Literals.as_text`, which
  :func:`queuert_notify.contrib.django.statements._text_for_psycopg` sends to psycopg
  too) between single quotes, a time followed by psycopg2's cast on psycopg2; text
  holding a quote or a backslash is quoted by libpq's ``PQescapeLiteral`` on the
  cursor's connection, as psycopg quotes it with ``PQescapeStringConn`` (on psycopg2,
  in an escape string, ``E'...'``, right whatever ``standard_conforming_strings`` is);
- integers, booleans and ``NULL`` as psycopg writes them (a negative number after a
  space, so ``1 -%s`` does not become a comment).

A value of any other type, text with a NUL character (which psycopg refuses), a
placeholder without a value or a connection whose client encoding is not UTF8
(Django's) is left to psycopg (to psycopg2, and a time without a zone too). An
enqueue's 12 values: 7.7 µs of CPU written here against 14.6 µs for the
conversions and psycopg's ``mogrify`` (thread time, best of 9 runs of 2,000); on
psycopg2, 4.4 µs against 11.4 for its ``mogrify`` (20,000 runs).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%")
"""A pyformat placeholder, or a ``%`` written as ``%%`` (its text without parameters)."""

Template = tuple[str, tuple[str, ...]]
"""A statement's text as a ``str.format`` string, a field for each placeholder (numbered
by its parameter), and the names of its parameters, each once, in that order."""


def template(sql: str) -> Template | None:
    """``sql`` as a :data:`Template`, ``%%`` turned into ``%``; ``None`` when it has a
    placeholder of another form (psycopg's to read)."""
    if "%" in _PLACEHOLDER.sub("", sql):
        return None
    names: dict[str, int] = {}

    def field(found: re.Match[str]) -> str:
        name = found.group(1)
        if name is None:
            return "%"
        return f"{{{names.setdefault(name, len(names))}}}"

    text = _PLACEHOLDER.sub(field, sql.replace("{", "{{").replace("}", "}}"))
    return text, tuple(names)


class Literals:
    """Statements' templates (made once per statement text, shared by threads) and
    the renderer for one cursor."""

    def __init__(self, *, psycopg2: bool = False) -> None:
        self._templates: dict[str, Template | None] = {}
        self._psycopg2 = psycopg2
        self.as_text: dict[type, Callable[[Any], str]] = {datetime: datetime.isoformat}
        """The text of a time or a JSON document, by its type: what psycopg is sent for
        one, in a literal or as a value it binds (a time's placeholder keeps its cast,
        a document takes its column's type). psycopg2 gets documents as text already,
        and a time's literal with the cast psycopg2 writes (``::timestamptz``)."""
        self._quoting = _psycopg2_quoting() if psycopg2 else _psycopg_quoting()
        if not psycopg2:
            # Imported here: beside Django's psycopg2 backend psycopg 3 may be missing.
            from psycopg.types.json import Json, Jsonb

            self.as_text.update({Json: _document_text, Jsonb: _document_text})

    def renderer(self, cursor: Any) -> Callable[[str, Mapping[str, Any]], str | None]:
        """For ``cursor`` (a client-side binding psycopg cursor, or a psycopg2 cursor):
        the statement's text with the arguments written in, or ``None`` when the driver
        should bind them."""
        utf8, escape = self._quoting(cursor)
        time_cast = "::timestamptz" if self._psycopg2 else ""
        templates = self._templates
        as_text = self.as_text

        def render(sql: str, arguments: Mapping[str, Any]) -> str | None:
            if not utf8():
                return None
            if sql not in templates:
                templates[sql] = template(sql)
            found = templates[sql]
            if found is None:
                return None
            text, names = found
            literals: list[str] = []
            for name in names:
                if name not in arguments:
                    return None  # psycopg says which
                value = arguments[name]
                kind = type(value)
                if value is None:
                    literals.append("NULL")
                    continue
                if kind is bool:
                    literals.append("true" if value else "false")
                    continue
                if kind is int:
                    # A space before a minus sign, as psycopg writes it: "1 -%s" must not
                    # become the comment "1 --7".
                    literals.append(str(value) if value >= 0 else f" {value}")
                    continue
                if kind is datetime:
                    if time_cast and value.tzinfo is None:
                        return None  # psycopg2 casts it to timestamp without time zone
                    # Digits, "-", ":", ".", "+" and "T": nothing to escape.
                    literals.append(f"'{as_text[datetime](value)}'{time_cast}")
                    continue
                if kind is not str:
                    text_of = as_text.get(kind)
                    if text_of is None:
                        return None
                    value = text_of(value)
                if "\x00" in value:
                    return None  # psycopg refuses it, as Postgres does
                if "'" in value or "\\" in value:
                    literals.append(escape(value))
                else:
                    # Nothing to escape: the same text whether the server reads
                    # backslashes in quotes as escapes or not (standard_conforming_strings).
                    literals.append(f"'{value}'")
            return text.format(*literals)

        return render


def _document_text(document: Any) -> str:
    """A psycopg ``Json``/``Jsonb`` document's text."""
    return json.dumps(document.obj)


Quoting = tuple[Callable[[], bool], Callable[[str], str]]
"""Whether a cursor's connection's client encoding is UTF8 now, and how it quotes text
that holds a quote or a backslash."""


def _psycopg_quoting() -> Callable[[Any], Quoting]:
    """psycopg 3: libpq's ``PQescapeLiteral``, as psycopg quotes with ``PQescapeStringConn``."""
    from psycopg.pq import Escaping

    def quoting(cursor: Any) -> Quoting:
        pgconn = cursor.connection.pgconn
        escape_literal = Escaping(pgconn).escape_literal

        def utf8() -> bool:
            return bool(pgconn.parameter_status(b"client_encoding") == b"UTF8")

        def escape(value: str) -> str:
            return bytes(escape_literal(value.encode())).decode()

        return utf8, escape

    return quoting


def _escape_string(value: str) -> str:
    """``value`` as a Postgres escape string constant."""
    return "E'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def _psycopg2_quoting() -> Callable[[Any], Quoting]:
    """psycopg2: text in an escape string (``E'...'``), whose backslashes are escapes
    whatever ``standard_conforming_strings`` is. Not psycopg2's ``QuotedString``: it
    follows that setting as it was when the connection was opened, so after a later
    ``SET standard_conforming_strings`` a backslash could end its quotes."""

    def quoting(cursor: Any) -> Quoting:
        connection = cursor.connection

        def utf8() -> bool:
            return bool(connection.encoding == "UTF8")

        return utf8, _escape_string

    return quoting
