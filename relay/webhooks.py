"""Completion webhooks: the relay calls the URL a job (or its type) names when it ends.

The call owed is a ``webhook_deliveries`` row, written by the transaction that ended
the job (trigger ``jobs_finished``), so it is never lost. Every relay with a secret
delivers; the database arbitrates:

- a claim (``WEBHOOK_DELIVERY_CLAIM``) takes due rows with a lease: their
  ``next_attempt_at`` moves past the call's timeout, ``lease_owner`` names this
  relay and ``attempts`` counts the claim. Two relays never call for one row at
  once, and a relay killed mid-call leaves the row due again when its lease ends:
  at least once;
- the call is made with no transaction open: a POST of the JSON body, signed
  (``Webhook-Signature: t=<unix time>,v1=<hex HMAC-SHA256 of "<t>.<body>">``, as
  Stripe signs), bounded by ``webhook_timeout`` from connecting to the status line;
  the response's body is never read;
- its outcome is recorded through the fence (lease owner and attempt): 2xx is
  DELIVERED; anything else (a status, a timeout, a refused connection) is due again
  after a back-off recorded on the row, or GAVE_UP once ``webhook_max_attempts``
  calls were made, each saying what went wrong.

Nothing waits on an endpoint but its own calls: at most ``webhook_concurrency``
calls are in flight, at most ``webhook_per_endpoint`` of them to one endpoint
(scheme, host and port), and an endpoint whose call just failed rests (its due
calls are left in the table, taking no slot) for a back-off that doubles with each
failure in a row. The relay's wake-ups have their own tasks and connections: a
hanging endpoint holds a slot here, and no database connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from hybrid_jobs.plumbing.transient import retry_forever
from hybrid_jobs.relay.maintenance import Pool
from hybrid_jobs.relay.settings import RelaySettings
from hybrid_jobs.relay.webhook_hosts import AllowedHosts
from hybrid_jobs.schema.queries import (
    WEBHOOK_DELIVERY_CLAIM,
    WEBHOOK_DELIVERY_DELIVERED,
    WEBHOOK_DELIVERY_FAILED,
    WEBHOOK_DELIVERY_GIVE_UP_SPENT,
)

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("relay")

SIGNATURE_HEADER: Final = "Webhook-Signature"
# The delivery's id: the same on every retry of one job's end, for the receiver
# to drop a repeat (delivery is at least once).
ID_HEADER: Final = "Webhook-Id"
USER_AGENT: Final = "hybrid-jobs-webhooks"
# A claim looks at this many of the oldest due calls to choose from (a few per
# endpoint): a backlog for one endpoint costs a claim no more than this.
CLAIM_SCAN: Final = 1000
# How long a failing endpoint rests at most, however often it failed.
ENDPOINT_REST_CAP: Final = 60.0
# A claimed call's lease allows this much beyond the call's own timeout (and at
# least the timeout again), for its outcome's statement to reach the database.
LEASE_MARGIN: Final = 5.0
# A retry's back-off is spread by this much either way, so that the calls of many
# jobs that failed together do not come back together.
BACKOFF_JITTER: Final = 0.1
# What of a failure is kept on the row and logged.
MAX_ERROR_LENGTH: Final = 500


def sign(secret: bytes, timestamp: int, body: bytes) -> str:
    """The ``Webhook-Signature`` header's value for ``body`` sent at ``timestamp``."""
    mac = hmac.new(secret, str(timestamp).encode() + b"." + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


@dataclass(frozen=True)
class Call:
    """A claimed delivery: what to send where, and its fence (the attempt)."""

    delivery_id: int
    job_id: uuid.UUID
    url: str
    endpoint: str
    body: bytes
    attempt: int


@dataclass(frozen=True)
class Outcome:
    status: int | None  # the HTTP status, None when none came back
    error: str | None  # None: delivered

    @property
    def delivered(self) -> bool:
        return self.error is None


@dataclass
class _Rest:
    failures: int = 0
    until: float = 0.0  # monotonic


@dataclass
class Deliverer:
    """Claims due calls, makes them, records their outcomes: one relay's share."""

    pool: Pool
    settings: RelaySettings
    relay_id: str
    secret: bytes
    # Calls in flight, by endpoint, and their tasks.
    in_flight: Counter[str] = field(default_factory=Counter)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    rests: dict[str, _Rest] = field(default_factory=dict)
    # delivered / failed (a call that will be made again) / gave_up, since start.
    counts: Counter[str] = field(default_factory=Counter)
    # Set when a call ends: a slot is free, and its endpoint may be claimable again.
    freed: asyncio.Event = field(default_factory=asyncio.Event)
    spent_checked_at: float = float("-inf")  # monotonic

    def __post_init__(self) -> None:
        self.allowed = AllowedHosts.parse(self.settings.webhook_allow_hosts)

    async def run(self) -> None:
        # Imported here, by the relays that deliver: where rich is installed, httpx
        # brings it and pygments too (its command line), about 100 modules and a
        # tenth of a second on every relay's start, with a secret or without.
        import httpx

        s = self.settings
        limits = httpx.Limits(
            max_connections=s.webhook_concurrency, max_keepalive_connections=s.webhook_concurrency
        )
        async with httpx.AsyncClient(
            timeout=s.webhook_timeout, limits=limits, follow_redirects=False
        ) as client:
            try:
                while True:
                    self.freed.clear()
                    claimed = 0
                    async for attempt in retry_forever(log, "relay.webhooks_failed"):
                        with attempt:
                            claimed = await self.round(client)
                    if claimed and len(self.tasks) < s.webhook_concurrency:
                        continue  # more may be due right now
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.freed.wait(), s.webhook_interval)
            finally:
                for task in self.tasks:
                    task.cancel()
                # Their leases run out: another round, here or in another relay, calls again.
                await asyncio.gather(*self.tasks, return_exceptions=True)

    async def round(self, client: httpx.AsyncClient) -> int:
        """Give up the spent calls (once an interval), claim what this relay has
        room for and start each call; how many were claimed."""
        s = self.settings
        if time.monotonic() >= self.spent_checked_at + s.webhook_interval:
            self.spent_checked_at = time.monotonic()
            await self._give_up_spent()
        return await self._claim_and_start(client, s.webhook_concurrency - len(self.tasks))

    async def _give_up_spent(self) -> None:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                WEBHOOK_DELIVERY_GIVE_UP_SPENT,
                {"max_attempts": self.settings.webhook_max_attempts, "limit": CLAIM_SCAN},
            )
            rows = await cur.fetchall()
        for delivery_id, job_id, endpoint, attempts in rows:
            self.counts["gave_up"] += 1
            log.error(
                "relay.webhook_gave_up",
                extra={
                    "delivery": delivery_id,
                    "job": str(job_id),
                    "endpoint": endpoint,
                    "attempts": attempts,
                    "error": "the last attempt's relay stopped before recording it",
                },
            )

    async def _claim_and_start(self, client: httpx.AsyncClient, free: int) -> int:
        s = self.settings
        if free <= 0:
            return 0
        now = time.monotonic()
        # Left out of the claim's look altogether: endpoints resting after a failure,
        # and those this relay calls at their limit already, so that a backlog of
        # one endpoint's calls cannot fill the look and hide everyone else's.
        resting = [e for e, rest in self.rests.items() if rest.until > now] + [
            e for e, n in self.in_flight.items() if n >= s.webhook_per_endpoint
        ]
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                WEBHOOK_DELIVERY_CLAIM,
                {
                    "relay": self.relay_id,
                    "limit": free,
                    "scan": CLAIM_SCAN,
                    "per_endpoint": s.webhook_per_endpoint,
                    "in_flight": json.dumps({e: n for e, n in self.in_flight.items() if n}),
                    "resting": resting,
                    "max_attempts": s.webhook_max_attempts,
                    "lease_seconds": s.webhook_timeout + max(LEASE_MARGIN, s.webhook_timeout),
                },
            )
            rows = await cur.fetchall()
        for delivery_id, job_id, url, endpoint, body, attempt in rows:
            call = Call(delivery_id, job_id, url, endpoint, body.encode(), attempt)
            self.in_flight[endpoint] += 1
            task = asyncio.create_task(self._deliver(client, call), name=f"webhook-{delivery_id}")
            self.tasks.add(task)
            task.add_done_callback(self._done(endpoint))
        return len(rows)

    def _done(self, endpoint: str) -> Any:
        def done(task: asyncio.Task[None]) -> None:
            self.tasks.discard(task)
            self.in_flight[endpoint] -= 1
            if not self.in_flight[endpoint]:
                del self.in_flight[endpoint]
            self.freed.set()

        return done

    async def _deliver(self, client: httpx.AsyncClient, call: Call) -> None:
        outcome = await self.call(client, call)
        self._rest(call.endpoint, outcome)
        # Until the database takes it: the call's slot stays taken meanwhile, and if
        # the lease runs out first the call is made again (at least once).
        async for attempt in retry_forever(log, "relay.webhook_record_failed"):
            with attempt:
                await self.record(call, outcome)

    async def call(self, client: httpx.AsyncClient, call: Call) -> Outcome:
        """POST the body, signed; the status, or what went wrong. A URL whose host is
        not a public address (nor allowed) is not called: it fails, saying why."""
        if (refused := await self.allowed.refusal(call.url)) is not None:
            return Outcome(None, refused)
        headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            ID_HEADER: str(call.delivery_id),
            SIGNATURE_HEADER: sign(self.secret, int(time.time()), call.body),
        }
        try:
            # The client's timeout bounds each phase; this bounds the whole call
            # (an endpoint that trickles its headers one byte at a time, say).
            async with asyncio.timeout(self.settings.webhook_timeout):
                async with client.stream(
                    "POST", call.url, content=call.body, headers=headers
                ) as response:
                    status = response.status_code
        except TimeoutError:
            return Outcome(None, f"no response within {self.settings.webhook_timeout:g} s")
        except Exception as exc:  # refused, reset, TLS, a malformed answer: a failure
            return Outcome(None, f"{type(exc).__name__}: {exc}"[:MAX_ERROR_LENGTH])
        if 200 <= status < 300:
            return Outcome(status, None)
        return Outcome(status, f"HTTP {status}")

    def _rest(self, endpoint: str, outcome: Outcome) -> None:
        if outcome.delivered:
            self.rests.pop(endpoint, None)
            return
        rest = self.rests.setdefault(endpoint, _Rest())
        rest.failures += 1
        wait = min(
            ENDPOINT_REST_CAP,
            self.settings.webhook_endpoint_backoff * 2 ** min(rest.failures - 1, 16),
        )
        rest.until = max(rest.until, time.monotonic() + wait)

    async def record(self, call: Call, outcome: Outcome) -> None:
        """The outcome, through the fence. A call whose lease ran out and was claimed
        again since records nothing (the other claim's outcome counts)."""
        s = self.settings
        fence = {"delivery_id": call.delivery_id, "relay": self.relay_id, "attempt": call.attempt}
        async with self.pool.connection() as conn:
            if outcome.delivered:
                cur = await conn.execute(
                    WEBHOOK_DELIVERY_DELIVERED, {**fence, "status": outcome.status}
                )
                recorded = await cur.fetchone() is not None
                state = "DELIVERED"
            else:
                cur = await conn.execute(
                    WEBHOOK_DELIVERY_FAILED,
                    {
                        **fence,
                        "status": outcome.status,
                        "error": outcome.error,
                        "max_attempts": s.webhook_max_attempts,
                        "backoff_base": s.webhook_backoff,
                        "backoff_cap": s.webhook_backoff_cap,
                        "backoff_jitter": BACKOFF_JITTER,
                    },
                )
                row = await cur.fetchone()
                recorded = row is not None
                state = row[0] if row else "PENDING"
        fields: dict[str, Any] = {
            "delivery": call.delivery_id,
            "job": str(call.job_id),
            "endpoint": call.endpoint,
            "attempt": call.attempt,
            "status": outcome.status,
        }
        if not recorded:
            log.warning("relay.webhook_lease_lost", extra=fields)
        elif state == "DELIVERED":
            self.counts["delivered"] += 1
            log.info("relay.webhook_delivered", extra=fields)
        elif state == "GAVE_UP":
            self.counts["gave_up"] += 1
            log.error("relay.webhook_gave_up", extra={**fields, "error": outcome.error})
        else:
            self.counts["failed"] += 1
            log.warning("relay.webhook_failed", extra={**fields, "error": outcome.error})
