"""Every default, in one place.

A default here is a value a user can change (a flag, an environment variable, an
argument of ``enqueue`` or ``@handler``) or a bound a user's input must meet (a
payload's size, a name's length). The settings objects, the flags that set them, the
SQL that needs a figure and the configuration reference all read it from here, so
none of them can drift from another. Internal timings no one can set (a retry after
a lock conflict, say) stay beside the code they pace.

Each value's docstring is its entry in the configuration reference; the names
``RELAY_<FIELD>``, ``CONSUMER_<FIELD>``, ``SERVE_<FIELD>`` and ``METRICS_<FIELD>``
are the defaults of the fields of the same name of ``RelaySettings``,
``ConsumerSettings``, ``ApiSettings`` and ``CollectorSettings``, which the
``relay``, ``consumer`` and ``jobctl serve`` flags set.

This module imports nothing of the package: the tables at the bottom read it too.
"""

from __future__ import annotations

from typing import Final

# ------------------------------------------------------------------ connections

DATABASE_URL: Final = "postgresql://127.0.0.1:5432/jobs"
"""PostgreSQL, when neither ``$DATABASE_URL``, the file named by
``$DATABASE_URL_FILE`` (for container secrets) nor ``--database-url`` says."""

DATABASE_POOLER: Final = "none"
"""``$DATABASE_POOLER``: ``transaction`` when ``DATABASE_URL`` points at a
transaction-pooling proxy (PgBouncer in transaction mode): no prepared statements,
and LISTEN goes to ``$DATABASE_LISTEN_URL``, a direct connection."""

SCHEMA: Final = "hybrid_jobs"
"""``$HYBRID_JOBS_SCHEMA``: the PostgreSQL schema that holds one instance's tables,
functions and triggers; its advisory locks and NOTIFY channels are derived from it.
Two instances in one database are two schemas. An install from before this setting
has its tables in ``public``: it sets ``HYBRID_JOBS_SCHEMA=public``."""

AMQP_URL: Final = "amqp://127.0.0.1:5672/"
"""RabbitMQ, when neither ``$AMQP_URL``, ``$AMQP_URL_FILE`` nor ``--amqp-url`` says.
Several comma-separated URLs name the nodes of a cluster. Without a user in the URL
the client uses the broker's local default account."""

AMQP_PREFIX: Final = "jobs"
"""``$AMQP_PREFIX`` / ``--amqp-prefix``: the exchange is named by it, each queue
``<prefix>.<queue>``, the dead letters go to ``<prefix>.dead``. Two deployments on
one broker need two prefixes. Left unset, an instance in a schema of its own
(``HYBRID_JOBS_SCHEMA`` other than ``hybrid_jobs`` or ``public``) takes the schema's
name."""

AMQP_QUEUE_TYPE: Final = "classic"
"""``$AMQP_QUEUE_TYPE`` / ``--queue-type``: ``classic`` (which honours priorities) or
``quorum`` (replicated, for a cluster) for the queues a daemon declares."""

LOG_LEVEL: Final = "INFO"
"""``$LOG_LEVEL`` / ``--log-level`` of the daemons' JSON lines."""

POOL_CLOSE_SECONDS: Final = 1.0
"""How long a daemon on its way out waits for its connection pool's workers. An idle
pool closes at once; a worker caught opening a connection by a stop-now signal held
the exit for psycopg_pool's own default, 5 s."""

# ------------------------------------------------------------------ jobs

MAX_ATTEMPTS: Final = 5
"""Attempts of a job enqueued without ``max_attempts`` and run by a handler that
sets none; counted at claim, so a job that crashes its worker stops too."""

MAX_ATTEMPTS_LIMIT: Final = 1000
"""The most attempts ``max_attempts`` may allow."""

MAX_PAYLOAD_BYTES: Final = 256 * 1024
"""A job's payload, as JSON, at most this many bytes; ``$MAX_PAYLOAD_BYTES`` changes
it (every producer and ``jobctl serve`` should agree). A larger one is refused at
enqueue, before anything is written."""

MAX_PAYLOAD_DEPTH: Final = 100
"""How deeply a payload's objects and arrays may nest (``{"a": [1]}`` is 2 deep).
Every reader of the table (Python's json, pydantic, PostgreSQL) must be able to read
a job back, so it is fixed, not a setting."""

MAX_INPUT_BYTES: Final = 16 * 1024 * 1024
"""An input stored by reference (``outbox.store_input``), as JSON, at most this many
bytes; ``$MAX_INPUT_BYTES`` changes it. Larger than an inline payload's bound, since
it is stored once and not carried in the hot table, yet bounded: the consumer reads it
whole into memory before the handler runs. A larger one is refused before anything is
written."""

