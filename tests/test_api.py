"""The HTTP API of `jobctl serve`, against the real database: every endpoint, the
token, the limits on input, idempotency, paging, and a job run by a real relay and
consumer seen through the API."""

from __future__ import annotations

import asyncio
import json
import signal
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from hybrid_jobs import consumers, outbox
from hybrid_jobs.consumers.registry import Registry
from hybrid_jobs.jobctl.api.models import EnqueueBody
from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.schema.topology import Topology
from tests.support.api import BEARER, TOKEN, api_client, served
from tests.support.inproc import consumer_running, relay_running
from tests.support.jobs import wait_for_state

PROBLEM = "application/problem+json"


def count_jobs(pg: psycopg.Connection) -> int:
    row = pg.execute("SELECT count(*) FROM jobs").fetchone()
    assert row is not None
    return int(row[0])


def finish(pg: psycopg.Connection, job_id: str, state: str, *, ago: float = 0) -> None:
    """Put a job in a final state as a worker would have (for reading tests)."""
    pg.execute(
        "UPDATE jobs SET state = %s, attempt_count = 1, max_attempts = 5,"
        " started_at = now() - make_interval(secs => %s + 1),"
        " finished_at = now() - make_interval(secs => %s),"
        " last_error_code = CASE WHEN %s = 'FAILED' THEN 'Boom' END WHERE job_id = %s",
        (state, ago, ago, state, job_id),
    )


async def post_job(client: httpx.AsyncClient, **body: Any) -> httpx.Response:
    return await client.post("/v1/jobs", json={"job_type": "greet"} | body)


# ------------------------------------------------------------------ jobs


async def test_enqueue_returns_202_with_location_and_the_job(db_url: DatabaseUrl, pg) -> None:
    run_after = datetime.now(UTC) + timedelta(minutes=5)
    async with api_client(db_url) as client:
        sent = await post_job(
            client,
            payload={"to": "ada"},
            queue="mail",
            tenant="acme",
            priority=3,
            run_after=run_after.isoformat(),
            max_attempts=7,
        )
        assert sent.status_code == 202, sent.text
        job = sent.json()
        assert sent.headers["Location"] == f"/v1/jobs/{job['id']}"
        assert 1 <= int(sent.headers["Retry-After"]) <= 60
        assert job["state"] == "QUEUED" and job["done"] is False
        assert (job["queue"], job["tenant"], job["priority"], job["max_attempts"]) == (
            "mail",
            "acme",
            3,
            7,
        )
        assert job["payload"] == {"to": "ada"}
        assert datetime.fromisoformat(job["run_after"]) == run_after
        got = await client.get(sent.headers["Location"])
        assert got.status_code == 200
        assert got.json()["id"] == job["id"] and got.json()["attempts"] == []
        assert got.headers["Retry-After"] == "60", "at most a minute between polls"
    # Written through outbox.enqueue: the job and its wake-up.
    assert pg.execute("SELECT count(*) FROM outbox WHERE job_id = %s", (job["id"],)).fetchone() == (
        1,
    )


async def test_a_null_payload_is_json_null_and_an_absent_one_an_empty_object(
    db_url: DatabaseUrl, pg
) -> None:
    async with api_client(db_url) as client:
        null = await post_job(client, payload=None)
        absent = await post_job(client)
    assert (null.status_code, null.json()["payload"]) == (202, None)
    assert (absent.status_code, absent.json()["payload"]) == (202, {})
    for sent, kind in ((null, "null"), (absent, "object")):
        row = pg.execute(
            "SELECT jsonb_typeof(payload) FROM jobs WHERE job_id = %s", (sent.json()["id"],)
        ).fetchone()
        assert row == (kind,)


async def test_enqueue_takes_a_deadline_and_a_rate_limit(db_url: DatabaseUrl, pg) -> None:
    expires = datetime.now(UTC) + timedelta(minutes=5)
    async with api_client(db_url) as client:
        sent = await post_job(client, expires=expires.isoformat(), rate_limit="stripe")
        assert sent.status_code == 202, sent.text
        naive = await post_job(client, expires="2030-01-01T00:00:00")
        assert naive.status_code == 422
    row = pg.execute(
        "SELECT expires_at, rate_limit FROM jobs WHERE job_id = %s", (sent.json()["id"],)
    ).fetchone()
    assert row == (expires, "stripe")


