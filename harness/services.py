"""Do PostgreSQL and RabbitMQ answer? Used by scripts/test before the suite starts,
by the first test that needs each service, and by the benchmarks; says how to
start whichever does not. ``--workers`` prints how many pytest processes the
server has connections for. TEST_POSTGRES_URL (an administrative database, where
scratch databases are created) and TEST_AMQP_URL say where they are."""

from __future__ import annotations

import argparse
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


# The client connections four pytest processes need room for. Sampled every 0.2 s
# over a whole run, they held up to 75 at once, in bursts of daemons' pools that a
# sample can miss; a run under PostgreSQL's default of 100 once met "too many
# clients already". Three processes held about three quarters of that, and five
# hold about a quarter more.
CONNECTIONS_FOR_FOUR = 150
CONNECTIONS_FOR_FIVE = 190


def default_workers() -> int:
    """The pytest processes scripts/test starts unless told: five where the server
    takes CONNECTIONS_FOR_FIVE connections, four where it takes CONNECTIONS_FOR_FOUR,
    else three (saying why, on stderr)."""
    with psycopg.connect(ADMIN_URL, connect_timeout=5) as conn:
        row = conn.execute("SHOW max_connections").fetchone()
    allowed = int(row[0]) if row else 0
    if allowed >= CONNECTIONS_FOR_FIVE:
        return 5
    if allowed >= CONNECTIONS_FOR_FOUR:
        return 4
    print(
        f"scripts/test: PostgreSQL takes {allowed} connections, and four pytest processes"
        f" need room for {CONNECTIONS_FOR_FOUR}: running three, which takes longer (raise"
        " max_connections, or set TEST_WORKERS)",
        file=sys.stderr,
    )
    return 3


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m harness.services", description=__doc__)
    parser.add_argument(
        "--workers", action="store_true", help="print how many pytest processes to start"
    )
    if parser.parse_args().workers:
        print(default_workers())
        return
    found = problems()
    for problem in found:
        print(problem, file=sys.stderr)
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
