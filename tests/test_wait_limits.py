"""GET /v1/jobs/{id}?wait= bounded, over real HTTP: a process holds at most
max_waiters such requests and one client at most max_waiters_per_client; one more
is answered at once (503 or 429, Retry-After, problem+json) while the held ones go
on waiting and answer when their job ends; the requests waiting for one job share
one read of it. Clients are told apart by their address: each here connects from
an address of its own on the loopback network (127.0.0.0/8)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import psycopg
from sqlalchemy import Engine, event

from hybrid_jobs.jobctl.api.waiters import Waiters
from hybrid_jobs.plumbing.config import DatabaseUrl
from tests.support.api import BEARER, served
from tests.support.dashboard import dashboard_served
from tests.support.jobs import enqueue, until

PROBLEM = "application/problem+json"
WAIT = {"wait": 20}


@asynccontextmanager
async def client_from(base: str, address: str) -> AsyncIterator[httpx.AsyncClient]:
    """A client whose connections come from ``address`` (a loopback one)."""
    transport = httpx.AsyncHTTPTransport(local_address=address)
    async with httpx.AsyncClient(
        base_url=base, headers=BEARER, transport=transport, timeout=40
    ) as client:
        yield client


def finish(pg: psycopg.Connection, job_id: uuid.UUID) -> None:
    """End the job as a worker's report would (the commit notifies its waiters)."""
    pg.execute(
        "UPDATE jobs SET state = 'SUCCEEDED', attempt_count = 1, started_at = now(),"
        " finished_at = now(), result = '7' WHERE job_id = %s",
        [job_id],
    )


def assert_refused(answer: httpx.Response, status: int, limit: int) -> int:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == PROBLEM
    assert answer.headers["connection"] == "close", "its descriptor is given back at once"
    problem = answer.json()
    assert problem["status"] == status and problem["limit"] == limit, problem
    assert "?wait=" in problem["detail"], problem
    retry_after = int(answer.headers["Retry-After"])
    assert 1 <= retry_after <= WAIT["wait"], retry_after
    return retry_after


async def test_waits_past_the_limits_are_refused_at_once_and_the_held_ones_answer_at_the_end(
    db_url: DatabaseUrl, engine: Engine, pg: psycopg.Connection
) -> None:
    a = enqueue(engine, "greet", {"n": 1})
    b = enqueue(engine, "greet", {"n": 2})
    async with (
        dashboard_served(db_url, metrics=False, max_waiters=3, max_waiters_per_client=2) as app,
        client_from(app.base, "127.0.0.2") as one,
        client_from(app.base, "127.0.0.3") as two,
        client_from(app.base, "127.0.0.4") as three,
    ):
        waiters: Waiters = app.app.state.waiters
        held = [asyncio.create_task(one.get(f"/v1/jobs/{a}", params=WAIT)) for _ in range(2)]
        await until(lambda: waiters.held == 2, "two requests held")
        started = time.monotonic()
        # The first client holds as many as one client may.
        refused = await one.get(f"/v1/jobs/{b}", params=WAIT)
        assert_refused(refused, 429, 2)
        assert "127.0.0.2" in refused.json()["detail"]
        # Another client may still wait, up to the process's limit.
        held.append(asyncio.create_task(two.get(f"/v1/jobs/{b}", params=WAIT)))
        await until(lambda: waiters.held == 3, "three requests held")
        full = await three.get(f"/v1/jobs/{a}", params=WAIT)
        assert_refused(full, 503, 3)
        assert time.monotonic() - started < 5, "refused at once, not after a wait"
        # Looking without waiting is never refused; a job that is done is answered
        # at once, whatever is held.
        look = await three.get(f"/v1/jobs/{a}")
        assert (look.status_code, look.json()["state"]) == (200, "QUEUED")
        assert not any(task.done() for task in held)
        assert waiters.jobs_waited_for == 2, "one shared wait per job"

        await asyncio.to_thread(finish, pg, a)
        first, second = await asyncio.wait_for(asyncio.gather(*held[:2]), 10)
        for answer in (first, second):
            assert answer.status_code == 200, answer.text
            assert answer.json()["state"] == "SUCCEEDED" and answer.json()["result"] == 7
            assert "Retry-After" not in answer.headers
        assert not held[2].done(), "the wait for the other job goes on"
        await until(lambda: waiters.held == 1, "the seats given back")
        # A seat is free again: the client refused before is held now.
        late = asyncio.create_task(one.get(f"/v1/jobs/{b}", params=WAIT))
        await until(lambda: waiters.held == 2, "the refused client held now")
        await asyncio.to_thread(finish, pg, b)
        for answer in await asyncio.wait_for(asyncio.gather(held[2], late), 10):
            assert (answer.status_code, answer.json()["state"]) == (200, "SUCCEEDED")
        assert waiters.held == 0 and waiters.jobs_waited_for == 0
        done = await three.get(f"/v1/jobs/{a}", params=WAIT)
        assert (done.status_code, done.json()["state"]) == (200, "SUCCEEDED")


