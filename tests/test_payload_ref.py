"""Payloads by reference: an input stored once (outbox.store_input) and named by the
jobs that run on it (enqueue(..., payload_ref=)), against the real services.

- Jobs on a stored input run through a real relay and real consumers, their
  handlers reading the content as job.payload; two jobs share one input; a typed
  handler gets the content's fields.
- A rolled-back producer transaction leaves no input; a reference to an input that
  does not exist, or was redacted, is refused before anything is written; an input
  has its own, larger bound, and a bound all the same.
- Retention deletes an input once no job names it, keeps one a job (or an open
  enqueue) still names.
- Redaction erases the content and leaves the jobs and their history: a job that had
  not started fails INPUT_REDACTED without its handler running, and explain says so.
- The API, `jobctl` and the dashboard (in Chromium) show that a job runs on a stored
  input, its size, sensitive, redacted, and never its content.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from playwright.async_api import expect
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from harness.claim import claim_params
from hybrid_jobs import consumers, outbox
from hybrid_jobs.consumers import Registry
from hybrid_jobs.consumers.store import HELD_HERE, JobStore
from hybrid_jobs.consumers.testing import JobRunner
from hybrid_jobs.outbox.validation import DEFAULT_MAX_PAYLOAD_BYTES
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.relay.retention import delete_finished, delete_unreferenced_inputs
from hybrid_jobs.schema import queries as q
from hybrid_jobs.schema.topology import Topology
from tests.support.api import api_client
from tests.support.dashboard import CHROMIUM, chromium, dashboard_served, sign_in
from tests.support.inproc import both_running, relay_running
from tests.support.jobs import attempts, job, until, wait_for_state, wait_until_all
from tests.support.processes import fleet, jobctl

# What must never reach an operator's screen.
SECRET = "patient 4711: diagnosis Z00.0"


def store(engine: Engine, content: Any, *, sensitive: bool = True) -> uuid.UUID:
    with Session(engine) as session, session.begin():
        return outbox.store_input(session, content, sensitive=sensitive)


def inputs(pg: psycopg.Connection) -> dict[uuid.UUID, Any]:
    rows = pg.execute("SELECT input_id, content FROM job_inputs").fetchall()
    return {row[0]: row[1] for row in rows}


# ------------------------------------------------------------------ running


def test_jobs_on_a_stored_input_run_on_its_content_through_a_real_relay_and_consumer(
    engine: Engine, pg: psycopg.Connection, env: dict[str, str]
) -> None:
    content = {"seconds": 0, "scan": "x" * 20_000, "note": SECRET}
    ref = store(engine, content)
    # named in a later transaction than the one that stored it, by two jobs, beside a
    # job that carries its own payload
    with Session(engine) as session, session.begin():
        shared = [outbox.enqueue(session, "echo", payload_ref=ref) for _ in range(2)]
        plain = outbox.enqueue(session, "echo", {"seconds": 0, "own": True})
    with fleet(env, ["--app", "tests.apps.basic"]) as (relay, (consumer,)):
        asyncio.run(wait_until_all(pg, "SUCCEEDED", 3))
        assert consumer.stop() == 0
        assert relay.stop() == 0
    for job_id in shared:
        row = job(pg, job_id)
        assert row["result"] == content, "the handler read the stored content as job.payload"
        assert (row["payload"], row["payload_ref"]) == (None, ref), "the row holds the reference"
    assert job(pg, plain)["result"] == {"seconds": 0, "own": True}
    assert list(inputs(pg)) == [ref], "stored once, for both"


async def test_a_typed_handler_gets_the_stored_inputs_fields(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
) -> None:
    registry = Registry()

    @registry.handler("ocr")
    async def ocr(job: consumers.Job, *, scan: str, pages: int) -> dict[str, Any]:
        return {"chars": len(scan), "pages": pages, "ref": str(job.payload_ref)}

    ref = store(engine, {"scan": "abc", "pages": 2})
    with Session(engine) as session, session.begin():
        job_id = ocr.with_options(payload_ref=ref).enqueue(session)
        with pytest.raises(TypeError, match="takes no payload of its own"):
            ocr.with_options(payload_ref=ref).enqueue(session, scan="x", pages=1)
    async with both_running(db_url, amqp_url, topology, registry):
        row = await wait_for_state(pg, job_id, "SUCCEEDED", "FAILED", timeout=60)
    assert row["result"] == {"chars": 3, "pages": 2, "ref": str(ref)}, row


async def test_a_plain_batch_pays_nothing_for_stored_inputs(
    engine: Engine, pool: AsyncConnectionPool[AsyncConnection]
) -> None:
    """The plain claim and insert name no input; a claimed batch without a reference
    reads nothing more (with_inputs returns it as it is, without a connection)."""
    assert "job_inputs" not in q.JOB_CLAIM_PLAIN_MANY and "job_inputs" not in q.JOB_CLAIM_MANY
    for insert in (q.JOB_INSERT_PLAIN_MANY, q.JOB_INSERT_MANY, q.JOB_INSERT_UNIQUE_MANY):
        assert "payload_ref" not in insert
    assert "payload_ref" in q.JOB_INSERT_REF_MANY and "payload_ref" in q.JOB_INSERT_UNIQUE_REF_MANY
    with Session(engine) as session, session.begin():
        outbox.enqueue(session, "noop", {"n": 1})
    store_ = JobStore(pool, "w1", lease_seconds=30)
    found = await store_.claim(
        [uuid.UUID(str(r)) for r in await _ids(pool)],
        [_terms("noop")],
        queues=["default"],
        free_threads=1,
        worker_ttl=60,
    )
    assert [c.payload_ref for c in found.claimed] == [None]
    await pool.close()  # a batch without a reference must not need it
    assert await store_.with_inputs(found.claimed) is found.claimed


async def test_a_lease_recovered_after_its_claims_answer_was_lost_still_gets_its_input(
    engine: Engine, pg: psycopg.Connection, pool: AsyncConnectionPool[AsyncConnection]
) -> None:
    """The claim committed, and its answer (or the input read after it) was lost with
    a dropped connection: the next try finds the lease held here, and the recovered
    job has its input's content all the same."""
    content = {"scan": "recovered"}
    ref = store(engine, content)
    with Session(engine) as session, session.begin():
        job_id = outbox.enqueue(session, "noop", payload_ref=ref)
    pg.execute(q.JOB_CLAIM_PLAIN_MANY, claim_params([job_id], "w1"))
    store_ = JobStore(pool, "w1", lease_seconds=30)
    found = await store_.claim(
        [job_id], [_terms("noop")], queues=["default"], free_threads=1, worker_ttl=60
    )
    assert found.missed == {job_id: HELD_HERE}
    (mine,) = await store_.held_by_me([job_id])
    assert (mine.payload, mine.payload_ref, mine.input_redacted) == (content, ref, None)


