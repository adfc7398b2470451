"""Deadlines (jobs.expires_at): no attempt starts after it. A claim that meets a job
past its deadline ends it CANCELLED, code EXPIRED, and deletes its pending wake-ups;
the relay ends the ones nobody claims (JOB_EXPIRE_WAITING). The end of a waiting
job with a key or resource passes its turn on (trigger jobs_hand_on)."""

from __future__ import annotations

from typing import Final

USES: Final = "j.expires_at IS NOT NULL"

# Not a delay reason: a job past its deadline is not delayed, it ends.
REASONS: Final = ()

LOCKED_COLUMN: Final = "COALESCE(j.expires_at <= now(), false) AS expired"
LOCKED_COLUMN_ABSENT: Final = "false AS expired"

CLAIM_END: Final = """expired_ended AS (
    -- 3g. past its deadline: never started, it ends here (it holds no slot while it
    -- waits), and its pending wake-ups go; the used one goes with used_up.
    UPDATE jobs AS j
    SET state = 'CANCELLED', last_error_code = 'EXPIRED',
        last_error_message = 'not started by its deadline, ' || j.expires_at::text,
        delay_reason = NULL, delay_since = NULL,
        finished_at = statement_timestamp(), updated_at = now()
    FROM refused AS r
    WHERE j.job_id = r.job_id AND r.reason = 'EXPIRED'
    RETURNING j.job_id
), expired_unwoken AS (
    -- 3h. its pending wake-ups deleted
    DELETE FROM outbox AS o
    WHERE EXISTS (SELECT 1 FROM refused WHERE reason = 'EXPIRED')
      AND o.job_id = ANY(ARRAY(SELECT job_id FROM refused WHERE reason = 'EXPIRED'))
      AND o.sent_at IS NULL
)"""

REFUSED: Final = "WHEN l.expired THEN 'EXPIRED'"
