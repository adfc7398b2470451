"""Enqueue from SQL: the function hybrid_jobs_enqueue

A trigger, a migration, psql or a service in another language enqueues a job with
one call, in its own transaction: ``SELECT hybrid_jobs_enqueue('send_email',
'{"to": "a@example.com"}')``. It checks its arguments as ``outbox.enqueue`` does
(names, payload size and depth, priority, attempts, tags, meta; a refusal raises
SQLSTATE 22023 naming the argument and writes nothing), holds a tenant to its
max_queued and max_enqueue_rate as the producer does (SQLSTATE 53400), and writes
what JOB_INSERT_MANY writes for such a job: the row, its tags and its wake-up, in
one statement, the outbox trigger notifying the relay at commit. A dedup_key taken
already for the job type returns the existing job's id and writes nothing. The id
is a UUIDv7, as the producer's (outbox.validation.new_job_id).

The limits are copied here, not imported, so that this migration keeps meaning what
it meant; tests/unit/test_sql_enqueue_limits.py fails when hybrid_jobs/defaults.py
moves away from them, and a later migration then replaces the function. The
function runs with the search_path the migration ran with, where the tables are.

Takes no lock on any table: CREATE FUNCTION writes the catalog only.
"""

from __future__ import annotations

from alembic import op

revision: str = "0027"
down_revision: str | None = "0026"

# hybrid_jobs/defaults.py, as of this migration
MAX_JOB_TYPE_LENGTH = 200
MAX_QUEUE_NAME_LENGTH = 100
MAX_DEDUP_KEY_LENGTH = 500
MAX_PAYLOAD_BYTES = 256 * 1024
MAX_PAYLOAD_DEPTH = 100
MAX_ATTEMPTS_LIMIT = 1000
MAX_TAGS = 16
MAX_TAG_LENGTH = 64
MAX_META_BYTES = 4096
MIN_RETRY_AFTER = 1.0
MAX_RETRY_AFTER = 3600.0
UNKNOWN_DRAIN_RETRY_AFTER = 60.0
# schema/tables.py
QUEUE_NAME_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9_.:-]{{0,{MAX_QUEUE_NAME_LENGTH - 1}}}$"
TAG_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9_.:/=-]{{0,{MAX_TAG_LENGTH - 1}}}$"
# The setting that changes the payload limit, as $MAX_PAYLOAD_BYTES does for Python.
PAYLOAD_SETTING = "hybrid_jobs.max_payload_bytes"

SIGNATURE = (
    "hybrid_jobs_enqueue(text, jsonb, text, text, timestamptz, interval, integer, integer,"
    " text, text[], jsonb)"
)


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _refuse(message: str, *args: str) -> str:
    """Raise invalid_parameter_value with ``message`` (format()'s %s filled by
    ``args``, SQL expressions)."""
    text = f"format({', '.join([_literal(message), *args])})" if args else _literal(message)
    return f"RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = {text};"


def _name(var: str, label: str, max_length: int, *, controls: bool = False) -> str:
    """schema.names.text's checks of a non-null text (what text cannot hold, NUL and
    invalid UTF-8, never reaches a function)."""
    checks = f"""
  IF {var} = '' THEN
    {_refuse(f"{label} must not be empty")}
  ELSIF char_length({var}) > {max_length} THEN
    {_refuse(f"{label} is %s characters long; the limit is {max_length}", f"char_length({var})")}"""
    if not controls:
        checks += f"""
  ELSIF {var} ~ '[\\x01-\\x1f\\x7f-\\x9f]' THEN
    {_refuse(f"{label} must not contain control characters (newlines, tabs, escapes)")}"""
    return checks + "\n  END IF;"


def _alphabet(var: str, label: str) -> str:
    return (
        _name(var, label, MAX_QUEUE_NAME_LENGTH)
        + f"""
  IF {var} !~ {_literal(QUEUE_NAME_PATTERN)} THEN
    {
            _refuse(
                f"{label} must be 1-{MAX_QUEUE_NAME_LENGTH} characters of letters, digits"
                " and _ . : - and start with a letter or digit"
            )
        }
  END IF;"""
    )


