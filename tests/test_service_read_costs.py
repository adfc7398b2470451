"""The service layer's reads cost what the backlog (or a page) costs, not what the
history costs: each list and per-queue statement, run against a long history of
finished jobs, reads a bounded number of rows, in custom and generic plans alike;
and a list that stops at its bound reads on, with no gap, through its token."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from hybrid_jobs.jobctl.metrics.queries import (
    METRICS_JOBS_LEASED,
    METRICS_JOBS_NO_AUTHORIZED_RUNNER,
    METRICS_JOBS_RATE_LIMITED,
    METRICS_JOBS_WAITING,
    METRICS_JOBS_WAITING_FOR_PARENTS,
    METRICS_KEY_WAITS,
    METRICS_RESOURCE_WAITS,
)
from hybrid_jobs.jobctl.service import JobFilter, list_jobs, queries
from hybrid_jobs.schema.states import JobState
from tests.conftest import _database, _url_for
from tests.support.history import fill, job_lists, middle_of_the_failed
from tests.support.plans import plan as explain_plan

HISTORY = 30_000
BACKLOG = 300
SCAN = 100
LIMIT = 10


def _fill(pg: psycopg.Connection, old: bool) -> psycopg.Connection:
    # Failures spread through the history, or all in its oldest tenth (an incident
    # weeks ago, none since): the case a plan that assumes an even spread gets wrong.
    fill(pg, HISTORY, BACKLOG, failures_until=HISTORY // 10 if old else None)
    # A history as autovacuum leaves it: statistics, and old rows all-visible (an
    # index-only scan of failed jobs' keys then costs what it reads).
    pg.execute("VACUUM ANALYZE jobs")
    return pg


@pytest.fixture(scope="module", params=["spread", "old"], ids=["failures-spread", "failures-old"])
def _history_url(template_db: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A long history in a database of this module's own, for the tests that only
    read it (each plan is taken in a transaction rolled back)."""
    with _database("hj_history", template=template_db) as name:
        url = _url_for(name).conninfo
        with psycopg.connect(url, autocommit=True) as pg:
            _fill(pg, old=request.param == "old")
        yield url


