"""Do PostgreSQL and RabbitMQ answer? Used by scripts/test before the suite starts,
by the first test that needs each service, and by the benchmarks; says how to
start whichever does not. TEST_POSTGRES_URL (an administrative database, where
scratch databases are created) and TEST_AMQP_URL say where they are."""

from __future__ import annotations

import asyncio
import os
import sys

import aio_pika
import psycopg

ADMIN_URL = os.environ.get("TEST_POSTGRES_URL", "postgresql://127.0.0.1:5432/postgres")
AMQP_URL = os.environ.get("TEST_AMQP_URL", "amqp://127.0.0.1:5672/")


def postgres_problem() -> str | None:
    try:
        with psycopg.connect(ADMIN_URL, connect_timeout=5):
            pass
    except psycopg.OperationalError as exc:
        return (
            f"PostgreSQL at {ADMIN_URL} does not answer ({str(exc).strip().splitlines()[0]}).\n"
            "  Start it: pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"
        )
    return None


def rabbitmq_problem() -> str | None:
    async def amqp() -> None:
        connection = await aio_pika.connect(AMQP_URL, timeout=5)
        await connection.close()

    try:
        asyncio.run(amqp())
    except Exception as exc:
        return (
            f"RabbitMQ at {AMQP_URL} does not answer ({type(exc).__name__}).\n"
            "  Start it: rabbitmq-server -detached"
        )
    return None


def problems() -> list[str]:
    return [p for p in (postgres_problem(), rabbitmq_problem()) if p is not None]


def main() -> None:
    found = problems()
    for problem in found:
        print(problem, file=sys.stderr)
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
