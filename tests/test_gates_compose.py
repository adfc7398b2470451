"""Where the gates meet: a job is admitted only if every gate it uses admits it, and
a job one gate turns down takes nothing from another (check all, then take all).
Each test names the defect it guards against."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import psycopg
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from harness.claim import claim_params
from hybrid_jobs import outbox
from hybrid_jobs.schema import queries as q
from tests.support.jobs import enqueue, job


def _claim(pg: psycopg.Connection, ids: list[uuid.UUID], worker: str = "w1") -> dict[Any, str]:
    rows = pg.execute(q.JOB_CLAIM_MANY, claim_params(ids, worker)).fetchall()
    return {row[1]: row[0] for row in rows}


def _tokens(pg: psycopg.Connection, name: str) -> float:
    row = pg.execute("SELECT tokens FROM rate_buckets WHERE name = %s", [name]).fetchone()
    assert row is not None
    return float(row[0])


def _limit(engine: Engine, name: str, **kw: Any) -> None:
    with Session(engine) as session, session.begin():
        outbox.set_rate_limit(session, name, **kw)


def test_a_job_another_gate_turns_down_spends_no_rate_token(
    engine: Engine, pg: psycopg.Connection
) -> None:
    # 3 a minute. Jobs under that limit are turned down for a busy resource, a
    # tenant at its cap and a busy key: the bucket keeps its three tokens (it went
    # 2, 1, 0 when the token was taken before the other gates looked), and the
    # first job whose gates all admit it then takes one.
    _limit(engine, "api", rate=3, per=timedelta(minutes=1), burst=3)
    with Session(engine) as session, session.begin():
        outbox.set_tenant_limit(session, "acme", max_running=1)
    holders = [
        enqueue(engine, "noop", resource="deploy:prod"),
        enqueue(engine, "noop", tenant="acme"),
        enqueue(engine, "noop", key="account:1"),
    ]
    assert set(_claim(pg, holders).values()) == {"claimed"}
    refused = {
        enqueue(engine, "noop", rate_limit="api", resource="deploy:prod"): "RESOURCE_BUSY",
        enqueue(engine, "noop", rate_limit="api", tenant="acme"): "TENANT_CAP",
        enqueue(engine, "noop", rate_limit="api", key="account:1"): "KEY_BUSY",
    }
    for job_id, why in refused.items():
        assert _claim(pg, [job_id]) == {job_id: why}
        assert _tokens(pg, "api") == 3, f"a job refused {why} spent a token"
        assert job(pg, job_id)["attempt_count"] == 0
    free = enqueue(engine, "noop", rate_limit="api")
    assert _claim(pg, [free]) == {free: "claimed"}
    assert 2 <= _tokens(pg, "api") < 2.01


def test_one_batch_gives_an_untaken_token_to_no_job_past_the_bucket(
    engine: Engine, pg: psycopg.Connection
) -> None:
    # Burst 2, in one batch: the two first in line have a token to have; one of them
    # is turned down for its busy key, so one token is taken and one stays. The job
    # third in line got none in this claim and is RATE_LIMITED, due at once (a token
    # is there), not after a refill.
    _limit(engine, "api", rate=1, per=timedelta(hours=1), burst=2)
    holder = enqueue(engine, "noop", key="account:1")
    assert _claim(pg, [holder]) == {holder: "claimed"}
    keyed = enqueue(engine, "noop", rate_limit="api", key="account:1", priority=9)
    first = enqueue(engine, "noop", rate_limit="api", priority=5)
    third = enqueue(engine, "noop", rate_limit="api")
    pg.execute("UPDATE outbox SET sent_at = now()")  # as the relay does when it wakes them
    assert _claim(pg, [keyed, first, third]) == {
        keyed: "KEY_BUSY",
        first: "claimed",
        third: "RATE_LIMITED",
    }
    assert 1 <= _tokens(pg, "api") < 1.01
    (wait,) = pg.execute(
        "SELECT extract(epoch FROM available_at - now()) FROM outbox"
        " WHERE job_id = %s AND sent_at IS NULL",
        [third],
    ).fetchone()
    assert wait <= 0.01