async def test_enqueue_takes_a_weight_a_stored_input_and_a_webhook(
    db_url: DatabaseUrl, engine: Engine, pg
) -> None:
    """What outbox.enqueue takes, POST /v1/jobs takes: a weight, a stored input in
    place of a payload (none given is none, not {}), and a URL to call at the end."""
    with Session(engine) as session, session.begin():
        ref = outbox.store_input(session, {"scan": "big"}, sensitive=True)
    async with api_client(db_url) as client:
        sent = await post_job(
            client,
            weight=3,
            payload_ref=str(ref),
            on_complete_url="HTTPS://hooks.example.com/done",
        )
        assert sent.status_code == 202, sent.text
        both = await post_job(client, payload={"x": 1}, payload_ref=str(ref))
        assert both.status_code == 422, both.text
        missing = await post_job(client, payload_ref=str(uuid.uuid4()))
        assert missing.status_code == 422, missing.text
        bad_url = await post_job(client, on_complete_url="ftp://example.com/x")
        assert bad_url.status_code == 422 and "on_complete_url" in bad_url.text
        too_heavy = await post_job(client, weight=101)
        assert too_heavy.status_code == 422, too_heavy.text
    row = pg.execute(
        "SELECT weight, payload_ref, payload, webhook_url FROM jobs WHERE job_id = %s",
        (sent.json()["id"],),
    ).fetchone()
    assert row == (3, ref, None, "https://hooks.example.com/done")


async def test_enqueue_debounces_like_outbox(db_url: DatabaseUrl, pg) -> None:
    async with api_client(db_url) as client:
        body = {"dedup_key": "reindex:42", "debounce": 30, "debounce_max": 60}
        first = await post_job(client, payload={"n": 1}, **body)
        assert first.status_code == 202, first.text
        again = await post_job(client, payload={"n": 2}, **body)
        assert again.status_code == 200, "it replaced the waiting job"
        assert again.json()["id"] == first.json()["id"]
        assert again.json()["payload"] == {"n": 2}
        # Refused as outbox.enqueue refuses them, before anything is written.
        for bad in (
            {"debounce": 2},  # no dedup_key
            {"dedup_key": "d", "debounce_max": 5},  # no debounce
            {"dedup_key": "d", "debounce": 5, "debounce_max": 2},
            {"dedup_key": "d", "debounce": -1},
            {"dedup_key": "d", "debounce": "soon"},
            {"dedup_key": "d", "debounce": 2, "key": "a"},
            {"dedup_key": "d", "debounce": 2, "run_after": datetime.now(UTC).isoformat()},
        ):
            refused = await post_job(client, **bad)
            assert refused.status_code == 422, (bad, refused.text)
    row = pg.execute(
        "SELECT count(*), min(debounce_key), min(payload->>'n'),"
        " round(EXTRACT(EPOCH FROM min(run_after) - min(created_at))),"
        " round(EXTRACT(EPOCH FROM min(debounce_until) - min(created_at)))"
        " FROM jobs"
    ).fetchone()
    # One job, its start debounce after the last enqueue, bounded by debounce_max.
    assert row == (1, "reindex:42", "2", 30, 60)


async def test_unknown_and_malformed_ids_are_404(db_url: DatabaseUrl) -> None:
    async with api_client(db_url) as client:
        for path in (f"/v1/jobs/{uuid.uuid4()}", "/v1/jobs/not-a-uuid", "/v1/jobs/%00"):
            found = await client.get(path)
            assert found.status_code == 404, path
            assert found.headers["content-type"] == PROBLEM
            assert found.json()["status"] == 404 and found.json()["detail"]
        cancel = await client.post("/v1/jobs/nope/cancel")
        assert cancel.status_code == 404


async def test_cancel_a_waiting_job_then_again_then_a_finished_one(db_url: DatabaseUrl, pg) -> None:
    async with api_client(db_url) as client:
        first = (await post_job(client)).json()["id"]
        done = await client.post(f"/v1/jobs/{first}/cancel")
        assert done.status_code == 200
        assert done.json() == {
            "id": first,
            "state": "CANCELLED",
            "applied": True,
            "not_allowed": None,
        }
        again = await client.post(f"/v1/jobs/{first}/cancel")
        assert again.status_code == 200 and again.json()["state"] == "CANCELLED"
        second = (await post_job(client)).json()["id"]
        finish(pg, second, "SUCCEEDED")
        refused = await client.post(f"/v1/jobs/{second}/cancel")
        assert refused.status_code == 409
        assert refused.json()["state"] == "SUCCEEDED" and "SUCCEEDED" in refused.json()["detail"]
        shown = (await client.get(f"/v1/jobs/{first}")).json()
        assert shown["done"] is True and shown["cancel_requested_at"] is not None
        assert "Retry-After" not in (await client.get(f"/v1/jobs/{first}")).headers