STRICT_JOB_TYPES: Final = False
"""``$STRICT_JOB_TYPES=1``: enqueue refuses a job type that no handler registered in
the producer's process knows (``ValueError`` naming the nearest known ones), as
``outbox.require_known_job_types(consumers.default_registry)`` does. Set it only
where the producer imports its handlers."""

KEY_LIMIT: Final = 1
"""Jobs of one ``key`` that may hold a lease at once, when enqueue gives no
``key_limit``: one at a time."""

MAX_KEY_LIMIT: Final = 100_000
"""The largest ``key_limit``."""

MAX_PARENTS: Final = 1000
"""Parents one job may wait for (``after=``): enough for a fan-in's callback after a
large group, small enough that one enqueue's lock of its parents stays bounded."""

MAX_WEIGHT: Final = 100
"""The largest ``weight`` of a job: the slots of its consumer's ``--concurrency``,
of its tenant's cap and of its type's concurrency limit one lease of it takes."""

MAX_JOB_TYPE_LENGTH: Final = 200
"""Characters in a job type."""

MAX_QUEUE_NAME_LENGTH: Final = 100
"""Characters in a queue name (letters, digits and ``_.:-``)."""

MAX_KEY_LENGTH: Final = 500
"""Characters in a ``key`` (one at a time, in order)."""

MAX_DEDUP_KEY_LENGTH: Final = 500
"""Characters in a ``dedup_key``."""

MAX_SCHEDULE_NAME_LENGTH: Final = 200
"""Characters in a recurring schedule's name."""

MAX_STEP_NAME_LENGTH: Final = 200
"""Characters in a resumable step's name (``job.step(name, ...)``)."""

MAX_TAGS: Final = 16
"""Tags one job may carry (``tags=``)."""

MAX_TAG_LENGTH: Final = 64
"""Characters in a tag (letters, digits and ``_.:/=-``, starting with a letter or
digit)."""

MAX_META_BYTES: Final = 4096
"""A job's ``meta`` object, as compact JSON, at most this many bytes: it is shown in
every list and read by every search, so it stays small (the payload is for data)."""

MAX_TENANT_WEIGHT: Final = 1000.0
"""The largest fair-share weight of a tenant (the smallest is above 0)."""

MAX_REPLAY_BATCH: Final = 100_000
"""Jobs one ``retry_jobs`` (``jobctl jobs retry --all``) replays at most."""

MIN_RETRY_AFTER: Final = 1.0
"""The shortest retry-after (seconds) a refused enqueue of a tenant over its
``max_queued`` suggests."""

MAX_RETRY_AFTER: Final = 3600.0
"""The longest retry-after (seconds) a refused enqueue suggests."""

UNKNOWN_DRAIN_RETRY_AFTER: Final = 60.0
"""The retry-after (seconds) suggested when nothing of the tenant's drained lately,
so none can be estimated."""

# ------------------------------------------------------------------ recurring schedules

SCHEDULE_MAX_CATCHUP: Final = 10
"""Missed occurrences a schedule with ``catchup="all"`` fires at most after an outage
(the newest; the older ones are recorded as skipped)."""

SCHEDULE_KEEP_FIRES: Final = 1000
"""Occurrences kept in a schedule's ledger (what fired, what was skipped and why)."""

SCHEDULE_GRACE: Final = 60.0
"""An occurrence due up to this many seconds ago still counts as on time; an older
one was missed, and the schedule's ``catchup`` decides whether it fires."""

# ------------------------------------------------------------------ liveness (in the SQL)

WORKER_TTL_SECONDS: Final = 60.0
"""A consumer not heard from for this many seconds is gone. The relay forgets its row
after ``--worker-ttl``, and every judgement of liveness (the claim's refusals, the
relay's window and packing, explain, ``jobctl stats`` and ``workers``) uses this
figure, so a consumer judged gone cannot make explain say "no consumer" for a job a
live one is about to take. A consumer refreshes its row at least three times per TTL."""

RELAY_LIVE_SECONDS: Final = 30
"""A relay seen this recently is live: several of its heartbeats, so one slow round
does not make it look gone."""

REFUSAL_BACKSTOP_SECONDS: Final = 10
"""A wake-up a consumer turned down for want of a handler, while another live
consumer has it, comes due again after this many seconds at the latest. The relay
brings it forward as soon as such a consumer has a free slot."""

# ------------------------------------------------------------------ relay

RELAY_POLL_INTERVAL: Final = 1.0
"""Seconds between looks at the outbox when no NOTIFY arrives (a missed one)."""

