"""Checks every argument of an enqueue before anything is written.

A bad argument raises ``TypeError`` (wrong kind of value) or ``ValueError`` (right
kind, unacceptable value) naming the argument; the caller's transaction is untouched.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from hybrid_jobs import defaults
from hybrid_jobs.schema import names

DEFAULT_MAX_PAYLOAD_BYTES = defaults.MAX_PAYLOAD_BYTES
MAX_PAYLOAD_BYTES_ENV = "MAX_PAYLOAD_BYTES"
DEFAULT_MAX_INPUT_BYTES = defaults.MAX_INPUT_BYTES
MAX_INPUT_BYTES_ENV = "MAX_INPUT_BYTES"
# JSON libraries stop somewhere (Python's json at about 1000 levels, pydantic's
# serialiser at 255, PostgreSQL at its stack depth), and a job that one of them
# cannot read back is one no surface can show and no handler can take. Ruby's
# JSON.parse has the same default, max_nesting 100.
MAX_PAYLOAD_DEPTH = defaults.MAX_PAYLOAD_DEPTH
PRIORITY_RANGE = range(-32768, 32768)  # smallint
MAX_ATTEMPTS_LIMIT = defaults.MAX_ATTEMPTS_LIMIT

# An escaped NUL in JSON text: \u0000 preceded by an even number of backslashes.
_ESCAPED_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")

# What enqueue's ``json_default`` is: ``json.dumps``'s ``default``, called with a
# value JSON cannot hold, returning one it can (or raising TypeError).
JsonDefault = Callable[[Any], Any]
# How many times in a row json_default may return a value it must be called on
# again (an object turned into another object, then into JSON): a function that
# never reaches JSON is refused instead of looping.
MAX_JSON_DEFAULT_CHAIN = 10


@dataclass(frozen=True)
class NewJob:
    """One job for :func:`outbox.enqueue_many`; the fields mean what enqueue's do."""

    job_type: str
    payload: Any = None
    queue: str = "default"
    dedup_key: str | None = None
    run_after: datetime | timedelta | None = None
    max_attempts: int | None = None
    priority: int = 0
    tenant: str | None = None
    needs_approval: bool = False

    expires: datetime | timedelta | None = None
    rate_limit: str | None = None
    debounce: timedelta | None = None
    debounce_max: timedelta | None = None
    key: str | None = None
    key_limit: int | None = None
    ordered: bool | str = False
    after: Sequence[uuid.UUID | str] = ()
    on_parent_failure: str = "cancel"
    resource: str | None = None
    json_default: JsonDefault | None = None
    tags: Collection[str] = ()
    meta: Mapping[str, Any] | None = None
    unique: str | timedelta = "forever"
    payload_ref: uuid.UUID | str | None = None
    on_complete_url: str | None = None
    weight: int = 1


# How many parents one job may wait for (enqueue's after=): enough for a fan-in
# callback after a large group, small enough that one enqueue's lock of its
# parents and the edges it writes stay bounded.
MAX_PARENTS = defaults.MAX_PARENTS
ON_PARENT_FAILURE = ("cancel", "run")


