"""Enqueue a job from its handler's own object.

``@consumers.handler`` returns a :class:`HandlerFunction`: the decorated function,
still callable as before, that also enqueues jobs of its type on its queue::

    send_receipt.enqueue(session, order_id=42)
    await send_receipt.enqueue_async(async_session, order_id=42)
    send_receipt.with_options(priority=5, dedup_key="receipt:42").enqueue(session, order_id=42)

A handler that declares its payload (keyword-only parameters after ``job``) has the
fields checked here, before anything is written. Enqueue's own options go through
``with_options``, never beside the fields: a payload may then have a field named
``priority``, ``key`` or ``queue`` without it being taken for the option (the way
Procrastinate's ``configure(...).defer(...)`` keeps them apart).
"""

from __future__ import annotations

import difflib
import functools
import inspect
import json
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, Generic, ParamSpec, TypeVar

from hybrid_jobs.consumers.payload import PayloadSpec
from hybrid_jobs.outbox.enqueue import enqueue, enqueue_async
from hybrid_jobs.outbox.validation import NewJob

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession
    from sqlalchemy.orm import Session

P = ParamSpec("P")
R = TypeVar("R")


class _Nothing:
    def __repr__(self) -> str:
        return "<no payload>"


_NOTHING: Final = _Nothing()


@functools.cache
def _options() -> tuple[str, ...]:
    """What ``with_options`` may set: enqueue's keyword arguments, read from its
    signature, so an option enqueue gains is one here without a change."""
    parameters = inspect.signature(enqueue).parameters.values()
    return tuple(p.name for p in parameters if p.kind is p.KEYWORD_ONLY)


def _check_options(options: Mapping[str, Any]) -> None:
    for name in options:
        if name not in _options():
            close = difflib.get_close_matches(name, _options(), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise TypeError(f"enqueue has no option {name!r}{hint}")


class Enqueuer:
    """Enqueues jobs of one handler's type with some of enqueue's options fixed:
    what :meth:`HandlerFunction.with_options` returns."""

    __slots__ = ("_job_type", "_options", "_payload")

    def __init__(
        self, job_type: str, payload: PayloadSpec | None, options: Mapping[str, Any]
    ) -> None:
        self._job_type = job_type
        self._payload = payload
        self._options = dict(options)

    @property
    def options(self) -> dict[str, Any]:
        """Enqueue's keyword arguments each job gets (``queue`` the handler's, unless
        set here)."""
        return dict(self._options)

    def with_options(self, **options: Any) -> Enqueuer:
        """These options, over the ones set already: any keyword argument of
        :func:`outbox.enqueue` (``dedup_key``, ``run_after``, ``priority``,
        ``tenant``, ``key``, ``queue``, ...). An unknown one is a ``TypeError``."""
        _check_options(options)
        return Enqueuer(self._job_type, self._payload, {**self._options, **options})

    def new_job(self, payload: Any = _NOTHING, /, **fields: Any) -> NewJob:
        """The job as an :class:`outbox.NewJob`, checked, for ``enqueue_many``."""
        return NewJob(self._job_type, self._checked(payload, fields), **self._options)

    def enqueue(self, session: Session, payload: Any = _NOTHING, /, **fields: Any) -> uuid.UUID:
        """:func:`outbox.enqueue` of this handler's job type; the payload is its
        fields as keyword arguments (checked against the handler's parameters), or,
        for a handler that takes only the job, one positional value."""
        return enqueue(session, self._job_type, self._checked(payload, fields), **self._options)

    async def enqueue_async(
        self, session: AsyncSession, payload: Any = _NOTHING, /, **fields: Any
    ) -> uuid.UUID:
        """:meth:`enqueue` for an ``AsyncSession``."""
        checked = self._checked(payload, fields)
        return await enqueue_async(session, self._job_type, checked, **self._options)

    def _checked(self, payload: Any, fields: dict[str, Any]) -> Any:
        spec = self._payload
        if self._options.get("payload_ref") is not None:
            # The job runs on a stored input (with_options(payload_ref=...)): its
            # content is checked against the handler's fields when the job runs
            # (BAD_PAYLOAD), as the producer need not hold it.
            if payload is not _NOTHING or fields:
                raise TypeError(
                    f"{self._job_type}: a job on a stored input (payload_ref) takes no"
                    " payload of its own"
                )
            return None
        if spec is None:
            if fields:
                raise TypeError(
                    f"{self._job_type}: its handler takes only the job, so the payload is"
                    f" one positional value, not fields ({', '.join(fields)}); enqueue's"
                    " options go through with_options(...)"
                )
            if payload is _NOTHING:
                raise TypeError(f"{self._job_type}: enqueue needs the payload")
            return payload
        if payload is not _NOTHING:
            if fields:
                raise TypeError(
                    f"{self._job_type}: give the payload's fields as keywords or as one"
                    " dict, not both"
                )
            fields = payload
        default = self._options.get("json_default")
        # With a json_default the handler gets what it makes of a value (a date's
        # text): check that, and store what was given (enqueue applies it again).
        seen = fields if default is None else json.loads(json.dumps(fields, default=default))
        spec.check(seen)
        return fields


class HandlerFunction(Enqueuer, Generic[P, R]):
    """A registered handler: the function, callable as before (``fn(job)``, or
    ``fn(job, **fields)`` for one that declares its payload), which enqueues jobs
    of its type on its queue (:meth:`enqueue`, :meth:`enqueue_async`,
    :meth:`with_options`, :meth:`new_job`)."""

    __wrapped__: Callable[P, R]

    def __init__(self, fn: Callable[P, R], job_type: str, queue: str) -> None:
        super().__init__(job_type, PayloadSpec.of(job_type, fn), {"queue": queue})
        functools.update_wrapper(self, fn)
        # inspect.iscoroutinefunction takes an object with a function's code and
        # defaults for a function (on 3.11, which has no markcoroutinefunction): the
        # wrapper of an async def is one too.
        for name in ("__code__", "__defaults__", "__kwdefaults__"):
            if hasattr(fn, name):
                setattr(self, name, getattr(fn, name))

    @property
    def job_type(self) -> str:
        return self._job_type

    @property
    def payload(self) -> PayloadSpec | None:
        """The fields its handler declares; None when it takes only the job."""
        return self._payload

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.__wrapped__(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<handler {self._job_type!r} {self.__wrapped__!r}>"