RELAY_BATCH_SIZE: Final = 500
"""Wake-ups decided and published per transaction, at most."""

RELAY_WINDOW: Final[int | None] = None
"""Wake-ups in flight (sent, not yet taken up by a consumer) per queue. None (``0``
on the command line): twice the concurrency of the queue's live consumers, and at
least ``RELAY_MIN_WINDOW``, plus twice what they take during one of the relay's
decisions (relay/pace.py). The backlog beyond it waits in the tables, where
priority and fair share order it."""

RELAY_MIN_WINDOW: Final = 100
"""The smallest automatic window."""

RELAY_PACK: Final = 50
"""Job ids packed into one message when a batch holds several for a queue (at most
1000). At low load a message carries one id, so latency does not pay for it;
measured, 50 drains about 30% faster than 20, and 100 no faster."""

RELAY_REFILL_INTERVAL: Final = 0.005
"""While a backlog waits on a full window, seconds before looking again for room;
doubled while no room appears, up to ``RELAY_REFILL_INTERVAL_CAP``."""

RELAY_REFILL_INTERVAL_CAP: Final = 0.1
"""The longest wait between looks for room in a full window."""

RELAY_PUBLISHERS: Final = 2
"""Transactions in flight at once: while one waits for the broker's confirms, the
next queue's is already being decided."""

RELAY_PUBLISH_TIMEOUT: Final = 5.0
"""Seconds to wait for a batch's publisher confirms before rolling it back. The
publish inside the outbox transaction is the one network call allowed there, so it
must not hold row locks for long."""

RELAY_QUEUE_BACKOFF: Final = 0.5
"""A queue whose own publishes fail (RabbitMQ refuses them or their declaration,
confirms none in time, its decision times out) is tried again after this many
seconds, doubled up to ``RELAY_QUEUE_BACKOFF_CAP``, while every other queue carries on."""

RELAY_QUEUE_BACKOFF_CAP: Final = 5.0
"""The longest pause of a queue whose publishes fail."""

RELAY_SWEEP_INTERVAL: Final = 5.0
"""Seconds between sweeps for leases that expired without a report (their jobs are
retried or failed)."""

RELAY_SWEEP_BATCH: Final = 1000
"""Expired leases one sweep takes at most."""

RELAY_DEFAULT_BACKOFF: Final = 5.0
"""Seconds before retrying a job whose expired lease recorded no backoff (claimed by
a release before backoffs were recorded at claim)."""

RELAY_REWAKE_INTERVAL: Final = 30.0
"""A wake-up sent this many seconds ago and never taken up is sent again."""

RELAY_ORPHAN_INTERVAL: Final = 1.0
"""Seconds between rounds of the backstop for jobs with no wake-up at all."""

RELAY_ORPHAN_SLICE: Final = 5000
"""Jobs one round of that backstop reads, by primary key whatever their state: its
cost per round is fixed however long the table; a lap of a million jobs takes about
200 rounds."""

RELAY_REFUSAL_INTERVAL: Final = 0.05
"""While wake-ups turned down for want of a handler wait, seconds between looks for a
live consumer with the handler and a free slot."""

RELAY_RECONCILE_INTERVAL: Final = 30.0
"""Seconds between checks of tenants' held slots against the leases that hold them."""

RELAY_USAGE_INTERVAL: Final = 1.0
"""Seconds between counts of the waiting jobs of tenants with a ``max_queued``."""

RELAY_WORKER_TTL: Final = WORKER_TTL_SECONDS
"""Seconds after which the relay forgets a consumer or relay it has not heard from
(see ``WORKER_TTL_SECONDS``)."""

RELAY_HEARTBEAT_INTERVAL: Final = 5.0
"""Seconds between refreshes of the relay's row in ``relays`` (live, connected,
failing queues); at most a third of ``RELAY_LIVE_SECONDS``, to survive two lost
refreshes."""

RELAY_SCHEDULE_INTERVAL: Final = 1.0
"""Seconds between looks for due occurrences of recurring schedules."""

RELAY_STATS_INTERVAL: Final = 30.0
"""Seconds between the relay's log lines of figures (published, backlog per queue)."""

RELAY_KEEP_FINISHED: Final = 7 * 24 * 3600.0
"""Seconds a finished job is kept (with its attempts, and its dedup key taken) before
retention deletes it."""

RELAY_RETENTION_INTERVAL: Final = 30.0
"""Seconds between retention's rounds."""

RELAY_RETENTION_BATCH: Final = 1000
"""Finished jobs retention deletes per transaction."""