def parent_ids(job: NewJob) -> list[uuid.UUID]:
    """The job's ``after``, checked: UUIDs (or their text), each once, at most
    MAX_PARENTS, and ``on_parent_failure`` one of 'cancel' and 'run'."""
    if job.on_parent_failure not in ON_PARENT_FAILURE:
        raise ValueError(
            f"on_parent_failure must be 'cancel' or 'run', not {job.on_parent_failure!r}"
        )
    after = job.after
    if type(after) is tuple and not after:  # the default, most jobs: nothing to check
        return []
    if isinstance(after, str | bytes | uuid.UUID) or not isinstance(after, Sequence):
        raise TypeError(f"after must be a list of job ids, not {type(after).__name__}")
    if len(after) > MAX_PARENTS:
        raise ValueError(f"after names {len(after)} jobs; a job waits for at most {MAX_PARENTS}")
    ids: list[uuid.UUID] = []
    for value in after:
        if isinstance(value, uuid.UUID):
            ids.append(value)
        elif isinstance(value, str):
            try:
                ids.append(uuid.UUID(value.strip()))
            except ValueError:
                raise ValueError(
                    f"after holds a value that is not a job id: {value[:100]!r}"
                ) from None
        else:
            raise TypeError(f"after must hold job ids, not {type(value).__name__}")
    if len(set(ids)) < len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ValueError(f"after names job {dup} more than once")
    if ids and job.needs_approval:
        # The end of the last parent makes a job due (the trigger that settles it
        # knows nothing of approvals): both at once would either run unapproved or
        # fail the parent's own end against the approval hold.
        raise ValueError(
            "needs_approval takes no after: a job waits for its parents or for an"
            " approval, not both; to approve a flow, enqueue the approval as a job of"
            " its own (needs_approval=True) and name it in after="
        )
    if ids and job.debounce is not None:
        # A debounced enqueue may land on an existing job: whose parents would count?
        raise ValueError("a debounced job takes no after")
    if ids and job.run_after is not None:
        # The last parent's end makes it due; a run_after would be silently dropped.
        raise ValueError("after takes no run_after: the job is due when its parents are done")
    return ids


DEFAULT_KEY_LIMIT = defaults.KEY_LIMIT
MAX_KEY_LIMIT = defaults.MAX_KEY_LIMIT


def key_fields(
    key: object, key_limit: object, ordered: object
) -> tuple[str | None, int | None, str | None]:
    """The job's key, its limit and its order ('ordered', 'strict' or None), checked."""
    if ordered is True:
        order: str | None = "ordered"
    elif ordered is False or ordered is None:
        order = None
    elif ordered == "strict":
        order = "strict"
    else:
        raise ValueError(f"ordered must be True, False or 'strict', not {ordered!r}")
    if key is None:
        if key_limit is not None:
            raise ValueError("key_limit needs a key")
        if order is not None:
            raise ValueError("ordered needs a key: jobs are ordered per key")
        return None, None, None
    name = names.key(key)
    if key_limit is None:
        return name, DEFAULT_KEY_LIMIT, order
    if not isinstance(key_limit, int) or isinstance(key_limit, bool):
        raise TypeError(f"key_limit must be an int, not {type(key_limit).__name__}")
    if not 1 <= key_limit <= MAX_KEY_LIMIT:
        raise ValueError(f"key_limit must be between 1 and {MAX_KEY_LIMIT}")
    if order is not None and key_limit > 1:
        # An ordered job starts only once no earlier job of its key waits or runs
        # (the claim's key_behind), so ordered jobs of a key run one at a time
        # whatever the limit: a larger one would promise a parallelism never given.
        raise ValueError(
            "ordered jobs of a key run one at a time: ordered takes no key_limit above 1"
        )
    return name, key_limit, order


def new_job_id() -> uuid.UUID:
    """A UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, then random bits. Ids
    created close together sort close together, so the primary key index grows at
    its right edge instead of touching a random page per insert, and a list of jobs
    in id order is in creation order (the clock of whoever enqueued them; ordering
    only, never a decision)."""
    return new_job_ids(1)[0]


def new_job_ids(n: int) -> list[uuid.UUID]:
    """``n`` ids as :func:`new_job_id` makes them, in ascending order (a batch's
    jobs take them in its order, so id order stays creation order), their random
    bits from one read of the operating system's source: a batch of 100,000 made
    one at a time paid a system call for each."""
    millis = time.time_ns() // 1_000_000 & (1 << 48) - 1
    stamp = (millis << 80) | (0x7 << 76) | (0b10 << 62)
    pool = secrets.token_bytes(10 * n)
    values = []
    for at in range(0, 10 * n, 10):
        rand = int.from_bytes(pool[at : at + 10], "big")
        values.append(stamp | ((rand >> 64) & 0xFFF) << 64 | (rand & (1 << 62) - 1))
    values.sort()
    return [uuid.UUID(int=value) for value in values]