@pytest.fixture
def history(_history_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(_history_url, autocommit=True) as pg:
        yield pg


@pytest.fixture(params=["spread", "old"], ids=["failures-spread", "failures-old"])
def own_history(pg: psycopg.Connection, request: pytest.FixtureRequest) -> psycopg.Connection:
    """A long history in the test's own database, for a test that changes it."""
    return _fill(pg, old=request.param == "old")


def rows_read(plan: list[dict[str, Any]]) -> int:
    """The most rows any one scan of jobs in the plan produced or filtered away, all
    its loops together (a page's lookups by primary key are one such scan)."""

    def walk(node: dict[str, Any]) -> Iterator[int]:
        if node.get("Relation Name") == "jobs":
            assert node["Node Type"] != "Seq Scan", node
            read = node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
            read += node.get("Rows Removed by Index Recheck", 0)
            yield read * node["Actual Loops"]
        for child in node.get("Plans", []):
            yield from walk(child)

    return max(walk(plan[0]["Plan"]), default=0)


def explain(pg: psycopg.Connection, statement: str, params: dict[str, Any], generic: bool) -> int:
    return rows_read(explain_plan(pg, statement, params, generic=generic))


STATES: list[JobState | None] = [None, *JobState]


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
@pytest.mark.parametrize("state", STATES, ids=lambda s: str(s))
def test_a_list_reads_a_bounded_stretch_of_a_long_history(
    history: psycopg.Connection, state: JobState | None, generic: bool
) -> None:
    # Filters that match nothing: the worst case for a list that stops when its
    # page is full.
    nothing = {"queue": "q1", "job_type": "nope", "tenant": "t3", "limit": LIMIT + 1, "scan": SCAN}
    # A page from the middle of the failed jobs.
    params = nothing | middle_of_the_failed(history)
    bound = BACKLOG if state in (JobState.QUEUED, JobState.RUNNING) else SCAN
    filter_sets = [(), ("job_type",), ("queue", "job_type", "tenant")]
    for filters, after, listing in job_lists(state, filter_sets):
        for statement in filter(None, (listing.sql, listing.edge_sql)):
            read = explain(history, statement, params, generic)
            if read > bound + LIMIT + 1:
                plan = history.execute(f"EXPLAIN (ANALYZE) {statement}", params).fetchall()
                print("\n".join(r[0] for r in plan))
            assert read <= bound + LIMIT + 1, (state, filters, after, read, statement)


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
def test_per_queue_figures_read_the_backlog_only(
    history: psycopg.Connection, generic: bool
) -> None:
    params = {"window": 60.0, "sample": 20_000, "worker_ttl": 60.0}
    for statement in (
        METRICS_JOBS_WAITING,
        METRICS_JOBS_LEASED,
        METRICS_JOBS_RATE_LIMITED,
        METRICS_JOBS_NO_AUTHORIZED_RUNNER,
        METRICS_KEY_WAITS,
        METRICS_JOBS_WAITING_FOR_PARENTS,
        METRICS_RESOURCE_WAITS,
        queries.STATS_FINISHED,
        queries.WORKERS_LIST,
    ):
        assert explain(history, statement, params, generic) <= BACKLOG, statement


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
def test_the_key_reads_read_what_runs_and_waits_not_the_keys_history(
    own_history: psycopg.Connection, generic: bool
) -> None:
    history = own_history
    # Every job has one of 50 keys, the history's too; the backlog is ordered and
    # the history's failures are strict heads; the running ones hold their keys.
    history.execute(
        "UPDATE jobs SET key = 'k' || (abs(hashtext(job_id::text)) % 50), key_limit = 1,"
        " key_order = CASE WHEN state IN ('QUEUED', 'RUNNING', 'FAILED')"
        "   THEN CASE WHEN state = 'FAILED' THEN 'strict' ELSE 'ordered' END END,"
        " key_seq = CASE WHEN state IN ('QUEUED', 'RUNNING', 'FAILED')"
        "   THEN nextval('jobs_key_seq') END"
    )
    history.execute(
        "INSERT INTO key_usage (key, running, key_limit)"
        " SELECT key, count(*), 1 FROM jobs WHERE state = 'RUNNING' GROUP BY key"
    )
    history.execute("VACUUM ANALYZE jobs")
    (strict,) = history.execute("SELECT count(*) FROM jobs WHERE state = 'FAILED'").fetchone()  # type: ignore[misc]
    params = {
        "limit": 100,
        "holders": 10,
        "waiting_cap": 10_000,
        "job_type": "type1",
        "debounce_key": "d",
    }
    for statement, bound in (
        (queries.KEYS_BUSY, BACKLOG),
        (queries.DEBOUNCE_WAITING, BACKLOG),
        # the strict heads that failed hold their keys until replayed: they are read
        # (as the failed jobs' list would), the succeeded history never
        (queries.KEYS_HELD_STRICT, BACKLOG + strict),
        (METRICS_KEY_WAITS, BACKLOG),
    ):
        read = explain(history, statement, params, generic)
        assert read <= bound, (statement, read)
        assert read < HISTORY // 10, statement


async def test_a_bounded_list_reads_on_through_its_token(
    async_engine: AsyncEngine, pg: psycopg.Connection
) -> None:
    # 60 jobs, every 20th of type "rare": a scan of 7 finds one in about three pages.
    for i in range(60):
        pg.execute(
            "INSERT INTO jobs (job_id, job_type) VALUES (%s, %s)",
            (f"01900000-0000-7000-8000-{i:012d}", "rare" if i % 20 == 5 else "common"),
        )
    rare = [f"01900000-0000-7000-8000-{i:012d}" for i in (45, 25, 5)]
    seen: list[str] = []
    limited = 0
    after = None
    async with AsyncSession(async_engine) as session:
        for _ in range(20):
            page = await list_jobs(
                session, JobFilter(job_type="rare"), limit=2, after=after, scan=7
            )
            seen += [str(j.id) for j in page.jobs]
            limited += page.scan_limited
            if page.next is None:
                break
            after = page.next
    assert seen == rare
    assert limited >= 3, "the scan stopped at its bound and read on"