async def test_the_requests_waiting_for_one_job_share_one_read_of_it(
    db_url: DatabaseUrl, engine: Engine, pg: psycopg.Connection
) -> None:
    job_id = enqueue(engine, "greet", {})
    statements: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    async with dashboard_served(db_url, metrics=False) as app:
        engine_of_app = app.app.state.database.engine.sync_engine
        event.listen(engine_of_app, "before_cursor_execute", count)
        waiters: Waiters = app.app.state.waiters
        async with client_from(app.base, "127.0.0.2") as client:
            look = await client.get(f"/v1/jobs/{job_id}")
            assert look.status_code == 200
            one_look = len(statements)
            assert one_look >= 1
            held = [
                asyncio.create_task(client.get(f"/v1/jobs/{job_id}", params=WAIT))
                for _ in range(12)
            ]
            await until(lambda: waiters.held == 12, "twelve requests held")
            # Each request read the job once before waiting; the shared wait read
            # its outcome once when the listener was listening.
            await asyncio.sleep(0.3)
            before_the_end = len(statements)
            await asyncio.to_thread(finish, pg, job_id)
            answers = await asyncio.wait_for(asyncio.gather(*held), 10)
        event.remove(engine_of_app, "before_cursor_execute", count)
    assert all(a.status_code == 200 and a.json()["state"] == "SUCCEEDED" for a in answers)
    # The end cost one look at its outcome and one read of the job, for all twelve
    # (each read on its own would be twelve times one_look).
    woken = len(statements) - before_the_end
    assert woken <= one_look + 1, (woken, one_look, statements[before_the_end:])


async def test_jobctl_serve_holds_at_most_its_per_client_waits_by_default(
    db_url: DatabaseUrl, engine: Engine, pg: psycopg.Connection
) -> None:
    """A real `jobctl serve` process, its defaults: one client holds at most
    SERVE_MAX_WAITERS_PER_CLIENT (20) waits; of 21 sent together, one is refused at
    once and twenty answer when the job ends."""
    job_id = enqueue(engine, "greet", {})
    with served(db_url) as (base, _):
        async with client_from(base, "127.0.0.5") as client:
            sent = [
                asyncio.create_task(client.get(f"/v1/jobs/{job_id}", params=WAIT))
                for _ in range(21)
            ]
            done, pending = await asyncio.wait(sent, timeout=10, return_when="FIRST_COMPLETED")
            assert len(done) == 1, "one refused at once"
            assert_refused(done.pop().result(), 429, 20)
            await asyncio.sleep(0.5)
            assert len(pending) == 20 and not any(task.done() for task in pending)
            await asyncio.to_thread(finish, pg, job_id)
            answers = await asyncio.wait_for(asyncio.gather(*pending), 15)
    assert all(a.status_code == 200 and a.json()["state"] == "SUCCEEDED" for a in answers)