def max_payload_bytes() -> int:
    return _limit(MAX_PAYLOAD_BYTES_ENV, DEFAULT_MAX_PAYLOAD_BYTES)


def max_input_bytes() -> int:
    """The bound of an input stored by reference (``$MAX_INPUT_BYTES``, else
    MAX_INPUT_BYTES in hybrid_jobs/defaults.py)."""
    return _limit(MAX_INPUT_BYTES_ENV, DEFAULT_MAX_INPUT_BYTES)


def _limit(env: str, default: int) -> int:
    raw = os.environ.get(env)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{env} must be an integer number of bytes") from None
    if value < 1:
        raise ValueError(f"{env} must be positive")
    return value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _walk(value: Any, stop: int) -> tuple[int, bool]:
    """How deeply ``value``'s dicts, lists and tuples nest (a scalar: 0), counted
    without recursion and no further than ``stop + 1`` (so a self-referencing value
    or one nested 100,000 deep costs no more than one just past the limit), and
    whether every dict key met on the way is a string: one walk for both, since
    enqueue needs both of every payload."""
    deepest = 0
    str_keys = True
    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            if str_keys and not all(isinstance(k, str) for k in item):
                str_keys = False
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        if depth > stop:
            return deepest, str_keys
        # only what can nest further: a scalar would be popped again for nothing
        for child in children:
            if isinstance(child, dict | list | tuple):
                pending.append((child, depth))
    return deepest, str_keys


def nesting_depth(value: Any, stop: int = MAX_PAYLOAD_DEPTH) -> int:
    """How deeply ``value``'s dicts, lists and tuples nest (a scalar: 0), counted no
    further than ``stop + 1``."""
    return _walk(value, stop)[0]


def check_depth(name: str, value: Any) -> None:
    """ValueError naming ``name`` when ``value`` nests deeper than MAX_PAYLOAD_DEPTH."""
    if nesting_depth(value) > MAX_PAYLOAD_DEPTH:
        raise _too_deep(name)


def _too_deep(name: str) -> ValueError:
    return ValueError(
        f"{name} nests objects and arrays more than {MAX_PAYLOAD_DEPTH} levels deep"
        " (MAX_PAYLOAD_DEPTH)"
    )


def read_json(text: str | None) -> tuple[Any, bool]:
    """JSON read back from a table (``jsonb::text``) as a value, and True; or, for a
    value nested deeper than MAX_PAYLOAD_DEPTH, its text and False. Rows written
    before enqueue bounded nesting, by hand, or a handler's deep result or progress
    would otherwise fail every reader on the way out (pydantic's serialiser stops at
    255 levels, Python's json at about 1000), so the job could not be looked at."""
    if text is None:
        return None, True
    try:
        value = json.loads(text)
    except RecursionError:
        return text, False
    if nesting_depth(value) > MAX_PAYLOAD_DEPTH:
        return text, False
    return value, True


def _where(path: tuple[str | int, ...], name: str) -> str:
    return name + "".join(f"[{step!r}]" for step in path)


def check_payload(name: str, value: Any) -> None:
    """:func:`check_depth`, and a TypeError naming the key and where it is when a
    dict in ``value`` has a key that is not a string, in one walk. JSON object keys
    are text: ``json.dumps`` would turn ``{1: "a"}`` into ``{"1": "a"}`` (and
    ``{1: "a", "1": "b"}`` into one key), so the handler would read back something
    other than what was enqueued."""
    depth, str_keys = _walk(value, MAX_PAYLOAD_DEPTH)
    if depth > MAX_PAYLOAD_DEPTH:
        check_depth(name, value)
    if not str_keys:
        path, key = _first_non_string_key(value)
        shown = repr(key)
        shown = shown if len(shown) <= 100 else shown[:100] + "..."
        raise TypeError(
            f"{name} has a key that is not a string: {shown}"
            f" ({type(key).__name__}) at {_where(path, name)}; JSON object"
            " keys are strings, so it would be stored as text (convert it"
            " yourself, e.g. str(key), if that is what you mean)"
        )


