"""The Celery app of `bench.peers.celery_peer`: the workers run
``celery -A bench.peers.celery_app worker ...`` with the broker in
``BENCH_CELERY_BROKER`` and the queue in ``BENCH_CELERY_QUEUE``; the benchmark builds
the same app with `make_app` to send tasks."""

from __future__ import annotations

import os

from celery import Celery, Task

from bench.marks import process_marks

BROKER_ENV = "BENCH_CELERY_BROKER"
QUEUE_ENV = "BENCH_CELERY_QUEUE"
# Prefetch is the multiplier times the concurrency; each worker runs one task at a
# time (the solo pool), so this is a prefetch of 16 per worker process.
PREFETCH = 16


def noop() -> None:
    process_marks().done()


def latency(task: Task) -> None:
    process_marks().started(task.request.id)


def ready() -> None:
    process_marks().ready()


def make_app(broker: str, queue: str) -> Celery:
    app = Celery("bench", broker=broker, set_as_current=False)
    app.conf.update(
        # A queue and an exchange of this run's own, deleted afterwards.
        task_default_queue=queue,
        task_default_exchange=queue,
        task_default_routing_key=queue,
        task_acks_late=True,
        worker_prefetch_multiplier=PREFETCH,
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
        # Nothing broadcast: no pidbox or event exchanges shared with other users.
        worker_enable_remote_control=False,
        worker_send_task_events=False,
        task_send_sent_event=False,
    )

    # Registered by call, not as decorators: Celery has no type information, and the
    # names are explicit so the worker and the sender agree. shared=False keeps each
    # app's tasks its own (the benchmark builds one app per run).
    app.task(name="bench.noop", shared=False)(noop)
    app.task(name="bench.latency", bind=True, shared=False)(latency)
    app.task(name="bench.ready", shared=False)(ready)
    return app


app = make_app(
    os.environ.get(BROKER_ENV, "amqp://127.0.0.1:5672/"),
    os.environ.get(QUEUE_ENV, "bench"),
)
