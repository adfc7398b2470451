"""Every PostgreSQL advisory lock this project takes, in one table, so that no two
uses share a key by accident (two chores on one key skip each other's rounds).

All are transaction-scoped (``pg_advisory_xact_lock``, ``pg_try_advisory_xact_lock``):
they end with the transaction that took them, so a crashed holder never keeps one.

Two instances in one database (two schemas, HYBRID_JOBS_SCHEMA) never share a lock:
every key is derived from the instance, as the statement's search_path finds it (the
oid of its ``jobs`` table, :data:`INSTANCE_SPACE` and :data:`INSTANCE_SEED`), so the
project's SQL stays unqualified. Fixed keys are 0x6A6F62xx ("job" in ASCII, then a
number), in :class:`LockKey`, taken as the pair (instance, key): in ``pg_locks``,
``classid`` is the oid of the instance's jobs table and ``objid`` the key. Locks per
name (one per queue) hash a text, seeded with the instance:
``hashtextextended(text, INSTANCE_SEED)``; their texts start with ``hybrid_jobs.``.
A pair and a single bigint key never meet (PostgreSQL keeps the two apart).

The migration lock is taken before the instance's tables exist, so it hashes the
schema's name instead (:data:`MIGRATION_LOCK_PREFIX`).
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


# The instance a statement works on, as a lock's first key (an int4) and as the seed
# of a name's hash: the oid of the jobs table its search_path finds. Resolved once,
# when the statement is parsed.
INSTANCE_SPACE: Final = "'jobs'::regclass::oid::int4"
INSTANCE_SEED: Final = "'jobs'::regclass::oid::bigint"
# `jobctl migrate` takes pg_advisory_xact_lock(hashtextextended(PREFIX || schema, 0)):
# two deployments migrating one instance at once take turns, and two instances'
# migrations do not wait for each other.
MIGRATION_LOCK_PREFIX: Final = "hybrid_jobs.migrate."
# Per queue: the relay's decision (OUTBOX_WAKE_QUEUE) runs under
# hashtextextended(WAKE_LOCK_PREFIX || queue, INSTANCE_SEED), so another relay skips that queue
# meanwhile and takes the next.
WAKE_LOCK_PREFIX: Final = "hybrid_jobs.wake."
# Per entity key: enqueue takes hashtextextended(KEY_LOCK_PREFIX || key, INSTANCE_SEED) with
# pg_advisory_xact_lock before numbering a batch's ordered jobs (JOB_KEYS_LOCK), so
# a key's numbers follow the commit order of its producers.
KEY_LOCK_PREFIX: Final = "hybrid_jobs.key."
# One metrics collection at a time across every `jobctl serve` (METRICS_ROUND_BEGIN).
METRICS_LOCK_NAME: Final = "hybrid_jobs.metrics.collector"
