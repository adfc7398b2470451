"""Strict job types: refuse at enqueue a job type no handler of this process knows.

A job whose type no consumer knows waits (NO_HANDLER) until a consumer that knows
it starts, so a typo in a producer makes a job that waits for ever. In a process
that imports its handlers (a monolith, a worker that enqueues follow-up jobs),
strict mode turns that typo into a ``ValueError`` at the enqueue, naming the
nearest known types. It is off by default: a producer commonly enqueues jobs whose
handlers live in another code base.

The outbox cannot import the consumers' registry (it is the layer below), so the
registry is handed in: ``outbox.require_known_job_types(consumers.default_registry)``,
or ``$STRICT_JOB_TYPES=1``, which means the registry ``@consumers.handler`` adds to
(it announces itself here when ``hybrid_jobs.consumers`` is imported).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Protocol

from hybrid_jobs import defaults

STRICT_JOB_TYPES_ENV: Final = "STRICT_JOB_TYPES"
_ON = {"1", "true", "yes", "on"}
_OFF = {"", "0", "false", "no", "off"}


class KnownJobTypes(Protocol):
    """What strict mode asks: a ``consumers.Registry`` is one."""

    def job_types(self) -> Iterable[str]: ...


@dataclass
class _Strict:
    # Set by require_known_job_types; None: as $STRICT_JOB_TYPES says.
    chosen: KnownJobTypes | None = None
    # The registry @consumers.handler adds to, once hybrid_jobs.consumers is imported.
    handlers: KnownJobTypes | None = None


_state = _Strict()


def require_known_job_types(registry: KnownJobTypes | None) -> None:
    """Refuse, from now on in this process, to enqueue a job type ``registry`` has
    no handler for (``ValueError`` naming the type and the nearest known ones,
    before anything is written). The registry is asked at each enqueue, so handlers
    registered later count. ``None`` goes back to what ``$STRICT_JOB_TYPES`` says
    (off unless it is set).

    ::

        from hybrid_jobs import consumers, outbox
        import myapp.handlers  # registers them

        outbox.require_known_job_types(consumers.default_registry)
    """
    if registry is not None and not callable(getattr(registry, "job_types", None)):
        raise TypeError("require_known_job_types takes a registry (with job_types()) or None")
    _state.chosen = registry


def use_handlers_registry(registry: KnownJobTypes) -> None:
    """The registry ``$STRICT_JOB_TYPES`` checks against (consumers' default one)."""
    _state.handlers = registry


def _strict_from_environment() -> bool:
    raw = os.environ.get(STRICT_JOB_TYPES_ENV)
    if raw is None:
        return defaults.STRICT_JOB_TYPES
    value = raw.strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise ValueError(f"{STRICT_JOB_TYPES_ENV} must be 1 or 0 (true/false), not {raw!r}")


def refuse_unknown(job_types: Iterable[object]) -> None:
    """In strict mode, ``ValueError`` for the first job type no handler knows.
    A type that is not text is left to enqueue's own check, which names it."""
    registry = _state.chosen
    if registry is None:
        if not _strict_from_environment():
            return
        registry = _state.handlers
    known = set(registry.job_types()) if registry is not None else set()
    for job_type in job_types:
        if isinstance(job_type, str) and job_type not in known:
            raise ValueError(_unknown(job_type, known))


def _unknown(job_type: str, known: set[str]) -> str:
    text = f"job type {job_type!r} has no handler in this process (strict job types)"
    if not known:
        return f"{text}, which registers none: import the modules of your handlers first"
    close = difflib.get_close_matches(job_type, sorted(known), n=3)
    if close:
        return f"{text}; did you mean {' or '.join(map(repr, close))}?"
    shown = sorted(known)
    more = f" and {len(shown) - 10} more" if len(shown) > 10 else ""
    return f"{text}; known: {', '.join(shown[:10])}{more}"