async def _ids(pool: AsyncConnectionPool[AsyncConnection]) -> list[Any]:
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT job_id FROM jobs")
        return [row[0] for row in await cur.fetchall()]


def _terms(job_type: str) -> dict[str, Any]:
    return {
        "job_type": job_type,
        "max_attempts": 5,
        "backoff_base": 1.0,
        "backoff_cap": 2.0,
        "backoff_jitter": 0.0,
        "sync": False,
        "rate_limit": None,
    }


# ------------------------------------------------------------------ producing


def test_a_rolled_back_transaction_leaves_no_input_and_no_job(
    engine: Engine, pg: psycopg.Connection
) -> None:
    with Session(engine) as session:
        session.begin()
        ref = outbox.store_input(session, {"note": SECRET})
        outbox.enqueue(session, "echo", payload_ref=ref)
        session.rollback()
    assert inputs(pg) == {}
    assert pg.execute("SELECT count(*) FROM jobs").fetchone() == (0,)


def test_a_reference_that_cannot_run_is_refused_before_anything_is_written(
    engine: Engine, pg: psycopg.Connection
) -> None:
    ref = store(engine, {"scan": "abc"})
    with Session(engine) as session, session.begin():
        unknown = uuid.uuid4()
        with pytest.raises(ValueError, match=f"input {unknown}, which does not exist"):
            outbox.enqueue(session, "echo", payload_ref=unknown)
        with pytest.raises(ValueError, match="a payload or a payload_ref, not both"):
            outbox.enqueue(session, "echo", {"a": 1}, payload_ref=ref)
        with pytest.raises(ValueError, match="debounced job takes no payload_ref"):
            outbox.enqueue(
                session, "echo", payload_ref=ref, dedup_key="k", debounce=timedelta(seconds=5)
            )
        with pytest.raises(ValueError, match="not an input id"):
            outbox.enqueue(session, "echo", payload_ref="not-a-uuid")
        with pytest.raises(TypeError, match="payload_ref must be an input id"):
            outbox.enqueue(session, "echo", payload_ref=42)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="sensitive must be a bool"):
            outbox.store_input(session, {}, sensitive="yes")  # type: ignore[arg-type]
        # the transaction is still good: nothing failed in the database
        kept = outbox.enqueue(session, "echo", payload_ref=str(ref))
    assert [row[0] for row in pg.execute("SELECT job_id FROM jobs")] == [kept]
    with Session(engine) as session, session.begin():
        outbox.redact_input(session, ref, reason="erasure request")
    with (
        Session(engine) as session,
        session.begin(),
        pytest.raises(ValueError, match="was redacted at"),
    ):
        outbox.enqueue(session, "echo", payload_ref=ref)