async def test_retry_one_job_then_many(db_url: DatabaseUrl, pg) -> None:
    async with api_client(db_url) as client:
        ids = [(await post_job(client, queue="mail")).json()["id"] for _ in range(4)]
        for job_id in ids[:3]:
            finish(pg, job_id, "FAILED")
        one = await client.post(f"/v1/jobs/{ids[0]}/retry")
        assert one.status_code == 200, one.text
        assert one.json() == {
            "id": ids[0],
            "state": "QUEUED",
            "applied": True,
            "not_allowed": None,
        }
        refused = await client.post(f"/v1/jobs/{ids[3]}/retry")
        assert refused.status_code == 409 and refused.json()["state"] == "QUEUED"
        assert (await client.post(f"/v1/jobs/{uuid.uuid4()}/retry")).status_code == 404

        dry = await client.post("/v1/jobs/retry", json={"queue": "mail", "dry_run": True})
        assert dry.json() == {"matched": 2, "dry_run": True, "jobs": None, "not_allowed": 0}
        assert [r[0] for r in pg.execute("SELECT state FROM jobs WHERE state = 'FAILED'")] == [
            "FAILED",
            "FAILED",
        ], "a dry run changes nothing"
        other = await client.post("/v1/jobs/retry", json={"queue": "web"})
        assert other.json() == {"matched": 0, "dry_run": False, "jobs": None, "not_allowed": 0}
        many = await client.post("/v1/jobs/retry", json={"queue": "mail", "error_code": "Boom"})
        assert many.json() == {"matched": 2, "dry_run": False, "jobs": None, "not_allowed": 0}
        bad = await client.post("/v1/jobs/retry", json={"limit": 0})
        assert bad.status_code == 422 and bad.json()["detail"].startswith("limit")
        shown = (await client.get(f"/v1/jobs/{ids[1]}")).json()
    assert shown["state"] == "QUEUED" and shown["last_error"]["code"] == "Boom"
    replays = pg.execute("SELECT replayed_by FROM job_replays").fetchall()
    assert len(replays) == 3 and all(r[0].startswith("api") for r in replays)


async def test_pause_a_queue_and_see_why_its_jobs_wait(db_url: DatabaseUrl) -> None:
    async with api_client(db_url) as client:
        job_id = (await post_job(client, queue="mail")).json()["id"]
        paused = await client.post("/v1/queues/mail/pause")
        assert paused.status_code == 200
        assert (paused.json()["paused"], paused.json()["changed"]) == (True, True)
        assert (await client.post("/v1/queues/mail/pause")).json()["changed"] is False
        (mail,) = [
            q for q in (await client.get("/v1/queues")).json()["queues"] if q["queue"] == "mail"
        ]
        assert mail["paused"] is True and mail["paused_by"].startswith("api")
        why = (await client.get(f"/v1/jobs/{job_id}")).json()["why"]
        assert "QUEUE_PAUSED" in [b["code"] for b in why["blockers"]]
        assert "paused" in why["summary"]
        resumed = await client.post("/v1/queues/mail/resume")
        assert (resumed.json()["paused"], resumed.json()["changed"]) == (False, True)
        why = (await client.get(f"/v1/jobs/{job_id}")).json()["why"]
        assert "QUEUE_PAUSED" not in [b["code"] for b in why["blockers"]]
        assert (await client.post("/v1/queues/no%20way/pause")).status_code == 422


# ------------------------------------------------------------------ the token


async def test_without_a_token_reads_are_open_and_changes_refused(db_url: DatabaseUrl, pg) -> None:
    async with api_client(db_url, token=None) as client:
        refused = await post_job(client)
        assert refused.status_code == 403
        assert refused.headers["content-type"] == PROBLEM
        assert "JOBCTL_API_TOKEN" in refused.json()["detail"]
        assert (await client.post(f"/v1/jobs/{uuid.uuid4()}/cancel")).status_code == 403
        assert (await client.put("/v1/tenants/acme", json={})).status_code == 403
        assert (await client.get("/v1/jobs")).status_code == 200
        assert (await client.get("/v1/queues")).status_code == 200
    assert count_jobs(pg) == 0


