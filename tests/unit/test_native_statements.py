"""plumbing.db.Native: a statement converted once to PostgreSQL's placeholders must
be the very text psycopg's own conversion sends, so the prepared statement, its
plan and its parameters are what they were."""

from __future__ import annotations

import pytest

from hybrid_jobs.plumbing.db import Native, native
from hybrid_jobs.schema import queries as q


def test_each_name_gets_one_number_in_order_of_first_use() -> None:
    native = Native("SELECT %(a)s, %(b)s WHERE x = %(a)s AND y LIKE '10%%'")
    assert native.sql == b"SELECT $1, $2 WHERE x = $1 AND y LIKE '10%'"
    assert native.names == ("a", "b")
    assert native.params({"b": 2, "a": 1, "unused": 3}) == [1, 2]


def test_a_statement_is_converted_once() -> None:
    assert native(q.OUTBOX_WAKE_QUEUE) is native(q.OUTBOX_WAKE_QUEUE)


@pytest.mark.parametrize("statement", ["SELECT %s", "SELECT %(a)b", "SELECT 5 % 3"])
def test_anything_but_named_placeholders_is_refused(statement: str) -> None:
    with pytest.raises(ValueError):
        Native(statement)


@pytest.mark.parametrize(
    "statement", [q.OUTBOX_WAKE_QUEUE, q.JOB_CLAIM_PLAIN_MANY, q.JOB_CLAIM_MANY]
)
def test_the_hot_statements_convert_as_psycopg_converts_them(statement: str) -> None:
    # psycopg's own conversion, with no connection: the placeholders are what it
    # rewrites, whatever the values' types
    from psycopg._queries import PostgresQuery
    from psycopg.adapt import Transformer

    native = Native(statement)
    theirs = PostgresQuery(Transformer())
    theirs.convert(statement, dict.fromkeys(native.names, 1))
    assert native.sql == theirs.query
