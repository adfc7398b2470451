"""Inputs stored by reference (``outbox.store_input``): a job's payload held once in
job_inputs and named by jobs.payload_ref. A job without one never runs any of these:
the claim only returns the column, and the consumer reads the inputs of a batch's
jobs that have one in one more statement (INPUT_READ)."""

from __future__ import annotations

from typing import Final

from hybrid_jobs.schema.queries.fragments import WHO
from hybrid_jobs.schema.tables import TERMINAL_SQL

# Stores one input in the producer's transaction: rolled back with it, committed with
# it. The id is the producer's (a UUIDv7), returned to it before the commit.
INPUT_STORE: Final = """
INSERT INTO job_inputs (input_id, content, size_bytes, sensitive)
VALUES (%(input_id)s, %(content)s::jsonb, %(size_bytes)s, %(sensitive)s)
"""

# Before a batch naming inputs is inserted: the inputs it names, locked FOR KEY SHARE
# (the lock the trigger jobs_payload_ref_check takes too), so that one missing or redacted is
# refused with its name before anything is written, and retention, whose lock
# conflicts with it and skips a locked input, cannot delete one between this check
# and the producer's commit.
INPUT_LOCK: Final = """
SELECT input_id, redacted_at
FROM job_inputs
WHERE input_id = ANY(%(input_ids)s::uuid[])
ORDER BY input_id
FOR KEY SHARE
"""

# The consumer, after a claim that returned jobs with a payload_ref: their inputs'
# content, in one read by primary key; a redacted one has no content and says when
# and why.
INPUT_READ: Final = """
SELECT input_id, content, redacted_at, redaction_reason
FROM job_inputs
WHERE input_id = ANY(%(input_ids)s::uuid[])
"""

# What an operator sees of an input: never its content. How many jobs name it, and
# how many of those have not finished, counted up to 10000 each.
_INPUT_COLUMNS: Final = f"""
i.input_id, i.size_bytes, i.sensitive, i.created_at, i.redacted_at, i.redacted_by,
i.redaction_reason,
(SELECT count(*) FROM (SELECT 1 FROM jobs AS r WHERE r.payload_ref = i.input_id
                       LIMIT 10000) AS n) AS jobs,
(SELECT count(*) FROM (SELECT 1 FROM jobs AS r WHERE r.payload_ref = i.input_id
                         AND r.state NOT IN ({TERMINAL_SQL}) LIMIT 10000) AS n) AS unfinished
"""

INPUT_GET: Final = f"""
SELECT {_INPUT_COLUMNS}
FROM job_inputs AS i
WHERE i.input_id = %(input_id)s
"""

# The same, of the input a job names (no row: the job carries its payload).
INPUT_OF_JOB: Final = f"""
SELECT {_INPUT_COLUMNS}
FROM jobs AS j
JOIN job_inputs AS i ON i.input_id = j.payload_ref
WHERE j.job_id = %(job_id)s
"""

# outbox.explain of a waiting job on a stored input: whether, when, by whom and why
# its input was redacted (no row: it was not).
INPUT_REDACTION: Final = """
SELECT redacted_at, redacted_by, redaction_reason
FROM job_inputs
WHERE input_id = %(input_id)s AND redacted_at IS NOT NULL
"""

# An erasure: the content goes for good, the jobs and their history stay. Only once:
# a second redaction changes nothing and returns no row (INPUT_GET then says when the
# first was made). A job that has not started fails at its claim with INPUT_REDACTED;
# one running already read the content.
INPUT_REDACT: Final = f"""
UPDATE job_inputs
SET content = NULL, redacted_at = now(), redacted_by = COALESCE(%(by)s::text, {WHO}),
    redaction_reason = %(reason)s
WHERE input_id = %(input_id)s AND redacted_at IS NULL
RETURNING redacted_at
"""

# Retention (relay --keep-finished): a batch of inputs stored longer ago than
# keep_seconds that no job names any more (its jobs deleted by retention, or it was
# never enqueued), oldest first. The age gives a producer that stores an input in one
# transaction and enqueues in a later one that long. An input a producer's enqueue
# holds (INPUT_LOCK) is skipped; one named by a job committed after this statement's
# snapshot makes the trigger job_inputs_keep_named refuse the delete, and the relay tries again next
# round.
INPUT_RETENTION_DELETE: Final = """
WITH doomed AS (
    SELECT i.input_id
    FROM job_inputs AS i
    WHERE i.created_at < now() - make_interval(secs => %(keep_seconds)s)
      AND NOT EXISTS (SELECT 1 FROM jobs AS j WHERE j.payload_ref = i.input_id)
    ORDER BY i.created_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), deleted AS (
    DELETE FROM job_inputs AS i
    WHERE i.input_id = ANY(ARRAY(SELECT input_id FROM doomed))
    RETURNING 1
)
SELECT count(*) FROM deleted
"""