async def test_a_missing_or_wrong_token_gets_401(db_url: DatabaseUrl, pg) -> None:
    async with api_client(db_url, headers={}) as client:
        missing = await post_job(client)
        assert missing.status_code == 401
        assert missing.headers["WWW-Authenticate"] == 'Bearer realm="hybrid-jobs"'
        assert "bearer token" in missing.json()["detail"]
        wrong = await client.post(
            "/v1/jobs", json={"job_type": "x"}, headers={"Authorization": "Bearer nope"}
        )
        assert wrong.status_code == 401 and "wrong" in wrong.json()["detail"]
        # A server with a token wants it for reads too: payloads are not public.
        assert (await client.get("/v1/jobs")).status_code == 401
        # Probes and the document need none; metrics are reads.
        for path in ("/healthz", "/openapi.json"):
            assert (await client.get(path)).status_code == 200, path
        assert (await client.get("/metrics")).status_code == 401
        assert count_jobs(pg) == 0
        right = await client.post("/v1/jobs", json={"job_type": "x"}, headers=BEARER)
        assert right.status_code == 202
    assert count_jobs(pg) == 1


# ------------------------------------------------------------------ input


async def test_a_large_body_gets_413_and_writes_nothing(db_url: DatabaseUrl, pg) -> None:
    async with api_client(db_url, max_body_bytes=4096) as client:
        big = await post_job(client, payload={"blob": "x" * 5000})
        assert big.status_code == 413
        assert big.headers["content-type"] == PROBLEM
        assert "4096" in big.json()["detail"]

        # Streamed without a Content-Length: refused as it passes the limit.
        async def chunks() -> Any:
            yield b'{"job_type": "greet", "payload": "'
            for _ in range(10):
                yield b"y" * 1000
            yield b'"}'

        streamed = await client.post(
            "/v1/jobs", content=chunks(), headers={"content-type": "application/json"}
        )
        assert streamed.status_code == 413
        assert (await post_job(client, payload={"blob": "x" * 100})).status_code == 202
    assert count_jobs(pg) == 1


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"job_type": "greet", "queue": "no spaces"}, "queue"),
        ({"job_type": "greet", "tenant": "-starts-with-dash"}, "tenant"),
        ({"job_type": ""}, "job_type"),
        ({"job_type": "a\u0000b"}, "job_type"),
        ({"job_type": "greet", "priority": 40000}, "priority"),
        ({"job_type": "greet", "max_attempts": 0}, "max_attempts"),
        ({"job_type": "greet", "run_after": "2030-01-01T00:00:00"}, "run_after"),
        ({"job_type": "greet", "run_after": "0001-01-01T00:00:00+14:00"}, "run_after"),
        ({"job_type": "greet", "surprise": 1}, "surprise"),
        ({"payload": {}}, "job_type"),
        ({"job_type": "greet", "payload": {"a": "nul\u0000"}}, "payload"),
        pytest.param(
            {
                "job_type": "greet",
                "run_after": "2030-01-02T00:00:00Z",
                "expires": "2030-01-01T00:00:00Z",
            },
            "run_after",
            id="run_after-later-than-expires",
        ),
    ],
)
async def test_invalid_input_gets_422_naming_the_field(
    db_url: DatabaseUrl, pg, body: dict[str, Any], field: str
) -> None:
    async with api_client(db_url) as client:
        refused = await client.post("/v1/jobs", json=body)
    assert refused.status_code == 422, refused.text
    assert refused.headers["content-type"] == PROBLEM
    problem = refused.json()
    assert problem["detail"].startswith(f"{field}"), problem
    assert any(e["field"].endswith(field) for e in problem["errors"]), problem
    assert count_jobs(pg) == 0


async def test_a_key_and_a_resource_together_are_422_naming_a_body_field(
    db_url: DatabaseUrl, pg
) -> None:
    async with api_client(db_url) as client:
        refused = await post_job(client, key="user:1", resource="deploy:prod")
    assert refused.status_code == 422, refused.text
    problem = refused.json()
    assert "a key or a resource, not both" in problem["detail"]
    assert [e["field"] for e in problem["errors"]] == ["body.key"], problem
    assert count_jobs(pg) == 0