def test_a_job_on_a_stored_input_takes_no_payload_edit(
    engine: Engine, pg: psycopg.Connection
) -> None:
    ref = store(engine, {"scan": "abc"})
    with Session(engine) as session, session.begin():
        job_id = outbox.enqueue(session, "echo", payload_ref=ref)
    with (
        Session(engine) as session,
        session.begin(),
        pytest.raises(outbox.JobNotEditable, match="runs on stored input"),
    ):
        outbox.update_job(session, job_id, payload={"other": 1})
    with Session(engine) as session, session.begin():
        outbox.update_job(session, job_id, priority=5)  # the rest is editable
    row = job(pg, job_id)
    assert (row["payload"], row["payload_ref"], row["priority"]) == (None, ref, 5)


def test_an_input_has_its_own_larger_bound_and_a_bound_all_the_same(
    engine: Engine, pg: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = {"scan": "x" * (DEFAULT_MAX_PAYLOAD_BYTES + 1000)}
    with Session(engine) as session, session.begin():
        with pytest.raises(ValueError, match=r"payload is \d+ bytes .*MAX_PAYLOAD_BYTES"):
            outbox.enqueue(session, "echo", big)
        ref = outbox.store_input(session, big)
        outbox.enqueue(session, "echo", payload_ref=ref)
    size = pg.execute("SELECT size_bytes FROM job_inputs").fetchone()
    assert size == (len(json.dumps(big, separators=(",", ":"))),)
    monkeypatch.setenv("MAX_INPUT_BYTES", "1000")
    with Session(engine) as session, session.begin():
        with pytest.raises(ValueError, match=r"content is \d+ bytes .*MAX_INPUT_BYTES"):
            outbox.store_input(session, {"scan": "x" * 1000})
        with pytest.raises(ValueError, match="NUL"):
            outbox.store_input(session, {"scan": "a\x00b"})
    assert list(inputs(pg)) == [ref]


# ------------------------------------------------------------------ retention


def test_the_database_keeps_every_reference_and_a_plain_job_pays_nothing_for_it(
    engine: Engine, pg: psycopg.Connection
) -> None:
    """The triggers stand in for a foreign key: SQL of one's own cannot name a missing
    input, nor delete a named one; and a job without a reference queues no check."""
    ref = store(engine, {"scan": "abc"})
    insert = "INSERT INTO jobs (job_id, job_type, payload_ref) VALUES (%s, 'hand', %s)"
    with pytest.raises(psycopg.errors.ForeignKeyViolation, match="does not exist"):
        pg.execute(insert, [uuid.uuid4(), uuid.uuid4()])
    plain = pg.execute("EXPLAIN (ANALYZE) " + insert, [uuid.uuid4(), None]).fetchall()
    assert "jobs_payload_ref_check" not in str(plain), plain
    named = pg.execute("EXPLAIN (ANALYZE) " + insert, [uuid.uuid4(), ref]).fetchall()
    assert "Trigger jobs_payload_ref_check: time=" in str(named) and "calls=1" in str(named)
    with pytest.raises(psycopg.errors.ForeignKeyViolation, match="is named by job"):
        pg.execute("DELETE FROM job_inputs WHERE input_id = %s", [ref])
    assert list(inputs(pg)) == [ref]


def test_a_delete_that_began_before_a_reference_committed_is_refused(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl
) -> None:
    """The delete's own look (NOT EXISTS, in its statement's snapshot) saw no job; the
    producer's job committed while the delete waited for the input's row. The
    trigger looks again, with a fresh snapshot, and refuses."""
    ref = store(engine, {"scan": "contested"})
    outcome: list[BaseException | None] = []

    def delete() -> None:
        with psycopg.connect(db_url.conninfo, autocommit=True) as conn:
            try:
                conn.execute(
                    "DELETE FROM job_inputs AS i WHERE i.input_id = %s"
                    " AND NOT EXISTS (SELECT 1 FROM jobs AS j WHERE j.payload_ref = i.input_id)",
                    [ref],
                )
                outcome.append(None)
            except psycopg.Error as exc:
                outcome.append(exc)

    with Session(engine) as session, session.begin():
        job_id = outbox.enqueue(session, "echo", payload_ref=ref)
        thread = threading.Thread(target=delete)
        thread.start()
        asyncio.run(
            until(
                lambda: (
                    pg.execute(
                        "SELECT count(*) FROM pg_stat_activity"
                        " WHERE wait_event_type = 'Lock' AND query LIKE 'DELETE FROM job_inputs%%'"
                    ).fetchone()
                    == (1,)
                ),
                "the delete to wait for the producer's lock",
            )
        )
    thread.join(60)
    assert isinstance(outcome[0], psycopg.errors.ForeignKeyViolation), outcome
    assert job(pg, job_id)["payload_ref"] == ref
    assert list(inputs(pg)) == [ref]


async def test_retention_deletes_an_input_once_no_job_names_it(
    engine: Engine, pg: psycopg.Connection, pool: AsyncConnectionPool[AsyncConnection]
) -> None:
    named = store(engine, {"scan": "named"})
    orphan = store(engine, {"scan": "never enqueued"})
    with Session(engine) as session, session.begin():
        job_id = outbox.enqueue(session, "echo", payload_ref=named)
    # younger than the retention period: a producer may still name it
    assert await delete_unreferenced_inputs(pool, keep_seconds=3600, batch=10) == 0
    assert await delete_unreferenced_inputs(pool, keep_seconds=0, batch=10) == 1
    assert list(inputs(pg)) == [named], "the one a job names stays"
    pg.execute(
        "UPDATE jobs SET state = 'SUCCEEDED', attempt_count = 1, started_at = now(),"
        " finished_at = now() WHERE job_id = %s",
        [job_id],
    )
    assert await delete_unreferenced_inputs(pool, keep_seconds=0, batch=10) == 0
    assert await delete_finished(pool, keep_seconds=0, batch=10) == 1
    assert await delete_unreferenced_inputs(pool, keep_seconds=0, batch=10) == 1
    assert inputs(pg) == {}
    assert orphan not in inputs(pg)


async def test_retention_skips_an_input_an_open_enqueue_names(
    engine: Engine, pg: psycopg.Connection, pool: AsyncConnectionPool[AsyncConnection]
) -> None:
    """The producer's enqueue holds the input (INPUT_LOCK) until it commits: the
    delete passes it over, neither waiting nor failing, and the job keeps it."""
    ref = store(engine, {"scan": "late"})
    with Session(engine) as session, session.begin():
        job_id = outbox.enqueue(session, "echo", payload_ref=ref)
        assert await delete_unreferenced_inputs(pool, keep_seconds=0, batch=10) == 0
    assert job(pg, job_id)["payload_ref"] == ref
    assert await delete_unreferenced_inputs(pool, keep_seconds=0, batch=10) == 0
    assert list(inputs(pg)) == [ref]


async def test_the_relays_retention_round_deletes_unreferenced_inputs(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
) -> None:
    orphan = store(engine, {"scan": "never enqueued"})
    named = store(engine, {"scan": "named"})
    with Session(engine) as session, session.begin():
        outbox.enqueue(session, "nobody_runs_this", payload_ref=named)
    async with relay_running(db_url, amqp_url, topology, keep_finished=0.5, retention_interval=0.2):
        await until(lambda: orphan not in inputs(pg), "retention to delete the orphan", 60)
    assert list(inputs(pg)) == [named]


# ------------------------------------------------------------------ redaction


async def test_a_job_whose_input_was_redacted_before_it_ran_fails_and_history_stays(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
) -> None:
    seen: list[Any] = []
    registry = Registry()

    @registry.handler("ocr")
    async def ocr(job: consumers.Job) -> dict[str, int]:
        seen.append(job.payload)
        return {"chars": len(job.payload["scan"])}

    ref = store(engine, {"scan": SECRET})
    with Session(engine) as session, session.begin():
        ran = outbox.enqueue(session, "ocr", payload_ref=ref)
    async with both_running(db_url, amqp_url, topology, registry):
        await wait_for_state(pg, ran, "SUCCEEDED", timeout=60)
    with Session(engine) as session, session.begin():
        waiting = outbox.enqueue(session, "ocr", payload_ref=ref)
    history = job(pg, ran), attempts(pg, ran)

    with Session(engine) as session, session.begin():
        redacted = outbox.redact_input(session, ref, reason="erasure request 17", by="dpo")
    assert (redacted.redacted, redacted.redacted_by, redacted.redaction_reason) == (
        True,
        "dpo",
        "erasure request 17",
    )
    assert (redacted.jobs, redacted.unfinished) == (2, 1)
    with Session(engine) as session, session.begin():
        again = outbox.redact_input(session, ref, reason="a second time", by="someone")
    assert (again.redacted_at, again.redacted_by) == (redacted.redacted_at, "dpo")
    assert inputs(pg) == {ref: None}, "the content is gone"
    with Session(engine) as session:
        told = outbox.explain(session, waiting)
    assert told.codes[0] == "INPUT_REDACTED", told.codes
    assert told.blockers[0].facts["reason"] == "erasure request 17"
    assert "redacted" in told.summary

    async with both_running(db_url, amqp_url, topology, registry):
        row = await wait_for_state(pg, waiting, "FAILED", "SUCCEEDED", timeout=60)
    assert row["state"] == "FAILED"
    assert row["last_error_code"] == consumers.INPUT_REDACTED == "INPUT_REDACTED"
    assert "redacted" in row["last_error_message"]
    assert "erasure request 17" in row["last_error_message"]
    assert row["attempt_count"] == 1, "it failed at once: no retry brings the content back"
    assert [a["error_code"] for a in attempts(pg, waiting)] == ["INPUT_REDACTED"]
    assert seen == [{"scan": SECRET}], "the handler never ran on nothing"
    assert (job(pg, ran), attempts(pg, ran)) == history, "the finished job is untouched"
    with Session(engine) as session:
        why = outbox.explain(session, waiting)
    assert why.last_error is not None and why.last_error.code == "INPUT_REDACTED"
    with Session(engine) as session, session.begin(), pytest.raises(outbox.InputNotFound):
        outbox.redact_input(session, uuid.uuid4(), reason="x")


async def test_the_test_runner_runs_a_stored_input_and_fails_a_redacted_one(
    engine: Engine, db_url: DatabaseUrl
) -> None:
    """consumers.testing runs handlers as a consumer does: on the content, and never
    on a redacted input."""
    seen: list[Any] = []
    registry = Registry()

    @registry.handler("ocr")
    def ocr(job: consumers.Job) -> None:
        seen.append(job.payload)

    kept, erased = store(engine, {"scan": "kept"}), store(engine, {"scan": SECRET})
    with Session(engine) as session, session.begin():
        runs = outbox.enqueue(session, "ocr", payload_ref=kept)
        fails = outbox.enqueue(session, "ocr", payload_ref=erased)
        outbox.redact_input(session, erased, reason="erasure request 8")
    async with JobRunner(db_url, registry) as runner:
        ran = {r.job_id: r for r in await runner.run_until_idle()}
    assert (ran[runs].state, ran[fails].state) == ("SUCCEEDED", "FAILED")
    assert ran[fails].error_code == "INPUT_REDACTED"
    assert seen == [{"scan": "kept"}]


# ------------------------------------------------------------------ operator surfaces


def _sensitive_job(engine: Engine) -> tuple[uuid.UUID, uuid.UUID]:
    with Session(engine) as session, session.begin():
        ref = outbox.store_input(session, {"note": SECRET}, sensitive=True)
        return outbox.enqueue(session, "ocr", payload_ref=ref), ref


async def test_the_api_shows_a_stored_input_but_never_its_content(
    engine: Engine, db_url: DatabaseUrl
) -> None:
    job_id, ref = _sensitive_job(engine)
    async with api_client(db_url) as client:
        got = await client.get(f"/v1/jobs/{job_id}")
        assert got.status_code == 200, got.text
        assert SECRET not in got.text
        body = got.json()
        assert body["payload"] is None
        assert body["input"]["input_id"] == str(ref)
        assert body["input"]["sensitive"] is True
        assert body["input"]["size_bytes"] == len(
            json.dumps({"note": SECRET}, separators=(",", ":"))
        )
        assert body["input"]["redacted_at"] is None

        shown = await client.get(f"/v1/inputs/{ref}")
        assert shown.status_code == 200 and SECRET not in shown.text
        assert "content" not in shown.json()
        assert (await client.get(f"/v1/inputs/{uuid.uuid4()}")).status_code == 404
        assert (await client.get("/v1/inputs/nope")).status_code == 422

        refused = await client.post(f"/v1/inputs/{ref}/redact", json={})
        assert refused.status_code == 422
        done = await client.post(f"/v1/inputs/{ref}/redact", json={"reason": "erasure 9"})
        assert done.status_code == 200, done.text
        assert done.json()["redaction_reason"] == "erasure 9"
        assert done.json()["redacted_by"].startswith("api")
        after = (await client.get(f"/v1/jobs/{job_id}")).json()
        assert after["input"]["redacted_at"] is not None
    async with api_client(db_url, token=None, headers={}) as anonymous:
        assert (
            await anonymous.post(f"/v1/inputs/{ref}/redact", json={"reason": "x"})
        ).status_code in (401, 403)


def test_jobctl_shows_and_redacts_an_input_without_its_content(
    engine: Engine, pg: psycopg.Connection, db_url: DatabaseUrl, tmp_path: Path
) -> None:
    job_id, ref = _sensitive_job(engine)
    page = jobctl("jobs", "show", str(job_id), url=db_url, cwd=tmp_path)
    assert page.returncode == 0, page.stderr
    assert f"stored input {ref}" in page.stdout and "sensitive" in page.stdout
    assert SECRET not in page.stdout
    shown = jobctl("inputs", "show", str(ref), url=db_url, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "sensitive  yes" in shown.stdout and SECRET not in shown.stdout
    done = jobctl(
        "inputs",
        "redact",
        str(ref),
        "--reason",
        "erasure 5",
        "--by",
        "dpo",
        "--json",
        url=db_url,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert (document["redacted_by"], document["redaction_reason"]) == ("dpo", "erasure 5")
    assert inputs(pg) == {ref: None}
    missing = jobctl("inputs", "show", str(uuid.uuid4()), url=db_url, cwd=tmp_path)
    assert missing.returncode == 1 and "no stored input" in missing.stderr
    bad = jobctl("inputs", "show", "nope", url=db_url, cwd=tmp_path)
    assert bad.returncode == 2 and "not an input id" in bad.stderr


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed")
async def test_the_dashboards_job_page_shows_a_stored_input_but_never_its_content(
    engine: Engine, db_url: DatabaseUrl, tmp_path: Path
) -> None:
    job_id, ref = _sensitive_job(engine)
    with Session(engine) as session, session.begin():
        outbox.enqueue(session, "ocr", payload_ref=ref)
    async with dashboard_served(db_url) as served, chromium(0) as browser:
        page = await browser.new_page()
        await sign_in(page, served.base, then=f"/jobs/{job_id}")
        facts = page.get_by_test_id("stored-input")
        await expect(facts).to_contain_text(str(ref))
        await expect(page.get_by_test_id("input-sensitive")).to_have_text("yes")
        await expect(page.get_by_test_id("input-size")).to_contain_text("bytes")
        await expect(facts).to_contain_text("2 jobs")
        await expect(page.get_by_test_id("payload")).to_have_count(0)
        await page.screenshot(path=str(tmp_path / "stored-input.png"), full_page=True)
        assert SECRET not in await page.content()
        with Session(engine) as session, session.begin():
            outbox.redact_input(session, ref, reason="erasure request 3", by="dpo")
        await page.reload()
        await expect(page.get_by_test_id("input-redacted")).to_contain_text("erasure request 3")
        await page.screenshot(path=str(tmp_path / "stored-input-redacted.png"), full_page=True)
        assert SECRET not in await page.content()
