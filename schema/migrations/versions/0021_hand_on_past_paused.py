"""A freed key or resource is handed to a job whose queue runs

The turn of a freed key (unordered) or resource went to its oldest waiting job
whatever its queue. A job of a paused queue then held it: the relay keeps a paused
queue's wake-ups back until the resume, and the other waiters, turned down while the
key or resource was busy, had no wake-up of their own until the orphan walk. Now
jobs_hand_on, like the end of a lease (fragments.key_wake_next, resource_wake_next),
wakes a waiter of a queue that runs first, and one of a paused queue only when no
other waits (its wake-up waits for the resume). An ordered key's next in order is
woken whatever its queue: none after it could run before it.
"""

from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"

_WAITING = "w.state IN ('QUEUED', 'RETRY_WAIT') AND w.run_after <= now()"
_RUNS = "NOT EXISTS (SELECT 1 FROM queues AS p WHERE p.queue = w.queue AND p.paused)"
_REFUSED = "w.delay_reason IN ('RESOURCE_BUSY', 'RESOURCE_UNCERTAIN')"


def _hand_on(key_pick: str, resource_pick: str) -> str:
    return f"""
CREATE OR REPLACE FUNCTION jobs_hand_on() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.key IS NOT NULL THEN
    -- the key's next waiting job (jobs_key_waiting_idx), if the key has room; a key
    -- at its limit wakes its next at the end of a lease
    INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
    SELECT w.job_id, w.queue, COALESCE(w.tenant, ''), w.priority, now()
    FROM ({key_pick}) AS w
    WHERE NOT EXISTS (SELECT 1 FROM key_usage AS u
                      WHERE u.key = NEW.key AND u.running >= u.key_limit)
      AND NOT EXISTS (SELECT 1 FROM outbox AS o
                      WHERE o.job_id = w.job_id AND o.sent_at IS NULL);
  END IF;
  IF NEW.resource IS NOT NULL THEN
    -- the resource's next waiting job, if no hold stands
    INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
    SELECT w.job_id, w.queue, COALESCE(w.tenant, ''), w.priority, now()
    FROM ({resource_pick}) AS w
    WHERE NOT EXISTS (SELECT 1 FROM resource_holds AS h WHERE h.resource = NEW.resource)
      AND NOT EXISTS (SELECT 1 FROM outbox AS o
                      WHERE o.job_id = w.job_id AND o.sent_at IS NULL);
  END IF;
  RETURN NULL;
END $$
"""


def _first(where: str, order: str) -> str:
    return f"""(SELECT w.job_id, w.queue, w.tenant, w.priority FROM jobs AS w
            WHERE {where} ORDER BY {order} LIMIT 1)"""


def _either(*picks: str) -> str:
    return "SELECT c.* FROM (" + "\n            UNION ALL ".join(picks) + ") AS c LIMIT 1"


# in key order, of a queue that runs unless the key is ordered; else the first in order
_KEY = _either(
    _first(
        f"w.key = NEW.key AND {_WAITING} AND (w.key_seq IS NOT NULL OR {_RUNS})",
        "w.key_seq, w.job_id",
    ),
    _first(f"w.key = NEW.key AND {_WAITING}", "w.key_seq, w.job_id"),
)
# the oldest turned down for it, else the oldest waiting, of a queue that runs; else
# the oldest waiting
_RESOURCE = _either(
    _first(f"w.resource = NEW.resource AND {_WAITING} AND {_REFUSED} AND {_RUNS}", "w.job_id"),
    _first(f"w.resource = NEW.resource AND {_WAITING} AND {_RUNS}", "w.job_id"),
    _first(f"w.resource = NEW.resource AND {_WAITING}", "w.job_id"),
)
# as 0019 left it
_KEY_0019 = _first("w.key = NEW.key AND " + _WAITING, "w.key_seq, w.job_id")
_RESOURCE_0019 = _either(
    _first(f"w.resource = NEW.resource AND {_WAITING} AND {_REFUSED}", "w.job_id"),
    _first(f"w.resource = NEW.resource AND {_WAITING}", "w.job_id"),
)


def upgrade() -> None:
    op.execute(_hand_on(_KEY, _RESOURCE))


def downgrade() -> None:
    op.execute(_hand_on(_KEY_0019, _RESOURCE_0019))