# Combinations the request model lets through and enqueue refuses, each with the
# field its message is about.
ENQUEUE_REFUSALS = [
    pytest.param({"key": "k", "resource": "r"}, "key", id="key-and-resource"),
    pytest.param({"key_limit": 2}, "key_limit", id="key_limit-without-key"),
    pytest.param({"ordered": True}, "ordered", id="ordered-without-key"),
    pytest.param({"key": "k", "ordered": "strict", "key_limit": 2}, "ordered", id="ordered-limit"),
    pytest.param({"debounce": 1.0}, "debounce", id="debounce-without-dedup_key"),
    pytest.param({"debounce_max": 1.0}, "debounce_max", id="debounce_max-alone"),
    pytest.param(
        {"dedup_key": "d", "debounce": 2.0, "debounce_max": 1.0},
        "debounce_max",
        id="debounce_max-below-debounce",
    ),
    pytest.param({"dedup_key": "d", "debounce": 1.0, "key": "k"}, "key", id="debounce-key"),
    pytest.param(
        {"dedup_key": "d", "debounce": 1.0, "resource": "r"}, "resource", id="debounce-resource"
    ),
    pytest.param(
        {"needs_approval": True, "run_after": "2030-01-01T00:00:00Z"},
        "needs_approval",
        id="approval-run_after",
    ),
    pytest.param(
        {"after": [str(uuid.uuid4())], "run_after": "2030-01-01T00:00:00Z"},
        "after",
        id="after-run_after",
    ),
    pytest.param(
        {"run_after": "2030-01-02T00:00:00Z", "expires": "2030-01-01T00:00:00Z"},
        "run_after",
        id="run_after-later-than-expires",
    ),
]


@pytest.mark.parametrize(("body", "field"), ENQUEUE_REFUSALS)
async def test_enqueue_refusals_name_a_field_of_the_body(
    db_url: DatabaseUrl, pg, body: dict[str, Any], field: str
) -> None:
    async with api_client(db_url) as client:
        refused = await post_job(client, **body)
    assert refused.status_code == 422, refused.text
    assert refused.headers["content-type"] == PROBLEM
    (error,) = refused.json()["errors"]
    assert error["field"] == f"body.{field}", error
    assert field in EnqueueBody.model_fields
    assert count_jobs(pg) == 0


async def test_invalid_queries_get_422_naming_the_parameter(db_url: DatabaseUrl) -> None:
    async with api_client(db_url) as client:
        for query, name in [
            ("state=DONE", "state"),
            ("limit=0", "limit"),
            ("limit=501", "limit"),
            ("queue=a%20b", "queue"),
            ("after=garbage", "after"),
        ]:
            refused = await client.get(f"/v1/jobs?{query}")
            assert refused.status_code == 422, query
            assert refused.json()["detail"].startswith(name), (query, refused.json())


async def test_backpressure_is_429_with_retry_after(db_url: DatabaseUrl, pg) -> None:
    async with api_client(db_url) as client:
        limits = await client.put("/v1/tenants/acme", json={"max_queued": 1})
        assert limits.status_code == 201, limits.text
        assert (await post_job(client, tenant="acme")).status_code == 202
        refused = await post_job(client, tenant="acme")
        assert refused.status_code == 429
        assert int(refused.headers["Retry-After"]) >= 1
        assert refused.json()["tenant"] == "acme"
    assert count_jobs(pg) == 1


# ------------------------------------------------------------------ idempotency


async def test_the_same_idempotency_key_returns_the_same_job(db_url: DatabaseUrl, pg) -> None:
    key = {"Idempotency-Key": "order-42"}
    async with api_client(db_url) as client:
        first = await client.post(
            "/v1/jobs", json={"job_type": "bill", "payload": {"n": 1}}, headers=key
        )
        assert first.status_code == 202 and "Idempotent-Replayed" not in first.headers
        again = await client.post(
            "/v1/jobs", json={"payload": {"n": 1}, "job_type": "bill"}, headers=key
        )
        assert again.status_code == 202
        assert again.json()["id"] == first.json()["id"]
        assert again.headers["Idempotent-Replayed"] == "true"
        assert again.headers["Location"] == first.headers["Location"]
        # The key is the API's own: not a dedup key, and for any job type.
        assert first.json()["dedup_key"] is None
        other = await client.post("/v1/jobs", json={"job_type": "ship"}, headers=key)
        assert other.status_code == 422 and "Idempotency-Key" in other.json()["detail"]
    assert count_jobs(pg) == 1