def _json(var: str, label: str, limit: str, limit_name: str) -> str:
    """outbox.validation._encode's checks: nesting, then the size as compact JSON
    (jsonb's text has a space after each , and : outside strings, which compact JSON
    has not). The text of a value within the limit is within it compact too: only a
    larger one pays for counting."""
    return f"""
  IF jsonb_path_exists({var}, 'strict $.**{{{MAX_PAYLOAD_DEPTH} to last}}
                               ? (@.type() == "object" || @.type() == "array")') THEN
    {
        _refuse(
            f"{label} nests objects and arrays more than {MAX_PAYLOAD_DEPTH} levels deep"
            " (MAX_PAYLOAD_DEPTH)"
        )
    }
  END IF;
  _text := {var}::text;
  IF octet_length(_text) > {limit} THEN
    _rest := regexp_replace(_text, '"(?:[^"\\\\]|\\\\.)*"', '', 'g');
    _size := octet_length(_text) - (length(_rest) - length(replace(_rest, ' ', '')));
    IF _size > {limit} THEN
      {_refuse(f"{label} is %s bytes as JSON; the limit is %s ({limit_name})", "_size", limit)}
    END IF;
  END IF;"""


def _function() -> str:
    return f"""
CREATE FUNCTION hybrid_jobs_enqueue(
    job_type text,
    payload jsonb,
    queue text DEFAULT 'default',
    dedup_key text DEFAULT NULL,
    run_after timestamptz DEFAULT NULL,
    delay interval DEFAULT NULL,
    priority integer DEFAULT 0,
    max_attempts integer DEFAULT NULL,
    tenant text DEFAULT NULL,
    tags text[] DEFAULT '{{}}',
    meta jsonb DEFAULT NULL
) RETURNS uuid
LANGUAGE plpgsql
VOLATILE
SET search_path FROM CURRENT
AS $function$
#variable_conflict use_column
DECLARE
  _limit integer := COALESCE(
      NULLIF(current_setting({_literal(PAYLOAD_SETTING)}, true), '')::integer,
      {MAX_PAYLOAD_BYTES});
  _text text;
  _rest text;
  _size bigint;
  _tag text;
  _tags text[] := '{{}}';
  _meta jsonb := meta;
  _due timestamptz;
  _bytes bytea;
  _id uuid;
  _found uuid;
  _limits record;
BEGIN
  IF job_type IS NULL THEN
    {_refuse("job_type must not be null")}
  END IF;
  {_name("job_type", "job_type", MAX_JOB_TYPE_LENGTH)}
  IF queue IS NULL THEN
    {_refuse("queue must not be null")}
  END IF;
  {_alphabet("queue", "queue")}
  IF dedup_key IS NOT NULL THEN
    {_name("dedup_key", "dedup_key", MAX_DEDUP_KEY_LENGTH, controls=True)}
  END IF;
  IF tenant IS NOT NULL THEN
    {_alphabet("tenant", "tenant")}
  END IF;
  IF max_attempts IS NOT NULL AND max_attempts NOT BETWEEN 1 AND {MAX_ATTEMPTS_LIMIT} THEN
    {_refuse(f"max_attempts must be between 1 and {MAX_ATTEMPTS_LIMIT}")}
  END IF;
  IF priority IS NULL OR priority NOT BETWEEN -32768 AND 32767 THEN
    {_refuse("priority must fit in a smallint (-32768..32767)")}
  END IF;
  IF run_after IS NOT NULL AND delay IS NOT NULL THEN
    {_refuse("run_after and delay both say when the job is due: give one")}
  END IF;
  IF NOT isfinite(run_after) THEN
    {_refuse("run_after must be a finite time")}
  END IF;
  IF array_ndims(tags) > 1 THEN
    {_refuse("tags must be a one-dimensional array of text")}
  END IF;
  FOREACH _tag IN ARRAY COALESCE(tags, '{{}}') LOOP
    IF _tag IS NULL THEN
      {_refuse("tags: tag must not be null")}
    END IF;
    {_name("_tag", "tags: tag", MAX_TAG_LENGTH)}
    IF _tag !~ {_literal(TAG_PATTERN)} THEN
      {
        _refuse(
            f"tags: tag %L must be 1-{MAX_TAG_LENGTH} characters of letters, digits and"
            " _ . : / = - and start with a letter or digit",
            "_tag",
        )
    }
    END IF;
    IF NOT _tag = ANY(_tags) THEN
      _tags := _tags || _tag;
    END IF;
  END LOOP;
  IF cardinality(_tags) > {MAX_TAGS} THEN
    {_refuse(f"tags holds %s tags; a job carries at most {MAX_TAGS}", "cardinality(_tags)")}
  END IF;
  IF jsonb_typeof(_meta) = 'null' OR _meta = '{{}}' THEN
    _meta := NULL;  -- store nothing, as the producer does for None and {{}}
  ELSIF jsonb_typeof(_meta) <> 'object' THEN
    {_refuse("meta must be a JSON object, not %s", "jsonb_typeof(_meta)")}
  END IF;
  IF _meta IS NOT NULL THEN
    {_json("_meta", "meta", str(MAX_META_BYTES), "MAX_META_BYTES")}
  END IF;
  {_json("payload", "payload", "_limit", PAYLOAD_SETTING)}

  IF tenant IS NOT NULL THEN
    -- outbox.backpressure: the tenant's max_queued (TENANT_BACKPRESSURE) ...
    SELECT l.max_queued,
           u.queued + (SELECT count(*) FROM (
                           SELECT 1 FROM jobs AS j
                           WHERE j.tenant = l.tenant AND j.state IN ('QUEUED', 'RETRY_WAIT')
                             AND j.created_at > COALESCE(u.queued_at, '-infinity')
                           ORDER BY j.created_at
                           LIMIT l.max_queued) AS since) AS waiting,
           u.drain_per_s
    INTO _limits
    FROM tenant_limits AS l JOIN tenant_usage AS u USING (tenant)
    WHERE l.tenant = hybrid_jobs_enqueue.tenant AND l.max_queued IS NOT NULL;
    IF FOUND AND _limits.waiting + 1 > _limits.max_queued THEN
      RAISE EXCEPTION USING
        ERRCODE = 'configuration_limit_exceeded',
        MESSAGE = format('tenant %L has %s jobs waiting, its max_queued is %s; retry in about %s s',
                         tenant, _limits.waiting, _limits.max_queued,
                         round(CASE WHEN _limits.drain_per_s > 0
                                    THEN least(greatest((_limits.waiting + 1 - _limits.max_queued)
                                                        / _limits.drain_per_s,
                                                        {MIN_RETRY_AFTER}),
                                               {MAX_RETRY_AFTER})
                                    ELSE {UNKNOWN_DRAIN_RETRY_AFTER} END::numeric, 1)),
        HINT = 'Retry later: the tenant''s waiting jobs must drain below its max_queued.';
    END IF;
    -- ... and its max_enqueue_rate (TENANT_ENQUEUE_TAKE), a token taken under the
    -- tenant's lock, held until the caller commits
    WITH level AS MATERIALIZED (
        SELECT l.tenant, l.max_enqueue_rate AS rate,
               LEAST(GREATEST(l.max_enqueue_rate, 1),
                     COALESCE(l.enqueue_tokens, GREATEST(l.max_enqueue_rate, 1))
                     + l.max_enqueue_rate * GREATEST(0, EXTRACT(EPOCH FROM
                           now() - COALESCE(l.enqueue_refilled_at, now()))::float8)) AS tokens
        FROM tenant_limits AS l
        WHERE l.tenant = hybrid_jobs_enqueue.tenant AND l.max_enqueue_rate IS NOT NULL
        FOR NO KEY UPDATE OF l
    ), taken AS (
        UPDATE tenant_limits AS l
        SET enqueue_tokens = v.tokens - 1,
            enqueue_refilled_at = GREATEST(now(), l.enqueue_refilled_at)
        FROM level AS v
        WHERE l.tenant = v.tenant AND v.tokens >= 1
    )
    SELECT rate, tokens INTO _limits FROM level WHERE tokens < 1;
    IF FOUND THEN
      RAISE EXCEPTION USING
        ERRCODE = 'configuration_limit_exceeded',
        MESSAGE = format('tenant %L enqueues faster than %s jobs/s; retry in about %s s',
                         tenant, _limits.rate,
                         round(greatest(0, (1 - _limits.tokens) / _limits.rate)::numeric, 1)),
        HINT = 'Retry later: the tenant''s max_enqueue_rate has no token left.';
    END IF;
  END IF;

  -- a UUIDv7 (RFC 9562), as outbox.validation.new_job_id makes: 48 bits of Unix
  -- milliseconds over a version 4 UUID's random bits, its version nibble made 7
  _bytes := uuid_send(gen_random_uuid());
  _bytes := overlay(_bytes PLACING substring(
      int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
      FROM 1 FOR 6);
  _bytes := set_byte(_bytes, 6, (get_byte(_bytes, 6) & 15) | 112);
  _id := encode(_bytes, 'hex')::uuid;
  _due := COALESCE(run_after, now() + COALESCE(delay, interval '0'));

  -- JOB_INSERT_MANY for one job without key, resource, parents, approval, deadline
  -- or rate limit: the row, its tags, its wake-up
  WITH inserted AS (
    INSERT INTO jobs AS j
        (job_id, job_type, queue, tenant, payload, dedup_key, max_attempts, priority, run_after,
         scheduled_for, approval, trace_context, expires_at, rate_limit, key, key_limit,
         key_order, key_seq, resource, parents_pending, on_parent_failure, delay_reason,
         delay_since, tags, meta)
    VALUES (_id, hybrid_jobs_enqueue.job_type, hybrid_jobs_enqueue.queue,
            hybrid_jobs_enqueue.tenant, COALESCE(payload, 'null'::jsonb),
            hybrid_jobs_enqueue.dedup_key, hybrid_jobs_enqueue.max_attempts,
            hybrid_jobs_enqueue.priority, _due, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
            NULL, NULL, NULL, 0, NULL, NULL, NULL, _tags, _meta)
    ON CONFLICT (job_type, dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING
    RETURNING j.job_id, j.queue, j.tenant, j.priority, j.run_after, j.tags
  ), tagged AS (
    INSERT INTO job_tags (tag, job_id)
    SELECT t.tag, n.job_id FROM inserted AS n CROSS JOIN LATERAL unnest(n.tags) AS t(tag)
  ), woken AS (
    INSERT INTO outbox (job_id, queue, tenant, priority, available_at)
    SELECT job_id, queue, COALESCE(tenant, ''), priority, run_after FROM inserted
  )
  SELECT job_id INTO _found FROM inserted;
  IF _found IS NOT NULL THEN
    RETURN _found;
  END IF;
  -- The dedup_key is taken. A statement of its own: it takes a fresh snapshot, so
  -- it sees the job of a concurrent transaction the insert waited for.
  SELECT j.job_id INTO _found FROM jobs AS j
  WHERE j.job_type = hybrid_jobs_enqueue.job_type
    AND j.dedup_key = hybrid_jobs_enqueue.dedup_key;
  IF _found IS NULL THEN
    RAISE EXCEPTION USING
      ERRCODE = 'serialization_failure',
      MESSAGE = format('dedup_key %L for %L conflicted but no job holds it;'
                       ' retry the transaction', dedup_key, job_type);
  END IF;
  RETURN _found;
END
$function$
"""


def upgrade() -> None:
    op.execute(_function())
    op.execute(
        f"COMMENT ON FUNCTION {SIGNATURE} IS 'Enqueue a job and its wake-up in the"
        " caller''s transaction, checked as outbox.enqueue checks it; returns its id, or"
        " with a dedup_key taken already for the job type, the existing job''s id.'"
    )


def downgrade() -> None:
    op.execute(f"DROP FUNCTION {SIGNATURE}")
