"""Tags and meta on jobs: given at enqueue (and by a schedule), refused before
anything is written when they break the rules, shown by every surface, and found
by the operator's lists, a page at a time, newest first, reading a bounded stretch
of a long history."""

from __future__ import annotations

import json
import os
import re
import tempfile
import threading
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from playwright.async_api import expect
from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from hybrid_jobs import outbox
from hybrid_jobs.jobctl.service import Invalid, JobFilter, get_job, list_jobs, queries
from hybrid_jobs.outbox import NewJob
from hybrid_jobs.plumbing.config import DatabaseUrl
from hybrid_jobs.schema.states import JobState
from tests.support.api import api_client
from tests.support.dashboard import CHROMIUM, chromium, dashboard_served, sign_in
from tests.support.plans import plan as explain_plan
from tests.support.processes import jobctl

# The dashboard test's screenshot of a list filtered by tag, to look at.
SCREENSHOT = Path(os.environ.get("TAGS_SCREENSHOT", Path(tempfile.gettempdir()) / "tags.png"))


def _stored(pg: psycopg.Connection, job_id: uuid.UUID) -> tuple[Any, ...]:
    row = pg.execute("SELECT tags, meta FROM jobs WHERE job_id = %s", [job_id]).fetchone()
    assert row is not None
    return tuple(row)


def _tag_rows(pg: psycopg.Connection) -> list[tuple[str, uuid.UUID]]:
    return [tuple(r) for r in pg.execute("SELECT tag, job_id FROM job_tags ORDER BY tag")]  # type: ignore[misc]


def test_enqueue_stores_tags_and_meta_and_a_plain_job_stores_none(
    engine: Engine, pg: psycopg.Connection
) -> None:
    with Session(engine) as session, session.begin():
        tagged = outbox.enqueue(
            session,
            "invoice",
            {"n": 1},
            tags=["billing", "customer:42", "billing"],
            meta={"order": 7, "region": "eu"},
        )
        plain = outbox.enqueue(session, "invoice", {"n": 2})
        (many,) = outbox.enqueue_many(session, [NewJob("invoice", {}, tags=("bulk",), meta={})])
    assert _stored(pg, tagged) == (["billing", "customer:42"], {"order": 7, "region": "eu"})
    assert _stored(pg, plain) == ([], None)
    assert _stored(pg, many) == (["bulk"], None)
    assert sorted(_tag_rows(pg)) == sorted(
        [("billing", tagged), ("customer:42", tagged), ("bulk", many)]
    )


@pytest.mark.parametrize(
    ("tags", "meta", "error", "message"),
    [
        ("billing", None, TypeError, "tags must be a list"),
        (["has space"], None, ValueError, "tags: tag .has space. must be"),
        (["a,b"], None, ValueError, "must be 1-64 characters"),
        (["x" * 65], None, ValueError, "the limit is 64"),
        ([f"t{i}" for i in range(17)], None, ValueError, "at most 16"),
        ([""], None, ValueError, "tags: tag must not be empty"),
        ([1], None, TypeError, "tags: tag must be a str"),
        ((), ["not", "an", "object"], TypeError, "meta must be a dict"),
        ((), {"big": "x" * 5000}, ValueError, "meta is 5010 bytes as JSON; the limit is 4096"),
        ((), {1: "key not a str"}, TypeError, "meta has a key that is not a string"),
        ((), {"when": object()}, TypeError, "meta is not JSON-serialisable"),
        ((), {"nan": float("nan")}, ValueError, "meta is not valid JSON"),
    ],
)
def test_unacceptable_tags_or_meta_are_refused_and_nothing_is_written(
    engine: Engine, pg: psycopg.Connection, tags: Any, meta: Any, error: type, message: str
) -> None:
    with pytest.raises(error, match=message), Session(engine) as session, session.begin():
        outbox.enqueue(session, "t", {}, tags=tags, meta=meta)
    assert pg.execute("SELECT count(*) FROM jobs").fetchone() == (0,)
    assert pg.execute("SELECT count(*) FROM job_tags").fetchone() == (0,)