@pytest.mark.parametrize(
    "change",
    [
        {"payload": {"n": 2}},
        {"queue": "other"},
        {"priority": 1},
        {"max_attempts": 3},
        {"tenant": "acme"},
        {"run_after": "2031-01-01T00:00:00+00:00"},
    ],
)
async def test_the_same_key_with_another_request_is_422_and_writes_nothing(
    db_url: DatabaseUrl, pg, change: dict[str, Any]
) -> None:
    key = {"Idempotency-Key": "order-43"}
    body = {"job_type": "bill", "payload": {"n": 1}}
    async with api_client(db_url) as client:
        first = await client.post("/v1/jobs", json=body, headers=key)
        assert first.status_code == 202
        before = pg.execute("SELECT count(*), max(updated_at) FROM outbox, jobs").fetchone()
        refused = await client.post("/v1/jobs", json=body | change, headers=key)
        assert refused.status_code == 422, refused.text
        assert refused.headers["content-type"] == PROBLEM
        assert "Idempotency-Key" in refused.json()["detail"]
    assert count_jobs(pg) == 1
    assert pg.execute("SELECT count(*), max(updated_at) FROM outbox, jobs").fetchone() == before


async def test_a_repeat_is_answered_even_when_the_tenant_is_full(db_url: DatabaseUrl) -> None:
    key = {"Idempotency-Key": "k1"}
    async with api_client(db_url) as client:
        await client.put("/v1/tenants/acme", json={"max_queued": 1})
        first = await client.post("/v1/jobs", json={"job_type": "x", "tenant": "acme"}, headers=key)
        again = await client.post("/v1/jobs", json={"job_type": "x", "tenant": "acme"}, headers=key)
    assert (first.status_code, again.status_code) == (202, 202)
    assert first.json()["id"] == again.json()["id"]


async def test_concurrent_requests_with_one_key_make_one_job(db_url: DatabaseUrl, pg) -> None:
    key = {"Idempotency-Key": "race"}
    async with api_client(db_url) as client:
        answers = await asyncio.gather(
            *(client.post("/v1/jobs", json={"job_type": "x"}, headers=key) for _ in range(8))
        )
    assert {a.status_code for a in answers} == {202}
    assert len({a.json()["id"] for a in answers}) == 1
    assert count_jobs(pg) == 1


async def test_a_malformed_idempotency_key_is_422(db_url: DatabaseUrl, pg) -> None:
    async with api_client(db_url) as client:
        long = await client.post(
            "/v1/jobs", json={"job_type": "x"}, headers={"Idempotency-Key": "k" * 300}
        )
        assert long.status_code == 422 and "Idempotency-Key" in long.json()["detail"]
    assert count_jobs(pg) == 0


# ------------------------------------------------------------------ lists


async def walk(client: httpx.AsyncClient, query: str) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    after: str | None = None
    for _ in range(100):
        params = query + (f"&after={after}" if after else "")
        page = await client.get(f"/v1/jobs?{params}")
        assert page.status_code == 200, page.text
        body = page.json()
        seen += body["jobs"]
        after = body["next"]
        if after is None:
            return seen
    raise AssertionError("more than 100 pages")


async def test_keyset_paging_has_no_duplicates_or_gaps(db_url: DatabaseUrl, pg) -> None:
    async with api_client(db_url) as client:
        ids = [(await post_job(client, queue=f"q{i % 2}")).json()["id"] for i in range(23)]
        for i, job_id in enumerate(ids[:9]):
            finish(pg, job_id, "FAILED" if i % 3 else "SUCCEEDED", ago=100 - i)
        everything = await walk(client, "limit=4")
        assert [j["id"] for j in everything] == list(reversed(ids)), "newest first, each once"
        waiting = await walk(client, "limit=3&state=QUEUED&queue=q1")
        assert [j["id"] for j in waiting] == [i for i in reversed(ids[9:]) if ids.index(i) % 2 == 1]
        failed = await walk(client, "limit=2&state=FAILED")
        # Finished lists run by finish time, newest first.
        assert [j["id"] for j in failed] == [ids[i] for i in (8, 7, 5, 4, 2, 1)]
        typed = await walk(client, "limit=5&job_type=greet&queue=q0")
        assert [j["id"] for j in typed] == [i for i in reversed(ids) if ids.index(i) % 2 == 0]


async def test_a_list_stays_consistent_while_jobs_are_added(db_url: DatabaseUrl) -> None:
    async with api_client(db_url) as client:
        ids = [(await post_job(client)).json()["id"] for _ in range(6)]
        first = (await client.get("/v1/jobs?limit=3")).json()
        newer = [(await post_job(client)).json()["id"] for _ in range(3)]
        second = (await client.get(f"/v1/jobs?limit=3&after={first['next']}")).json()
    # Jobs added at the head do not shift the pages behind it.
    assert [j["id"] for j in first["jobs"] + second["jobs"]] == list(reversed(ids))
    assert not set(newer) & {j["id"] for j in second["jobs"]}


# ------------------------------------------------------------------ the rest