def _first_non_string_key(value: Any) -> tuple[tuple[str | int, ...], Any]:
    """Where the first key that is not a string is (only walked to say so: the
    depth is already bounded)."""
    pending: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while pending:
        item, path = pending.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    return path, key
                pending.append((child, (*path, key)))
        elif isinstance(item, list | tuple):
            pending.extend((child, (*path, i)) for i, child in enumerate(item))
    raise AssertionError("no key that is not a string")


# The values json.dumps writes as JSON itself; anything else needs a json_default.
_JSON_SCALARS = (str, int, float, type(None))  # bool is an int


def plain_json(name: str, value: Any, default: JsonDefault) -> Any:
    """``value`` with every value JSON cannot hold replaced by what ``default`` made
    of it (and so on, into what it returned), as ``json.dumps(value,
    default=default)`` would encode it; tuples become lists. Dict keys are kept as
    they are: ``default`` is for values, and :func:`check_payload` refuses a key
    that is not a string. A value ``default`` refuses (TypeError or ValueError)
    raises the same, naming where it is; nesting is bounded as it is for a payload,
    so a self-referencing value costs no more than one just past the limit."""
    if not callable(default):
        raise TypeError(
            f"json_default must be a function taking one value, not {type(default).__name__}"
        )

    def plain(item: Any, path: tuple[str | int, ...], depth: int, made: int) -> Any:
        if isinstance(item, _JSON_SCALARS):
            return item
        if isinstance(item, dict | list | tuple):
            if depth >= MAX_PAYLOAD_DEPTH:  # this one would be a level too many
                raise _too_deep(name)
            if isinstance(item, dict):
                return {k: plain(v, (*path, k), depth + 1, 0) for k, v in item.items()}
            return [plain(v, (*path, i), depth + 1, 0) for i, v in enumerate(item)]
        what = f"{_where(path, name)} is of type {type(item).__name__}"
        if made >= MAX_JSON_DEFAULT_CHAIN:
            raise TypeError(
                f"{name} is not JSON-serialisable: {what}, and json_default did not"
                f" make JSON of it in {MAX_JSON_DEFAULT_CHAIN} calls"
            )
        try:
            made_of_it = default(item)
        except (TypeError, ValueError) as exc:
            error = TypeError if isinstance(exc, TypeError) else ValueError
            raise error(
                f"{name} is not JSON-serialisable: {what}, which json_default refused ({exc})"
            ) from exc
        return plain(made_of_it, path, depth, made + 1)

    return plain(value, (), 0, 0)


def _unencodable(value: Any, name: str) -> str | None:
    """Where the first value JSON cannot hold is in ``value`` (dict keys aside), and
    what it is; None if there is none. Only walked to say so, after ``json.dumps``
    refused the payload: the depth is bounded already."""
    pending: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while pending:
        item, path = pending.pop()
        # children pushed last first, so they are met in the document's order
        if isinstance(item, dict):
            pending.extend((child, (*path, key)) for key, child in reversed(item.items()))
        elif isinstance(item, list | tuple):
            pending.extend((item[i], (*path, i)) for i in reversed(range(len(item))))
        elif not isinstance(item, _JSON_SCALARS):
            return f"{_where(path, name)} is of type {type(item).__name__}"
    return None


def encode_payload(payload: Any, limit: int, json_default: JsonDefault | None = None) -> str:
    """The payload as compact JSON text, checked the way PostgreSQL's jsonb will.
    ``None`` is JSON ``null``, stored and handed to the handler as such; a dict key
    that is not a string is refused (:func:`check_payload`). A value JSON cannot
    hold (a datetime, a UUID, a Decimal) is refused, naming where it is, unless
    ``json_default`` makes JSON of it (:func:`plain_json`), before every check:
    what is checked and stored is what the handler will read."""
    if payload is None and limit >= len("null"):  # many jobs: nothing else to check
        return "null"
    return _encode("payload", payload, limit, MAX_PAYLOAD_BYTES_ENV, json_default)