RELAY_KEEP_EFFECTS: Final[float | None] = None
"""Seconds an effect key (``tx.once``) is kept; None: for ever. A key forgotten lets a
later job with it do the effect again, so it must outlive the jobs
(``RELAY_KEEP_FINISHED``)."""

RELAY_WEBHOOK_CONCURRENCY: Final = 16
"""Webhook calls a relay has in flight at once, across endpoints."""

RELAY_WEBHOOK_PER_ENDPOINT: Final = 4
"""Webhook calls a relay has in flight at once to one endpoint (scheme, host and
port): a slow endpoint holds no more slots than this."""

RELAY_WEBHOOK_TIMEOUT: Final = 10.0
"""Seconds one webhook call may take (connecting, sending, the status line); then it
counts as failed."""

RELAY_WEBHOOK_MAX_ATTEMPTS: Final = 12
"""Calls made for one job's end before the relay gives up on it (GAVE_UP)."""

RELAY_WEBHOOK_BACKOFF: Final = 5.0
"""Seconds before a failed webhook call is made again, doubling with each attempt
(with jitter), up to ``RELAY_WEBHOOK_BACKOFF_CAP``."""

RELAY_WEBHOOK_BACKOFF_CAP: Final = 3600.0
"""The longest wait between two calls for one job's end."""

RELAY_WEBHOOK_ENDPOINT_BACKOFF: Final = 1.0
"""Seconds an endpoint whose call just failed rests (no call to it is made),
doubling with each failure in a row up to a minute; any success ends it."""

RELAY_WEBHOOK_INTERVAL: Final = 1.0
"""Seconds between a relay's looks for due webhook calls when it has none in hand."""

RELAY_WEBHOOK_ALLOW_HOSTS: Final = ""
"""Hosts and networks webhook calls may go to though they are not public addresses
(loopback, private, link-local), comma-separated: ``hooks.internal,10.1.0.0/16``.
Empty: calls go to public addresses only, so a URL a producer took from its own user
cannot reach into the network the relay runs in."""

# ------------------------------------------------------------------ consumer

CONSUMER_CONCURRENCY: Final = 10
"""Jobs running at once in one consumer process."""

CONSUMER_PREFETCH: Final = 0
"""Job ids held beyond the free slots (delivered, waiting for a slot). 0: as many as
the concurrency, twice that while the jobs prove short, back at once when a run
reaches 50 ms (consumers/prefetch.py). Ids past that are handed back for other
consumers."""

CONSUMER_LEASE_SECONDS: Final = 60.0
"""The lease a claim takes; heartbeats extend it while the handler runs. A worker
that stops heartbeating loses the job to the sweep after this long."""

CONSUMER_HEARTBEAT_SECONDS: Final = 0.0
"""Seconds between lease heartbeats; 0: a third of the lease, which tolerates one
lost heartbeat."""

CONSUMER_DRAIN_SECONDS: Final = 30.0
"""On SIGTERM, seconds running jobs may take to finish before the claims of async
handlers are given back (their attempt refunded); plain functions are waited for."""

CONSUMER_DEFAULT_TIMEOUT: Final[float | None] = 900.0
"""The time limit (seconds) of an attempt whose handler sets none; None (``0`` on the
command line): no limit."""

CONSUMER_FORCE_CANCEL_GRACE: Final = 10.0
"""Under ``consumer --processes``: seconds a plain-function handler whose job was
cancelled with force may take to return before its worker process is replaced (its
lease ends CANCELLED, the process exits and a fresh one takes its place). A thread
cannot be interrupted, so a single process leaves it to run, and ends the lease
CANCELLED when it returns."""

CONSUMER_CLAIM_BATCH: Final = 100
"""Jobs one claim statement takes at most."""

CONSUMER_REPORT_BATCH: Final = 500
"""Outcomes one report statement records at most."""

CONSUMER_STATS_INTERVAL: Final = 30.0
"""Seconds between the consumer's log lines of figures."""

CONSUMER_WORKER_TTL: Final = WORKER_TTL_SECONDS
"""Seconds after which a consumer's row, not refreshed, counts as gone (see
``WORKER_TTL_SECONDS``)."""

CONSUMER_TENANTS: Final[tuple[str, ...]] = ()
"""Dedicated tenants (``runners="dedicated"``) this consumer serves besides every
shared one (``consumer --tenant``, repeated)."""

CONSUMER_QUEUE_LIMITS: Final[tuple[tuple[str, int], ...]] = ()
"""Concurrency limits of queues this consumer records when it starts, as (queue,
limit) pairs (``consumer --queue-limit QUEUE=N``, repeated): at most that many of a
queue's jobs hold a lease at once, across every consumer. The last to record a
queue's limit wins; a consumer that names none leaves the recorded ones as they are."""