def test_the_table_refuses_tags_and_meta_the_producer_would_refuse(pg: psycopg.Connection) -> None:
    for tags, meta in (
        (["has space"], None),
        (["ok", None], None),
        ([f"t{i}" for i in range(17)], None),
        ([], "[1, 2]"),
    ):
        with pytest.raises(psycopg.errors.CheckViolation):
            pg.execute(
                "INSERT INTO jobs (job_id, job_type, tags, meta) VALUES (%s, 't', %s, %s)",
                [uuid.uuid4(), tags, meta],
            )


def test_a_debounced_repeat_replaces_the_tags_and_meta(
    engine: Engine, pg: psycopg.Connection
) -> None:
    wait = timedelta(minutes=5)
    with Session(engine) as session, session.begin():
        first = outbox.enqueue(
            session, "reindex", {}, dedup_key="c1", debounce=wait, tags=["a", "b"], meta={"v": 1}
        )
    with Session(engine) as session, session.begin():
        again = outbox.enqueue(
            session, "reindex", {}, dedup_key="c1", debounce=wait, tags=["b", "c"], meta={"v": 2}
        )
    assert again == first
    assert _stored(pg, first) == (["b", "c"], {"v": 2})
    assert sorted(_tag_rows(pg)) == [("b", first), ("c", first)]


def test_two_debounced_repeats_at_once_leave_the_index_with_the_last_ones_tags(
    engine: Engine, pg: psycopg.Connection
) -> None:
    # The second repeat waits for the first's commit, then replaces its row; its own
    # statement's snapshot was taken before that commit, so a delete of the tags
    # the job no longer has, in that statement, cannot see the first's new tag.
    wait = timedelta(minutes=5)
    with Session(engine) as session, session.begin():
        job_id = outbox.enqueue(session, "reindex", {}, dedup_key="c1", debounce=wait, tags=["w"])
    first, second = Session(engine), Session(engine)
    try:
        with first.begin():
            outbox.enqueue(first, "reindex", {}, dedup_key="c1", debounce=wait, tags=["x"])
            done = threading.Event()

            def repeat() -> None:
                with second.begin():
                    outbox.enqueue(second, "reindex", {}, dedup_key="c1", debounce=wait, tags=["y"])
                done.set()

            rival = threading.Thread(target=repeat)
            rival.start()
            assert not done.wait(0.5), "the second repeat waits for the first's commit"
        rival.join(10)
        assert done.is_set()
    finally:
        first.close()
        second.close()
    assert _stored(pg, job_id)[0] == ["y"]
    assert _tag_rows(pg) == [("y", job_id)], "the index holds the job's tags, no more"


def test_a_schedule_gives_its_tags_and_meta_to_each_job_it_enqueues(
    engine: Engine, pg: psycopg.Connection
) -> None:
    with Session(engine) as session, session.begin():
        outbox.schedule(
            session,
            "nightly",
            "report",
            {},
            every=timedelta(hours=1),
            tags=["nightly"],
            meta={"owner": "ops"},
        )
    with Session(engine) as session, session.begin():
        job_id = outbox.trigger_schedule(session, "nightly")
    assert job_id is not None
    assert _stored(pg, job_id) == (["nightly"], {"owner": "ops"})
    with pytest.raises(ValueError, match="tag"), Session(engine) as session, session.begin():
        outbox.schedule(session, "bad", "report", {}, every=timedelta(hours=1), tags=["a b"])


def test_retention_deletes_a_jobs_tag_rows_with_it(engine: Engine, pg: psycopg.Connection) -> None:
    with Session(engine) as session, session.begin():
        job_id = outbox.enqueue(session, "t", {}, tags=["gone"])
    pg.execute("DELETE FROM jobs WHERE job_id = %s", [job_id])
    assert _tag_rows(pg) == []


# ------------------------------------------------------------------ search


def _enqueue_series(engine: Engine, count: int, **options: Any) -> list[uuid.UUID]:
    with Session(engine) as session, session.begin():
        return [outbox.enqueue(session, "t", {"i": i}, **options) for i in range(count)]