async def test_queues_schedules_tenants_workers(db_url: DatabaseUrl, engine: Engine, pg) -> None:
    with Session(engine) as session, session.begin():
        outbox.schedule(session, "nightly", "report", {"kind": "daily"}, cron="0 3 * * *")
    async with api_client(db_url) as client:
        await post_job(client, queue="mail")
        queues = (await client.get("/v1/queues")).json()
        (mail,) = [q for q in queues["queues"] if q["queue"] == "mail"]
        assert mail["queued"] == 1 and mail["outbox_pending"] == 1 and mail["paused"] is False
        assert queues["window_seconds"] == 60

        (nightly,) = (await client.get("/v1/schedules")).json()["schedules"]
        assert (nightly["name"], nightly["cron"], nightly["paused"]) == (
            "nightly",
            "0 3 * * *",
            False,
        )
        paused = await client.post("/v1/schedules/nightly/pause")
        assert paused.status_code == 200 and paused.json()["paused"] is True
        resumed = await client.post("/v1/schedules/nightly/resume")
        assert resumed.json()["paused"] is False
        triggered = await client.post("/v1/schedules/nightly/trigger")
        assert triggered.status_code == 202
        job = triggered.json()
        assert (job["job_type"], job["payload"]) == ("report", {"kind": "daily"})
        assert triggered.headers["Location"] == f"/v1/jobs/{job['id']}"
        assert (await client.post("/v1/schedules/nope/trigger")).status_code == 404

        put = await client.put("/v1/tenants/acme", json={"max_running": 2, "weight": 3})
        assert put.status_code == 201
        (acme,) = (await client.get("/v1/tenants")).json()["tenants"]
        assert (acme["tenant"], acme["max_running"], acme["weight"], acme["max_queued"]) == (
            "acme",
            2,
            3.0,
            None,
        )
        assert acme["queued"] is None, "no max_queued: its waiting jobs are not counted"
        bad = await client.put("/v1/tenants/acme", json={"weight": 0})
        assert bad.status_code == 422 and bad.json()["detail"].startswith("weight")

        pg.execute(
            "INSERT INTO workers (worker_id, host, pid, queues, job_types, concurrency, prefetch)"
            " VALUES ('w1', 'box', 42, '{mail}', '{greet}', 4, 8)"
        )
        (worker,) = (await client.get("/v1/workers")).json()["workers"]
        assert (worker["worker_id"], worker["live"], worker["running"]) == ("w1", True, 0)
        assert worker["lapsed"] is False
        pg.execute("UPDATE workers SET lease_lapsed_at = now() WHERE worker_id = 'w1'")
        (worker,) = (await client.get("/v1/workers")).json()["workers"]
        assert (worker["live"], worker["lapsed"]) == (False, True)
        pg.execute("UPDATE workers SET last_seen_at = now() + interval '1 second'")
        mail = [
            q for q in (await client.get("/v1/queues")).json()["queues"] if q["queue"] == "mail"
        ]
        assert (mail[0]["workers"], mail[0]["concurrency"]) == (1, 4)


async def test_health_and_readiness(db_url: DatabaseUrl) -> None:
    async with api_client(db_url) as client:
        assert (await client.get("/healthz")).json() == {"status": "ok"}
        ready = await client.get("/readyz")
        assert ready.status_code == 200 and ready.json()["ready"] is True
    # A broker nobody listens on: not ready, and which service says why.
    async with api_client(db_url, AmqpUrl.parse("amqp://guest:guest@127.0.0.1:1/")) as client:
        ready = await client.get("/readyz")
    assert ready.status_code == 503
    checks = {c["service"]: c for c in ready.json()["checks"]}
    assert checks["postgresql"]["ok"] is True
    assert checks["rabbitmq"]["ok"] is False and checks["rabbitmq"]["detail"]


async def test_metrics_are_served_from_the_collector(db_url: DatabaseUrl, engine: Engine) -> None:
    with Session(engine) as session, session.begin():
        outbox.enqueue(session, "greet", {}, queue="mail")
    async with api_client(db_url, metrics=True) as client:
        # The collector's first round runs at start-up, in the background.
        async with asyncio.timeout(30):
            while True:
                answer = await client.get("/metrics")
                if 'hybrid_jobs_jobs{queue="mail",state="QUEUED"} 1.0' in answer.text:
                    break
                await asyncio.sleep(0.05)
    assert answer.headers["content-type"].startswith("text/plain")
    assert "hybrid_jobs_collector_last_success_timestamp_seconds" in answer.text