MAX_QUEUE_LIMIT: Final = 1_000_000
"""The largest concurrency limit a queue may be given (far past any fleet)."""

UNKNOWN_TYPE_RETRY_SECONDS: Final = 60.0
"""A job claimed for a type this consumer has no handler for (its registry changed
under it) is retried this many seconds later."""

MAX_RESULT_BYTES: Final = 64 * 1024
"""A handler's return value is kept as the job's result up to this many bytes of
JSON; a larger one is recorded as too large, not stored."""

MAX_RESULT_DEPTH: Final = 64
"""How deeply a kept result may nest."""

# ------------------------------------------------------------------ jobctl serve

SERVE_BIND_HOST: Final = "127.0.0.1"
"""``$JOBCTL_HOST`` / ``--host``: the address ``jobctl serve`` listens on. A specific
address is also a host name it answers to."""

SERVE_PORT: Final = 8080
"""``$JOBCTL_PORT`` / ``--port``."""

SERVE_POOL_SIZE: Final = 5
"""Database connections ``jobctl serve`` holds at most."""

SERVE_MAX_WAITERS: Final = 100
"""``GET /v1/jobs/{id}?wait=`` requests one ``jobctl serve`` process holds at once;
one more is answered 503 with ``Retry-After`` at once. Each held request keeps a
socket open (a file descriptor) for up to 30 s, and its job's end costs a read
through the pool (shared by the requests waiting for the same job)."""

SERVE_MAX_WAITERS_PER_CLIENT: Final = 20
"""Of those, the most one client (its address: the connection's peer, or the client
a trusted proxy names) may hold; one more is answered 429 with ``Retry-After``.
Behind a proxy that is not trusted (``--forwarded-allow-ips``), every client is the
proxy."""

SERVE_READINESS_SECONDS: Final = 2.0
"""``/readyz`` answers from a cache this many seconds old at most."""

SERVE_FAILURES_ALLOWED: Final = 10
"""Wrong tokens one client may send per window before it is refused for a while."""

SERVE_FAILURE_WINDOW_SECONDS: Final = 60.0
"""The window of that count, in seconds."""

SERVE_PROXY_FAILURES_ALLOWED: Final = 100
"""Wrong tokens that may come through one trusted proxy per window, from all the
clients behind it together, before every request through it is refused for a while
(each client behind it keeps its own, smaller, allowance)."""

SERVE_FORWARDED_ALLOW_IPS: Final = ""
"""``$JOBCTL_FORWARDED_ALLOW_IPS`` / ``--forwarded-allow-ips``: the reverse proxies
(addresses or networks, comma-separated) whose ``X-Forwarded-For`` and
``X-Forwarded-Proto`` are believed. None: every request is its socket's peer."""

MIN_TOKEN_BITS: Final = 128
"""``$JOBCTL_API_TOKEN`` must carry at least this many bits of randomness."""

PAGE_LIMIT: Final = 50
"""Jobs one page of a list shows when the request does not say."""

MAX_PAGE_LIMIT: Final = 500
"""Jobs one page of a list shows at most."""

METRICS_INTERVAL: Final = 15.0
"""Seconds between the collector's rounds for ``/metrics``, each spread by up to
``METRICS_JITTER`` of it so that several processes do not fall into step."""

METRICS_JITTER: Final = 0.1
"""The spread of those rounds, as a share of the interval."""

METRICS_STATEMENT_TIMEOUT: Final = 2.0
"""Seconds each statement of a round may run; a longer one fails the round and the
figures stay as they were."""

METRICS_OVERLAP: Final = 60.0
"""Seconds behind its high-water mark a round re-reads the history, for rows
committed after their timestamp."""

METRICS_BATCH: Final = 50_000
"""New history rows taken per source per round, at most; a backlog after an outage
is caught up over several rounds."""

METRICS_MAX_QUEUES: Final = 100
"""``$JOBCTL_METRICS_MAX_QUEUES``: distinct ``queue`` label values; past it, values
share the ``_other`` series."""

METRICS_MAX_JOB_TYPES: Final = 200
"""``$JOBCTL_METRICS_MAX_JOB_TYPES``: distinct ``job_type`` label values; past it,
values share the ``_other`` series."""

METRICS_FORGET_AFTER: Final = 3600.0
"""Seconds after which a label value not seen is forgotten with its series."""

METRICS_HISTORY_SPAN: Final = 3600.0
"""Seconds the dashboard's charts cover."""

METRICS_HISTORY_RESOLUTION: Final = 60.0
"""Seconds one point of those charts stands for."""