def encode_input(content: Any, limit: int, json_default: JsonDefault | None = None) -> str:
    """An input stored by reference as compact JSON text, checked as a payload is
    (:func:`encode_payload`), against its own, larger bound."""
    return _encode("content", content, limit, MAX_INPUT_BYTES_ENV, json_default)


def input_id_arg(value: object, name: str = "payload_ref") -> uuid.UUID:
    """An input's id, as :func:`outbox.store_input` returned it (or its text)."""
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, str):
        try:
            return uuid.UUID(value.strip())
        except ValueError:
            raise ValueError(f"{name} is not an input id: {value[:100]!r}") from None
    raise TypeError(
        f"{name} must be an input id (a UUID, as outbox.store_input returns), not"
        f" {type(value).__name__}"
    )


def _payload_ref(job: NewJob) -> uuid.UUID | None:
    """The job's stored input, checked: with it the job carries no payload of its
    own, and is not debounced (a repeat would replace what it runs on)."""
    if job.payload_ref is None:
        return None
    ref = input_id_arg(job.payload_ref)
    if job.payload is not None:
        raise ValueError(
            "a job takes a payload or a payload_ref, not both: its handler reads the"
            " stored input as job.payload"
        )
    if job.debounce is not None:
        raise ValueError("a debounced job takes no payload_ref")
    return ref


