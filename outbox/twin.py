"""Each ``f_async`` of the producer API is ``f`` run on an ``AsyncSession``.

SQLAlchemy runs every ``AsyncSession`` call as its sync code in a greenlet that
hands each round trip to the event loop; ``AsyncSession.run_sync`` does the same
for a whole function. So the sync function is the only body: its async twin cannot
drift from it, and costs no more (``python -m bench.enqueue_async``: the same
client CPU per job or less; the call starts one greenlet where an awaited body
starts one for each session and connection call it awaits).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession
    from sqlalchemy.orm import Session

P = ParamSpec("P")
R = TypeVar("R")


def async_twin(
    sync: Callable[Concatenate[Session, P], R],
) -> Callable[Concatenate[AsyncSession, P], Coroutine[Any, Any, R]]:
    """``sync(session, ...)`` as ``await sync_async(async_session, ...)``: the same
    parameters (the session an ``AsyncSession``), result, exceptions and statements,
    through the async session's transaction (never committing, like ``sync``)."""

    async def twin(session: AsyncSession, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return await session.run_sync(sync, *args, **kwargs)

    name = f"{sync.__name__}_async"
    twin.__name__ = name
    twin.__qualname__ = sync.__qualname__.removesuffix(sync.__name__) + name
    twin.__module__ = sync.__module__
    twin.__doc__ = f":func:`{sync.__name__}` for an ``AsyncSession``.\n\n{inspect.getdoc(sync)}"
    # help(), inspect and the docs show the sync parameters, not *args/**kwargs.
    signature = inspect.signature(sync)
    first, *rest = signature.parameters.values()
    twin.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[first.replace(annotation="AsyncSession", kind=first.POSITIONAL_ONLY), *rest]
    )
    return twin
