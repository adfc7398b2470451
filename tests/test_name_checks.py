"""Queue and tenant names, as the tables check them: the same rule as the producer's
(QUEUE_NAME_PATTERN), written so that a check costs next to nothing. PostgreSQL
checks every CHECK of jobs at every write of a row (claim, outcome, heartbeat), and a
bounded repetition in a regular expression cost 6 microseconds a row there."""

from __future__ import annotations

import random
import re
import string
import uuid

import psycopg
import pytest
from sqlalchemy import Engine

from hybrid_jobs.plumbing.config import DatabaseUrl
from hybrid_jobs.schema.tables import QUEUE_NAME_PATTERN, name_valid
from tests.conftest import migrate
from tests.support.jobs import enqueue

# The constraints that check a queue or a tenant name, by table.
NAME_CHECKS = {
    "jobs": ["jobs_queue_name_valid", "jobs_tenant_name_valid"],
    "queues": ["queues_name_valid"],
    "tenant_limits": ["tenant_limits_name_valid"],
    "schedules": ["schedules_queue_name_valid", "schedules_tenant_valid"],
}

EDGES = [
    "default",
    "a",
    "A_b.c:d-e",
    "tenant-00042",
    "x" * 100,
    "x" * 101,
    "",
    "_leading",
    "-leading",
    ".leading",
    ":leading",
    "with space",
    "trailing\n",
    "new\nline",
    "ünïcode",
    "slash/no",
    "star*",
    "a$",
    "9" * 99 + "_",
]


def _names(count: int, seed: int = 7) -> list[str]:
    """EDGES, then random strings of the alphabet, of characters just outside it,
    and of lengths around the bound."""
    rng = random.Random(seed)
    alphabet = string.ascii_letters + string.digits + "_.:-" + " /*$\n\tüé,"
    out = list(EDGES)
    for _ in range(count):
        length = rng.choice([rng.randint(0, 8), rng.randint(95, 105)])
        out.append("".join(rng.choice(alphabet) for _ in range(length)))
    return out


def test_the_tables_take_exactly_the_names_the_producer_takes(pg: psycopg.Connection) -> None:
    """The rule, in PostgreSQL's own engine, takes the names the bounded form took and
    the producer's pattern takes, and no other."""
    names = _names(2000)
    rows = pg.execute(
        f"SELECT n, {name_valid('n')}, n ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{{0,99}}$'"
        " FROM unnest(%s::text[]) WITH ORDINALITY AS t(n, i) ORDER BY i",
        [names],
    ).fetchall()
    pattern = re.compile(QUEUE_NAME_PATTERN)
    differ = [(n, ok, old) for n, ok, old in rows if not ok == old == bool(pattern.fullmatch(n))]
    assert differ == []
    assert sum(1 for _, ok, _ in rows if ok) > 100, "the sample holds valid names too"


def test_every_name_check_is_the_shared_rule_without_a_bounded_repetition(
    pg: psycopg.Connection,
) -> None:
    """Each constraint, as migrated, is in the cheaper form, and no CHECK of jobs but
    the tags' has a bounded repetition (a tagged job pays for its own)."""
    for table, names in NAME_CHECKS.items():
        for name in names:
            definition = pg.execute(
                "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
                " WHERE conrelid = %s::regclass AND conname = %s",
                [table, name],
            ).fetchone()
            assert definition is not None, f"{table}.{name}"
            assert "{0," not in definition[0], f"{table}.{name}: {definition[0]}"
            assert "char_length" in definition[0], f"{table}.{name}: {definition[0]}"
    bounded = pg.execute(
        "SELECT conname FROM pg_constraint WHERE conrelid = 'jobs'::regclass AND contype = 'c'"
        " AND pg_get_constraintdef(oid) ~ '\\{[0-9]' AND conname <> 'jobs_tags_valid'"
    ).fetchall()
    assert bounded == []


@pytest.mark.parametrize(
    ("column", "value", "refused"),
    [
        ("queue", "x" * 100, False),
        ("queue", "x" * 101, True),
        ("queue", "_bad", True),
        ("queue", "bad name", True),
        ("tenant", "acme:eu-1", False),
        ("tenant", "x" * 101, True),
        ("tenant", "-bad", True),
    ],
)
def test_the_jobs_table_refuses_a_bad_name_written_by_hand(
    engine: Engine, pg: psycopg.Connection, column: str, value: str, refused: bool
) -> None:
    job_id = enqueue(engine, "noop")
    statement = f"UPDATE jobs SET {column} = %s WHERE job_id = %s"
    if refused:
        with pytest.raises(psycopg.errors.CheckViolation, match=f"jobs_{column}_name_valid"):
            pg.execute(statement, [value, job_id])
    else:
        pg.execute(statement, [value, job_id])
        row = pg.execute(f"SELECT {column} FROM jobs WHERE job_id = %s", [job_id]).fetchone()
        assert row == (value,)


def test_the_migration_keeps_the_rows_and_the_rule(empty_db_url: DatabaseUrl) -> None:
    """Up from the bounded form with rows of every valid name form in place (at the
    length bound too), and down again: each validation passes, and the rule the
    table applies is the same before and after."""
    migrate(empty_db_url, "0036")
    with psycopg.connect(empty_db_url.conninfo, autocommit=True) as conn:
        for value in ("a", "x" * 100, "Q.1:a-b_c"):
            conn.execute(
                "INSERT INTO jobs (job_id, job_type, queue, tenant) VALUES (%s, 'noop', %s, %s)",
                [uuid.uuid4(), value, value],
            )
        before = _refused(conn)
    migrate(empty_db_url)
    with psycopg.connect(empty_db_url.conninfo, autocommit=True) as conn:
        assert _refused(conn) == before
        assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (3,)
    migrate(empty_db_url, "0036", down=True)
    with psycopg.connect(empty_db_url.conninfo, autocommit=True) as conn:
        assert _refused(conn) == before


def _refused(conn: psycopg.Connection) -> list[str]:
    """Which of EDGES the queues table refuses."""
    out = []
    for value in EDGES:
        try:
            with conn.transaction(force_rollback=True):
                conn.execute("INSERT INTO queues (queue) VALUES (%s)", [value])
        except psycopg.errors.CheckViolation:
            out.append(value)
    return out