async def _all_pages(
    async_engine: AsyncEngine, where: JobFilter, *, limit: int, scan: int = 10_000
) -> tuple[list[uuid.UUID], int]:
    seen: list[uuid.UUID] = []
    pages = 0
    after = None
    async with AsyncSession(async_engine) as session:
        while True:
            page = await list_jobs(session, where, limit=limit, after=after, scan=scan)
            seen += [j.id for j in page.jobs]
            pages += 1
            if page.next is None:
                return seen, pages
            after = page.next


async def test_search_by_tag_pages_through_the_tagged_jobs_newest_first(
    engine: Engine, async_engine: AsyncEngine
) -> None:
    red = _enqueue_series(engine, 5, tags=["red"])
    both = _enqueue_series(engine, 3, tags=["red", "blue"], meta={"customer": 42})
    _enqueue_series(engine, 4, tags=["blue"])
    _enqueue_series(engine, 4)

    seen, pages = await _all_pages(async_engine, JobFilter(tags=("red",)), limit=3)
    assert seen == sorted(red + both, reverse=True)
    assert pages == 3
    seen, _ = await _all_pages(async_engine, JobFilter(tags=("red", "blue")), limit=2)
    assert seen == sorted(both, reverse=True)
    # meta values compare as text: 42 finds the number 42
    for meta in ({"customer": 42}, {"customer": "42"}):
        seen, _ = await _all_pages(async_engine, JobFilter(meta=meta), limit=2)
        assert seen == sorted(both, reverse=True)
    seen, _ = await _all_pages(
        async_engine, JobFilter(tags=("red",), meta={"customer": 7}), limit=2
    )
    assert seen == []
    seen, _ = await _all_pages(
        async_engine, JobFilter(state=JobState.QUEUED, tags=("blue",)), limit=50
    )
    assert len(seen) == 7


async def test_search_by_a_rare_tag_reads_on_through_its_token_with_no_gap(
    engine: Engine, async_engine: AsyncEngine
) -> None:
    # Every 10th of the jobs tagged "common" is also "rare" and of the queue "q2":
    # a scan of 4 of the common tag's rows per page stops short, and reads on.
    wanted: list[uuid.UUID] = []
    for i in range(30):
        rare = i % 10 == 3
        (job_id,) = _enqueue_series(
            engine, 1, tags=["common", "rare"] if rare else ["common"], queue="q2" if rare else "q1"
        )
        if rare:
            wanted.append(job_id)
    seen, pages = await _all_pages(
        async_engine, JobFilter(queue="q2", tags=("common",)), limit=2, scan=4
    )
    assert seen == sorted(wanted, reverse=True)
    assert pages > 3, "the scan stopped at its bound and read on"


async def test_a_bad_filter_is_refused_naming_it(async_engine: AsyncEngine) -> None:
    async with AsyncSession(async_engine) as session:
        with pytest.raises(Invalid, match=r"tags: tag 'a b' must be") as tag:
            await list_jobs(session, JobFilter(tags=("a b",)))
        with pytest.raises(Invalid, match="must be a str, number or bool") as meta:
            await list_jobs(session, JobFilter(meta={"k": [1]}))  # type: ignore[dict-item]
    assert (tag.value.field, meta.value.field) == ("tag", "meta")


async def test_the_job_page_and_the_list_show_tags_and_meta(
    engine: Engine, async_engine: AsyncEngine
) -> None:
    (job_id,) = _enqueue_series(engine, 1, tags=["x", "y"], meta={"a": {"b": [1]}})
    async with AsyncSession(async_engine) as session:
        job = await get_job(session, job_id)
        page = await list_jobs(session, JobFilter(tags=("y",)))
    assert job is not None
    assert (job.tags, job.meta) == (("x", "y"), {"a": {"b": [1]}})
    assert [(j.tags, j.meta) for j in page.jobs] == [(("x", "y"), {"a": {"b": [1]}})]


# ------------------------------------------------------------------ surfaces


