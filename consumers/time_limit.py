"""An attempt's time limit, told apart from a ``TimeoutError`` of the handler's own."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any


class TimedOut(TimeoutError):
    """The attempt ran past its time limit (not a TimeoutError of the handler's own;
    a run hook sees a TimeoutError)."""


async def bounded(work: Awaitable[Any], seconds: float | None) -> Any:
    """``await work``, raising :class:`TimedOut` once ``seconds`` (None: no limit)
    have passed."""
    try:
        async with asyncio.timeout(seconds) as limit:
            return await work
    except TimeoutError:
        if limit.expired():
            raise TimedOut from None
        raise