# Made once: json.dumps with any option makes a new encoder at every call, which a
# batch of 100,000 jobs pays 200,000 times.
_PAYLOAD_JSON = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
_ROW_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def _encode(
    name: str, value: Any, limit: int, limit_name: str, json_default: JsonDefault | None
) -> str:
    if json_default is not None:
        value = plain_json(name, value, json_default)
    check_payload(name, value)
    try:
        encoded = _PAYLOAD_JSON.encode(value)
    except TypeError as exc:
        what = _unencodable(value, name) or str(exc)
        raise TypeError(f"{name} is not JSON-serialisable: {what}") from None
    except ValueError as exc:  # NaN / Infinity, circular references
        raise ValueError(f"{name} is not valid JSON: {exc}") from None
    try:
        size = len(encoded) if encoded.isascii() else len(encoded.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError(f"{name} contains a lone surrogate, which is not valid UTF-8") from None
    if size > limit:
        raise ValueError(f"{name} is {size} bytes as JSON; the limit is {limit} ({limit_name})")
    # jsonb refuses the NUL character; catch it here, with a clear message.
    if "\\u0000" in encoded and _ESCAPED_NUL.search(encoded):
        raise ValueError(f"{name} contains a NUL character (U+0000), which jsonb cannot store")
    return encoded


MAX_TAGS = defaults.MAX_TAGS
MAX_META_BYTES = defaults.MAX_META_BYTES


def check_tags(value: object) -> list[str]:
    """The job's tags, checked: a list, tuple or set of tags (a str alone is refused:
    its letters would become tags), at most MAX_TAGS; a tag given twice is kept
    once, where it came first."""
    if type(value) is tuple and not value:  # the default, most jobs: nothing to check
        return []
    if isinstance(value, str | bytes) or not isinstance(value, Collection):
        raise TypeError(f"tags must be a list of str, not {type(value).__name__}")
    if isinstance(value, Mapping):
        raise TypeError("tags must be a list of str, not a dict (meta= takes key-value pairs)")
    try:
        found = list(dict.fromkeys(names.tag(item) for item in value))
    except (TypeError, ValueError) as exc:
        # named "tags", the argument, first: the surfaces point at what to fix by it
        raise type(exc)(f"tags: {exc}") from None
    if len(found) > MAX_TAGS:
        raise ValueError(f"tags holds {len(found)} tags; a job carries at most {MAX_TAGS}")
    return found


def encode_meta(value: object, json_default: JsonDefault | None = None) -> str | None:
    """The job's meta, a dict with str keys, as compact JSON text of at most
    MAX_META_BYTES, checked as a payload is (values of any JSON kind, nested at most
    MAX_PAYLOAD_DEPTH, ``json_default`` applied first); None for None or an empty
    dict, which store nothing."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(f"meta must be a dict (a JSON object), not {type(value).__name__}")
    if not value:
        return None
    return _encode("meta", dict(value), MAX_META_BYTES, "MAX_META_BYTES", json_default)


def _run_after(value: object, name: str = "run_after") -> tuple[str | None, float | None]:
    if value is None:
        return None, None
    if isinstance(value, datetime):
        if value.tzinfo is None or value.tzinfo.utcoffset(value) is None:
            raise ValueError(f"{name} must be timezone-aware (a naive datetime is ambiguous)")
        return value.isoformat(), None
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
        if not math.isfinite(seconds):
            raise ValueError(f"{name} is not a finite timedelta")
        return None, seconds
    raise TypeError(f"{name} must be a datetime or a timedelta, not {type(value).__name__}")


def start_arg(value: object, name: str = "run_after") -> tuple[str | None, float | None]:
    """An instant (an aware datetime, as ISO text) or a span from the database's now
    (a timedelta, as seconds), checked as enqueue checks ``run_after``."""
    return _run_after(value, name)


def _shown(value: datetime | timedelta) -> str:
    return value.isoformat() if isinstance(value, datetime) else f"{value} from now"


def check_start_before_deadline(run_after: object, expires: object) -> None:
    """ValueError naming both when ``run_after`` is not before ``expires``: no attempt
    starts at or after the deadline, so such a job could only ever be cancelled
    (EXPIRED). Two instants, or two spans from the database's now (the same now for
    both), compare whatever the clock; an instant and a span are compared on this
    process's clock. Both already checked by :func:`_run_after`."""
    if not isinstance(run_after, datetime | timedelta) or not isinstance(
        expires, datetime | timedelta
    ):
        return
    # Seconds from now of each (no datetime arithmetic: a span of a million years is
    # accepted by _run_after and would overflow one). Of two instants, or of two
    # spans, the order does not depend on the clock.
    now = datetime.now(UTC)

    def ahead(value: datetime | timedelta) -> float:
        return (value - now if isinstance(value, datetime) else value).total_seconds()

    if ahead(run_after) >= ahead(expires):
        raise ValueError(
            f"run_after ({_shown(run_after)}) is not before expires ({_shown(expires)}):"
            " no attempt starts at or after the deadline, so the job could never run"
        )


def _debounce(job: NewJob) -> tuple[float | None, float | None]:
    """The debounce and its bound, in seconds (None, None: not debounced)."""
    if job.debounce is None:
        if job.debounce_max is not None:
            raise ValueError("debounce_max needs debounce")
        return None, None
    if job.dedup_key is None:
        raise ValueError("debounce needs a dedup_key: the key names what is debounced")
    if job.run_after is not None:
        raise ValueError("debounce decides the start; run_after cannot be given with it")
    seconds: list[float] = []
    for name, value in (("debounce", job.debounce), ("debounce_max", job.debounce_max)):
        if value is None:
            seconds.append(math.inf)
            continue
        if not isinstance(value, timedelta):
            raise TypeError(f"{name} must be a timedelta, not {type(value).__name__}")
        if not 0 <= value.total_seconds() < 10 * 365 * 86400:
            raise ValueError(f"{name} must be between 0 and ten years")
        seconds.append(value.total_seconds())
    debounce, most = seconds
    if most < debounce:
        raise ValueError("debounce_max must be at least debounce")
    return debounce, None if math.isinf(most) else most


# enqueue's unique= by name; a timedelta is a period.
UNIQUE_SCOPES = ("waiting", "active", "forever")
_UNIQUE_WANTED = "unique must be 'waiting', 'active', 'forever' or a timedelta"
_TEN_YEARS = 10 * 365 * 86400