async def test_the_api_enqueues_with_tags_and_meta_and_lists_by_them(
    db_url: DatabaseUrl, pg: psycopg.Connection
) -> None:
    async with api_client(db_url) as client:
        made = await client.post(
            "/v1/jobs", json={"job_type": "greet", "tags": ["vip", "eu"], "meta": {"customer": 42}}
        )
        assert made.status_code == 202, made.text
        assert (made.json()["tags"], made.json()["meta"]) == (["vip", "eu"], {"customer": 42})
        other = await client.post("/v1/jobs", json={"job_type": "greet", "tags": ["eu"]})
        (await client.post("/v1/jobs", json={"job_type": "greet"})).raise_for_status()
        ids = {made.json()["id"], other.json()["id"]}

        async def listed(query: str) -> list[str]:
            page = await client.get(f"/v1/jobs?{query}")
            assert page.status_code == 200, page.text
            return [j["id"] for j in page.json()["jobs"]]

        assert set(await listed("tag=eu")) == ids
        assert await listed("tag=eu&tag=vip") == [made.json()["id"]]
        assert await listed("meta.customer=42") == [made.json()["id"]]
        assert await listed("tag=eu&meta.customer=43") == []
        refused = await client.get("/v1/jobs?tag=not%20a%20tag")
        assert refused.status_code == 422
        bad_body = await client.post("/v1/jobs", json={"job_type": "greet", "tags": ["a b"]})
        assert bad_body.status_code == 422
        too_big = await client.post(
            "/v1/jobs", json={"job_type": "greet", "meta": {"x": "y" * 5000}}
        )
        assert too_big.status_code == 422 and "meta" in too_big.json()["detail"]
    assert pg.execute("SELECT count(*) FROM jobs").fetchone() == (3,)


