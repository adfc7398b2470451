"""Every PostgreSQL advisory lock this project takes, in one table, so that no two
uses share a key by accident (two chores on one key skip each other's rounds).

All are transaction-scoped (``pg_advisory_xact_lock``, ``pg_try_advisory_xact_lock``):
they end with the transaction that took them, so a crashed holder never keeps one.

Fixed keys are bigints 0x6A6F62xx ("job" in ASCII, then a number), in
:class:`LockKey`. Locks per name (one per queue) hash a text with
``hashtextextended(text, 0)``; their texts start with ``hybrid_jobs.``, and a
64-bit hash of one lands on a fixed key with a chance of about 2^-64 per name.
"""

from __future__ import annotations

from enum import IntEnum, unique
from typing import Final


@unique
class LockKey(IntEnum):
    # The relay's chores (relay.maintenance, relay.retention), each taken with
    # pg_try_advisory_xact_lock: one relay at a time does a chore, the others skip
    # the round.
    SWEEP = 0x6A6F6202  # expired leases (JOB_SWEEP_EXPIRED)
    REWAKE = 0x6A6F6203  # lost wake-ups sent again
    RECONCILE = 0x6A6F6204  # tenants' slot counts checked against the leases
    USAGE = 0x6A6F6205  # limited tenants' waiting jobs counted
    WORKERS = 0x6A6F6206  # silent consumers and relays forgotten
    RETENTION = 0x6A6F6207  # finished jobs and old effect keys deleted
    REFUSED = 0x6A6F6208  # wake-ups refused for want of a handler brought forward
    ORPHANS = 0x6A6F6209  # the backstop walk for jobs with no wake-up
    EXPIRE = 0x6A6F6211  # waiting jobs past their deadline ended (JOB_EXPIRE_WAITING)
    # `jobctl migrate`, with pg_advisory_xact_lock: two deployments migrating at
    # once take turns.
    MIGRATION = 0x6A6F6210


# Per queue: the relay's decision (OUTBOX_WAKE_QUEUE) runs under
# hashtextextended(WAKE_LOCK_PREFIX || queue, 0), so another relay skips that queue
# meanwhile and takes the next.
WAKE_LOCK_PREFIX: Final = "hybrid_jobs.wake."
# Per entity key: enqueue takes hashtextextended(KEY_LOCK_PREFIX || key, 0) with
# pg_advisory_xact_lock before numbering a batch's ordered jobs (JOB_KEYS_LOCK), so
# a key's numbers follow the commit order of its producers.
KEY_LOCK_PREFIX: Final = "hybrid_jobs.key."
# One metrics collection at a time across every `jobctl serve` (METRICS_ROUND_BEGIN).
METRICS_LOCK_NAME: Final = "hybrid_jobs.metrics.collector"