def unique_fields(job: NewJob) -> tuple[str | None, float | None]:
    """The scope the job's dedup_key is held under (jobs.unique_scope), and a
    period's length in seconds; (None, None) for 'forever', which jobs.dedup_key
    holds as it always has."""
    unique = job.unique
    if isinstance(unique, str) and unique == "forever":
        return None, None
    if isinstance(unique, timedelta):
        if not 1 <= unique.total_seconds() <= _TEN_YEARS:
            raise ValueError("unique as a period must be between one second and ten years")
        scope, seconds = "period", unique.total_seconds()
    elif isinstance(unique, str):
        if unique not in UNIQUE_SCOPES:
            raise ValueError(f"{_UNIQUE_WANTED}, not {unique[:100]!r}")
        scope, seconds = unique, None
    else:
        raise TypeError(f"{_UNIQUE_WANTED}, not {type(unique).__name__}")
    if job.dedup_key is None:
        raise ValueError("unique needs a dedup_key: the key is what is held")
    if job.debounce is not None:
        # A debounced key is held until its job starts already (jobs_debounce_idx).
        raise ValueError("a debounced job takes no unique")
    return scope, seconds


def check_max_attempts(value: object) -> int:
    """A job's attempt budget, as enqueue and an edit take it."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"max_attempts must be an int, not {type(value).__name__}")
    if not 1 <= value <= MAX_ATTEMPTS_LIMIT:
        raise ValueError(f"max_attempts must be between 1 and {MAX_ATTEMPTS_LIMIT}")
    return value


def check_priority(value: object) -> int:
    """A job's priority, as enqueue and an edit take it: it fits a smallint."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"priority must be an int, not {type(value).__name__}")
    if value not in PRIORITY_RANGE:
        raise ValueError("priority must fit in a smallint (-32768..32767)")
    return value


MAX_WEIGHT = defaults.MAX_WEIGHT