def test_the_cli_lists_by_tag_and_meta_and_shows_them(
    engine: Engine, db_url: DatabaseUrl, tmp_path: Path
) -> None:
    (tagged,) = _enqueue_series(engine, 1, tags=["vip"], meta={"customer": 42})
    _enqueue_series(engine, 2, tags=["other"])

    def run(*args: str) -> str:
        done = jobctl(*args, url=db_url, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        return done.stdout

    listed = json.loads(run("jobs", "list", "--tag", "vip", "--meta", "customer=42", "--json"))
    assert [j["id"] for j in listed["jobs"]] == [str(tagged)]
    assert "vip" in run("jobs", "list", "--tag", "vip")
    shown = run("jobs", "show", str(tagged))
    assert "tags" in shown and "vip" in shown and '{"customer":42}' in shown
    refused = jobctl("jobs", "list", "--meta", "no-equals-sign", url=db_url, cwd=tmp_path)
    assert refused.returncode != 0 and "KEY=VALUE" in refused.stderr


async def test_the_dashboard_shows_tags_as_chips_and_a_chip_filters_the_list(
    engine: Engine, db_url: DatabaseUrl
) -> None:
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed")
    with Session(engine) as session, session.begin():
        vip = [
            outbox.enqueue(
                session,
                "send_invoice",
                {"n": i},
                queue="billing",
                tags=["vip", "eu"],
                meta={"customer": 40 + i},
            )
            for i in range(3)
        ]
        outbox.enqueue(session, "send_invoice", {"n": 9}, queue="billing", tags=["eu"])
        outbox.enqueue(session, "resize", {"n": 10}, queue="images")
    async with dashboard_served(db_url) as served, chromium() as browser:
        page = await browser.new_page()
        await sign_in(page, served.base, then="/jobs")
        await expect(page.get_by_test_id("job-row")).to_have_count(5)
        await expect(page.get_by_test_id("tag")).to_have_count(7)
        # a chip is a link to the jobs with its tag
        await page.get_by_test_id("tag").filter(has_text="vip").first.click()
        await page.wait_for_url(re.compile(r".*/jobs\?tag=vip$"))
        rows = page.get_by_test_id("job-row")
        await expect(rows).to_have_count(3)
        assert {await r.get_attribute("data-job-id") for r in await rows.all()} == {
            str(i) for i in vip
        }
        await expect(page.get_by_test_id("tag-filter")).to_have_value("vip")
        await page.screenshot(path=str(SCREENSHOT))
        # the job's page shows its tags and its meta
        await page.goto(f"{served.base}/jobs/{vip[0]}")
        await expect(page.get_by_test_id("tags").first).to_contain_text("vip")
        await expect(page.get_by_test_id("meta")).to_contain_text('"customer": 40')
        # the form's field filters too
        await page.goto(f"{served.base}/jobs")
        await page.get_by_test_id("tag-filter").fill("eu")
        await page.get_by_test_id("filters").get_by_role("button", name="Apply").click()
        await expect(page.get_by_test_id("job-row")).to_have_count(4)


# ------------------------------------------------------------------ plans

HISTORY = 200_000
PAGE = 50
SCAN = 10_000


def _history(pg: psycopg.Connection, rows: int) -> None:
    """``rows`` finished jobs, every one tagged "common" and every 1,000th also
    "rare", with their job_tags rows, in two statements."""
    pg.execute(
        """
        INSERT INTO jobs (job_id, job_type, state, finished_at, tags, meta)
        SELECT ('01900000-0000-7000-8000-' || lpad(to_hex(i), 12, '0'))::uuid, 't',
               'SUCCEEDED', now(),
               CASE WHEN i %% 1000 = 0 THEN '{common,rare}'::text[] ELSE '{common}' END,
               CASE WHEN i %% 1000 = 0 THEN '{"customer": 7}'::jsonb END
        FROM generate_series(1, %(rows)s) AS i
        """,
        {"rows": rows},
    )
    pg.execute("INSERT INTO job_tags (tag, job_id) SELECT unnest(tags), job_id FROM jobs")
    pg.execute("VACUUM ANALYZE jobs, job_tags")


def _rows_read(node: dict[str, Any]) -> int:
    """The most rows any one scan in the plan produced or filtered away, all its
    loops together; a sequential scan counts as the whole table."""
    read = 0
    if "Scan" in node["Node Type"] and node.get("Relation Name") in ("jobs", "job_tags"):
        assert node["Node Type"] != "Seq Scan", node
        read = node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
        read = int((read + node.get("Rows Removed by Index Recheck", 0)) * node["Actual Loops"])
    return max([read, *(_rows_read(child) for child in node.get("Plans", []))])


def _check_tag_search_plans(pg: psycopg.Connection) -> None:
    (middle,) = pg.execute(  # type: ignore[misc]
        "SELECT job_id FROM job_tags WHERE tag = 'common' ORDER BY job_id OFFSET %s LIMIT 1",
        [HISTORY // 2],
    ).fetchone()
    base = {"limit": PAGE + 1, "scan": SCAN, "after_id": middle, "meta": None}
    cases = [
        # a common tag fills its page from the first rows it reads
        ({"tag": "common", "tags": ["common"]}, {}, PAGE + 1),
        # a rare one reads its own rows only, however deep in the history they are
        ({"tag": "rare", "tags": ["rare"]}, {}, PAGE + 1),
        # a filter the common tag's jobs never match: the scan's bound, not the table
        (
            {"tag": "common", "tags": ["common"], "meta": '{"customer": "8"}'},
            {"meta": True},
            SCAN,
        ),
    ]
    for generic in (False, True):
        for params, present, bound in cases:
            for after in (False, True):
                statement = queries.job_list(
                    None,
                    queue=False,
                    job_type=False,
                    tenant=False,
                    after=after,
                    tags=True,
                    **present,
                )
                # the edge (run when a page came back short) reads what the scan read
                for sql, most in ((statement.sql, bound), (statement.edge_sql, SCAN)):
                    assert sql is not None
                    plan = explain_plan(pg, sql, base | params, generic=generic)
                    read = _rows_read(plan[0]["Plan"])
                    assert read <= most, (params, after, generic, read, json.dumps(plan))


def test_the_search_by_tag_reads_a_page_not_the_history(pg: psycopg.Connection) -> None:
    _history(pg, HISTORY)
    _check_tag_search_plans(pg)


@pytest.mark.soak
def test_the_search_by_tag_reads_a_page_of_a_million_jobs(pg: psycopg.Connection) -> None:
    _history(pg, 1_000_000)
    _check_tag_search_plans(pg)
