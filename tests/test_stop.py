"""Stopping real `relay` and `consumer` processes: a graceful stop records every
outcome its handlers produced, never runs a plain-function job twice at once, and one
Ctrl-C means one graceful stop; a second signal always ends the process soon."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time

import psycopg
import pytest
from sqlalchemy import Engine

from plumbing.config import AmqpUrl, DatabaseUrl
from schema.topology import Topology
from tests.support.jobs import attempts, enqueue, job, wait_for_state
from tests.support.processes import Daemon, running, service_env

pytestmark = pytest.mark.timeout(180)

APP = ["--app", "tests.apps.basic"]


def test_a_graceful_stop_records_the_outcome_of_a_job_that_ends_in_the_drain(
    engine: Engine,
    pg: psycopg.Connection,
    db_url: DatabaseUrl,
    amqp_url: AmqpUrl,
    topology: Topology,
) -> None:
    """SIGTERM while a 1 s job runs: the job ends in the drain and its outcome is
    recorded before the process exits (it used to be cancelled mid-write, leaving the
    job RUNNING until its lease ran out). Async and plain handlers alike."""
    env = service_env(db_url, amqp_url, topology)
    args = [*APP, "--drain-seconds", "10", "--lease-seconds", "300"]
    with running("relay", [], env, "relay.started"):
        for job_type in ["sleep", "sleep", "sleep", "sync_sleep", "sync_sleep"]:
            queue = "sync" if job_type == "sync_sleep" else "default"
            with running("consumer", args, env, "consumer.started") as consumer:
                job_id = enqueue(engine, job_type, {"seconds": 1}, queue=queue)
                asyncio.run(wait_for_state(pg, job_id, "RUNNING"))
                consumer.signal(signal.SIGTERM)
                assert consumer.proc.wait(30) == 0
            row = job(pg, job_id)
            assert row["state"] == "SUCCEEDED", (row, consumer.text()[-3000:])
            assert [a["outcome"] for a in attempts(pg, job_id)] == ["SUCCEEDED"]
            assert not consumer.has_event("consumer.outcomes_unrecorded")
