"""Keys (enqueue's key=): the busy ones and the jobs holding them, and the keys a
failed strict head holds."""

from __future__ import annotations

from typing import Any, Final

from sqlalchemy.ext.asyncio import AsyncSession

from hybrid_jobs.jobctl.service import queries
from hybrid_jobs.jobctl.service.models import BusyKey, HeldKey, KeyHolder, Keys
from hybrid_jobs.jobctl.service.sql import fetch_all, fetch_one
from hybrid_jobs.schema.states import JobState

# Per key: the holders listed (a key_limit may be in the thousands) and how far the
# waiting jobs are counted (a hot key may have a long queue behind it).
HOLDERS_SHOWN: Final = 10
WAITING_CAP: Final = 10_000
DEFAULT_KEYS: Final = 100


async def list_keys(session: AsyncSession, *, limit: int = DEFAULT_KEYS) -> Keys:
    """The busy keys in key order (at most ``limit``), each with the jobs holding
    it and how many wait for it; how many keys are busy in all; and the keys held
    behind a FAILED ``ordered="strict"`` job. Costs what runs and what waits for a
    key, never the keys' history. Reads only."""
    params = {"limit": limit, "holders": HOLDERS_SHOWN, "waiting_cap": WAITING_CAP}
    busy: dict[str, dict[str, Any]] = {}
    for row in await fetch_all(session, queries.KEYS_BUSY, params):
        key, running, key_limit, waiting, job_id, job_type, queue, state, *rest = row
        found = busy.setdefault(
            key, {"running": running, "key_limit": key_limit, "waiting": waiting, "holders": []}
        )
        if job_id is not None:  # the lease ended since key_usage was read
            found["holders"].append(KeyHolder(job_id, job_type, queue, JobState(state), *rest))
    total = await fetch_one(session, queries.KEYS_BUSY_COUNT)
    held = await fetch_all(session, queries.KEYS_HELD_STRICT, params)
    return Keys(
        busy=tuple(
            BusyKey(key, f["running"], f["key_limit"], f["waiting"], tuple(f["holders"]))
            for key, f in busy.items()
        ),
        busy_total=0 if total is None else int(total[0]),
        held=tuple(HeldKey(*row) for row in held),
        holders_shown=HOLDERS_SHOWN,
        waiting_cap=WAITING_CAP,
    )
