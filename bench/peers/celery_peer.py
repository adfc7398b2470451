"""Celery 5 on RabbitMQ: the broker is the queue, no database at all.

Workers: K `celery -A bench.peers.celery_app worker --pool solo` processes, K being
the number of our consumer processes. The solo pool runs tasks in the worker's own
process, one at a time, so K worker processes do all the work, as our K consumer
processes do. The default prefork pool puts a parent process and a pipe in front of
every child: more processes than this machine has cores, more work per task, and
slower here (`--pool prefork -c 1` per worker drained 1,700 tasks/s where solo drained
6,400). `acks_late=True` (acknowledged after the task ran) and
`worker_prefetch_multiplier=16`, so each worker holds at most 16 unacknowledged
messages. Without gossip, mingle, heartbeat, remote control and events: nothing a
no-op benchmark needs, and nothing broadcast on the broker. No result backend: each
task appends a byte to a file of its worker's own (`bench.marks`), one write(2).
Publisher confirms stay off, Celery's default: with them, `apply_async` returns after
the broker's confirm, which here often arrives after the task has already started
(a negative "latency").

Everything lives in a queue and an exchange named for the run, deleted afterwards.

- drain: N no-op tasks are published before any worker runs (a broker cannot take N
  messages in one commit, and tasks run while they are being published would flatter
  the figure); then the workers start, and jobs/s runs from the first task's start (so
  worker boot is not counted) until N tasks have run.
- latency: with the workers warm, one `apply_async` at a fixed rate; from the call
  to the task's first line (from its return, the task sometimes started first: the
  worker runs while the publisher waits to be scheduled again after the write).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator

from celery import Celery
from kombu.messaging import Producer

from bench.common import AMQP
from bench.marks import ENV, Marks, marks_dir
from bench.peers.base import (
    Contender,
    Figures,
    Settings,
    check_alive,
    drain_timeout,
    paced,
    running,
    started_latency,
    wait_until,
)
from bench.peers.celery_app import BROKER_ENV, PREFETCH, QUEUE_ENV, make_app


@contextlib.contextmanager
def producing(app: Celery, queue: str) -> Iterator[Producer]:
    """A producer on a connection of our own (not kombu's process-wide pools, which
    outlive the app), and the run's queue and exchange deleted afterwards."""
    with app.connection_for_write() as conn:
        try:
            yield conn.Producer()
        finally:
            conn.default_channel.queue_delete(queue)
            conn.default_channel.exchange_delete(queue)


def queue_depth(producer: Producer, queue: str) -> int:
    return int(producer.channel.queue_declare(queue, passive=True).message_count)


def worker_command(queue: str, index: int, pool: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "bench.peers.celery_app",
        "worker",
        "--pool",
        pool,
        "--concurrency",
        "1",
        "--queues",
        queue,
        "--hostname",
        f"{queue}-{index}@%h",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "--loglevel",
        "WARNING",
    ]


def warm_up(
    app: Celery, producer: Producer, marks: Marks, workers: int, check: Callable[[], None]
) -> None:
    """One task at a time until every worker process has run one."""
    ready = app.tasks["bench.ready"]
    sent = 0
    deadline = time.monotonic() + 60
    while marks.ready_workers() < workers:
        if time.monotonic() > deadline:
            raise TimeoutError("Celery workers did not all start within 60s")
        check()
        ready.apply_async(producer=producer)
        sent += 1
        time.sleep(0.05)
    wait_until(lambda: marks.ready_count() >= sent, "Celery warm-up tasks", timeout=30)


def measure(settings: Settings, *, pool: str = "solo") -> Figures:
    queue = f"bench-celery-{uuid.uuid4().hex[:10]}"
    app = make_app(AMQP.url, queue)
    with marks_dir() as marks, producing(app, queue) as producer:
        noop = app.tasks["bench.noop"]
        for _ in range(settings.jobs):
            noop.apply_async(producer=producer)
        wait_until(
            lambda: queue_depth(producer, queue) >= settings.jobs,
            f"{settings.jobs} tasks in {queue}",
            timeout=60,
        )

        env = {**os.environ, BROKER_ENV: AMQP.url, QUEUE_ENV: queue, ENV: str(marks.path)}
        commands = [worker_command(queue, i, pool) for i in range(settings.workers)]
        log = marks.path / "workers.log"
        with running(commands, env, log) as procs:

            def check() -> None:
                check_alive(procs, log)

            def drained() -> bool:
                check()
                return marks.done_count() >= settings.jobs

            wait_until(drained, "Celery drain", drain_timeout(settings.jobs))
            finished = time.time()
            rate = settings.jobs / (finished - marks.first_start())
            ran = marks.done_count()

            warm_up(app, producer, marks, settings.workers, check)
            latency = app.tasks["bench.latency"]
            committed: dict[str, float] = {}
            for _ in paced(settings.rate, settings.seconds):
                # Timed from the call, not its return: the worker, another process,
                # can start the task before this one is scheduled again after the
                # socket write (a negative latency, seen on 2 cores).
                sent = time.time()
                result = latency.apply_async(producer=producer)
                committed[result.id] = sent
            lat = started_latency(marks, committed, settings.rate, "Celery", check)
    return Figures(rate, lat, {"pool": pool, "prefetch": PREFETCH, "tasks_run": ran})


def contenders() -> list[Contender]:
    version = importlib.metadata.version("celery")
    return [
        Contender(
            name="celery",
            group="celery",
            setup=f"Celery {version}, K `celery worker --pool solo` processes, acks_late, "
            f"prefetch {PREFETCH}, no result backend; queue filled first, drain timed from "
            "the first task's start",
            measure=measure,
        )
    ]