def check_weight(value: object) -> int | None:
    """A job's weight, as enqueue takes it: an int from 1 to MAX_WEIGHT, stored as
    NULL for one (a plain job's row, which no weighed statement reads)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"weight must be an int, not {type(value).__name__}")
    if not 1 <= value <= MAX_WEIGHT:
        raise ValueError(f"weight must be between 1 and {MAX_WEIGHT}")
    return None if value == 1 else value


def to_row(
    job: NewJob,
    limit: int,
    trace_context: dict[str, str] | None = None,
    parents: list[dict[str, Any]] | None = None,
    job_id: uuid.UUID | None = None,
) -> tuple[uuid.UUID, str]:
    """A new id for the job (``job_id``, when the caller made it with
    :func:`new_job_ids`), and the validated job as a JSON object for
    ``JOB_INSERT_MANY`` (payload embedded; ``trace_context``, from
    ``plumbing.tracing.capture``, stored with it; ``parents``: its edges,
    ``{"parent_id", "position", "done"}`` each, from enqueue's look at them)."""
    job_id, fields = job_fields(job, limit, trace_context, parents, job_id)
    payload = fields.pop("payload")
    meta = fields.pop("meta")
    fields["job_id"] = str(job_id)
    # A field left out is NULL to jsonb_to_recordset: a plain job's object holds a
    # handful of fields, not two dozen nulls to encode here and parse there.
    head = _ROW_JSON.encode({name: value for name, value in fields.items() if value is not None})
    # Splice the already-encoded payload (and meta) in rather than encoding them again.
    if meta is not None:
        head = f'{head[:-1]},"meta":{meta}}}'
    return job_id, f'{head[:-1]},"payload":{payload}}}'


def job_fields(
    job: NewJob,
    limit: int,
    trace_context: dict[str, str] | None = None,
    parents: list[dict[str, Any]] | None = None,
    job_id: uuid.UUID | None = None,
) -> tuple[uuid.UUID, dict[str, Any]]:
    """The job checked, as :func:`to_row` takes it, and what it stores by field,
    None where nothing: ``job_id`` a UUID, ``payload`` and ``meta`` as JSON text,
    ``run_after`` and ``expires_at`` an instant's ISO text, or ``delay_seconds`` and
    ``expires_seconds`` a span from the database's now."""
    job_type = names.job_type(job.job_type)
    queue = names.queue(job.queue)
    dedup_key = None if job.dedup_key is None else names.dedup_key(job.dedup_key)
    tenant = None if job.tenant is None else names.tenant(job.tenant)
    if job.max_attempts is not None:
        check_max_attempts(job.max_attempts)
    check_priority(job.priority)
    run_after, delay_seconds = _run_after(job.run_after)
    if not isinstance(job.needs_approval, bool):
        raise TypeError(f"needs_approval must be a bool, not {type(job.needs_approval).__name__}")
    if job.needs_approval and job.run_after is not None:
        # Approval makes it due now; a run_after would be silently dropped.
        raise ValueError("needs_approval takes no run_after: the job is due when approved")
    if job.needs_approval and job.debounce is not None:
        # A debounced enqueue replaces a waiting job's payload: it would skip the approval
        # given to the one before.
        raise ValueError("needs_approval takes no debounce")
    if job.key is not None and job.debounce is not None:
        # The debounced insert keeps no key: the job would run outside its key's order.
        raise ValueError("a debounced job takes no key")

    expires_at, expires_seconds = _run_after(job.expires, "expires")
    if job.run_after is not None and job.expires is not None:
        check_start_before_deadline(job.run_after, job.expires)
    rate_limit = None if job.rate_limit is None else names.rate_limit(job.rate_limit)
    debounce_seconds, debounce_max_seconds = _debounce(job)
    unique_scope, unique_seconds = unique_fields(job)
    key, key_limit, key_order = key_fields(job.key, job.key_limit, job.ordered)
    resource = None if job.resource is None else names.resource(job.resource)
    if resource is not None and key is not None:
        # The claim could take one and then be refused the other, with no way to give
        # the first back in the statement that took it.
        raise ValueError("a job takes a key or a resource, not both")
    if resource is not None and job.debounce is not None:
        # The debounced insert keeps no resource: the job would run beside its holder.
        raise ValueError("a debounced job takes no resource")
    weight = check_weight(job.weight)
    tags = check_tags(job.tags)
    meta = encode_meta(job.meta, job.json_default)
    payload_ref = _payload_ref(job)
    payload = encode_payload(job.payload, limit, job.json_default)
    if job_id is None:
        job_id = new_job_id()
    fields: dict[str, Any] = {
        "job_id": job_id,
        "job_type": job_type,
        "queue": queue,
        "tenant": tenant,
        "dedup_key": dedup_key,
        "max_attempts": job.max_attempts,
        "priority": job.priority,
        "run_after": run_after,
        "delay_seconds": delay_seconds,
        "expires_at": expires_at,
        "expires_seconds": expires_seconds,
        "rate_limit": rate_limit,
        "debounce_seconds": debounce_seconds,
        "debounce_max_seconds": debounce_max_seconds,
        "key": key,
        "key_limit": key_limit,
        "key_order": key_order,
        "resource": resource,
        "weight": weight,
    }
    if job.needs_approval:
        fields["approval"] = "REQUIRED"
    if parents:
        fields["parents"] = parents
        fields["parents_pending"] = sum(not p["done"] for p in parents)
        fields["on_parent_failure"] = job.on_parent_failure
    if trace_context is not None:
        fields["trace_context"] = trace_context
    if tags:
        fields["tags"] = tags
    if payload_ref is not None:
        fields["payload_ref"] = str(payload_ref)
    if unique_scope is not None:
        # held under its scope by jobs_unique_idx, not for ever by jobs_dedup_idx
        fields["unique_key"] = fields.pop("dedup_key")
        fields["unique_scope"] = unique_scope
        fields["unique_seconds"] = unique_seconds
    fields["payload"] = payload
    fields["meta"] = meta
    return job_id, fields