async def test_openapi_document_lists_every_endpoint(db_url: DatabaseUrl) -> None:
    async with api_client(db_url) as client:
        document = (await client.get("/openapi.json")).json()
    paths = {(m.upper(), p) for p, ops in document["paths"].items() for m in ops}
    assert {
        ("POST", "/v1/jobs"),
        ("GET", "/v1/jobs"),
        ("GET", "/v1/jobs/{job_id}"),
        ("POST", "/v1/jobs/{job_id}/cancel"),
        ("POST", "/v1/jobs/{job_id}/retry"),
        ("POST", "/v1/jobs/retry"),
        ("POST", "/v1/queues/{queue}/pause"),
        ("POST", "/v1/queues/{queue}/resume"),
        ("GET", "/v1/queues"),
        ("GET", "/v1/schedules"),
        ("GET", "/v1/tenants"),
        ("GET", "/v1/workers"),
        ("GET", "/healthz"),
        ("GET", "/readyz"),
        ("GET", "/metrics"),
    } <= paths
    problem = document["paths"]["/v1/jobs"]["post"]["responses"]["422"]["content"]
    assert list(problem) == [PROBLEM]
    assert "bearer" in json.dumps(document["components"]["securitySchemes"]).lower()


# ------------------------------------------------------------------ end to end


async def test_a_job_enqueued_through_the_api_runs_and_shows_progress_and_result(
    db_url: DatabaseUrl, amqp_url: AmqpUrl, topology: Topology, pg
) -> None:
    registry = Registry()
    release = asyncio.Event()

    @registry.handler("resize", queue="images")
    async def resize(job: consumers.Job) -> dict[str, Any]:
        await job.progress(1, total=2, stage="halfway")
        await release.wait()
        return {"width": job.payload["width"] // 2}

    async with (
        api_client(db_url, amqp_url) as client,
        relay_running(db_url, amqp_url, topology),
        consumer_running(db_url, amqp_url, topology, registry),
    ):
        sent = await client.post(
            "/v1/jobs", json={"job_type": "resize", "queue": "images", "payload": {"width": 640}}
        )
        job_id = sent.json()["id"]
        async with asyncio.timeout(30):
            while True:
                running = (await client.get(f"/v1/jobs/{job_id}")).json()
                if running["progress"] is not None:
                    break
                await asyncio.sleep(0.05)
        assert running["state"] == "RUNNING"
        assert running["progress"] == {"done": 1, "total": 2, "stage": "halfway"}
        assert running["lease"]["worker"] and running["attempt"] == 1
        assert (await client.get(f"/v1/jobs/{job_id}")).headers["Retry-After"] == "2"
        (worker,) = (await client.get("/v1/workers")).json()["workers"]
        assert worker["running"] == 1
        release.set()
        await wait_for_state(pg, uuid.UUID(job_id), "SUCCEEDED")
        done = (await client.get(f"/v1/jobs/{job_id}")).json()
    assert done["done"] is True and done["result"] == {"width": 320}
    (attempt,) = done["attempts"]
    assert (attempt["attempt"], attempt["outcome"]) == (1, "SUCCEEDED")


def test_jobctl_serve_answers_over_http_and_stops_on_sigterm(db_url: DatabaseUrl) -> None:
    with served(db_url) as (base, daemon):
        sent = httpx.post(f"{base}/v1/jobs", json={"job_type": "x"}, headers=BEARER, timeout=10)
        assert sent.status_code == 202
        got = httpx.get(f"{base}{sent.headers['Location']}", headers=BEARER, timeout=10)
        assert got.json()["state"] == "QUEUED"
        assert httpx.get(f"{base}/readyz", timeout=10).status_code == 200
        assert httpx.get(f"{base}/v1/jobs", timeout=10).status_code == 401
        daemon.signal(signal.SIGTERM)
        assert daemon.proc.wait(20) == 0
        events = daemon.events()
    requests = [e for e in events if e.get("event") == "api.request"]
    assert {(e["method"], e["status"]) for e in requests} >= {("POST", 202), ("GET", 401)}
    assert TOKEN not in daemon.text(), "the token is never logged"


def test_jobctl_serve_without_a_token_says_it_is_read_only(db_url: DatabaseUrl) -> None:
    with served(db_url, token=None) as (base, daemon):
        refused = httpx.post(f"{base}/v1/jobs", json={"job_type": "x"}, timeout=10)
        assert refused.status_code == 403
        warning = daemon.wait_for_event("api.read_only")
    assert "JOBCTL_API_TOKEN" in warning["detail"]
