"""A consumer's slots with weighed jobs, without a database: the ledger counts each
running job for its weight, and the claimer keeps the slots that free up for a
weighed job that did not fit them, claiming nothing lighter meanwhile."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, cast

from hybrid_jobs.consumers.claimer import Claimer, _Waiting
from hybrid_jobs.consumers.job import Job
from hybrid_jobs.consumers.ledger import Ledger, Phase


def _job(weight: int) -> Job:
    return Job(
        id=uuid.uuid4(),
        job_type="t",
        queue="default",
        tenant=None,
        payload=None,
        attempt=1,
        max_attempts=3,
        generation=1,
        created_at=datetime.now(UTC),
        worker="w1",
        weight=weight,
    )


def _claimer(ledger: Ledger, concurrency: int) -> Claimer:
    settings = SimpleNamespace(concurrency=concurrency, claim_batch=25)
    none = cast(Any, None)
    return Claimer(cast(Any, settings), none, none, ledger, none, none, none, none)


def test_the_ledger_counts_a_running_job_for_its_weight() -> None:
    ledger = Ledger()
    heavy, light = _job(3), _job(1)
    ledger.start(heavy, cast(Any, None), None)
    ledger.start(light, cast(Any, None), None)
    assert ledger.running == 4
    # a job whose handler returned no longer takes its slots, outcome pending or not
    ledger.held[heavy.id].phase = Phase.OUTCOME_PENDING
    assert ledger.running == 1


def test_slots_that_free_up_go_to_the_weighed_job_waiting_for_them_first() -> None:
    async def scenario() -> None:
        ledger = Ledger()
        running = [_job(1) for _ in range(3)]
        for job in running:
            ledger.start(job, cast(Any, None), None)
        claimer = _claimer(ledger, concurrency=4)
        heavy, light = uuid.uuid4(), uuid.uuid4()
        claimer.waiting[heavy] = _Waiting()
        claimer.waiting[light] = _Waiting()
        # the heavy one came back without room (one slot free, it weighs three)
        claimer._wait_for_room(heavy, claimer._free())
        # the light one waits too, but is not claimed into the slot the heavy one needs
        assert claimer._ready(claimer._free()) == []
        # one more slot frees: the heavy one is tried again, alone
        ledger.forget(running[0])
        assert claimer._ready(claimer._free()) == [heavy]
        # once it is claimed (gone from the waiting), the light one goes on
        del claimer.waiting[heavy]
        assert claimer._ready(claimer._free()) == [light]

    asyncio.run(scenario())


def test_slots_freed_before_the_refusal_is_noted_count_as_freed() -> None:
    # Regression: the claim found 4 slots free and took two jobs of weight 2; a third
    # had no room. The two ended while the claimer started them (starting awaits),
    # so 4 slots are free when the refusal is noted. The room noted is the claim's
    # (none left), so the job is tried again now, not after its retry.
    async def scenario() -> None:
        ledger = Ledger()
        claimer = _claimer(ledger, concurrency=4)
        heavy = uuid.uuid4()
        claimer.waiting[heavy] = _Waiting()
        claimer._wait_for_room(heavy, 0)
        assert claimer._free() == 4
        assert claimer._ready(claimer._free()) == [heavy]

    asyncio.run(scenario())


def test_a_weighed_job_without_room_is_tried_again_at_the_latest_after_a_while() -> None:
    async def scenario() -> None:
        ledger = Ledger()
        claimer = _claimer(ledger, concurrency=4)
        heavy = uuid.uuid4()
        claimer.waiting[heavy] = _Waiting()
        claimer._wait_for_room(heavy, claimer._free())
        assert claimer._ready(claimer._free()) == []
        claimer.waiting[heavy].retry_at = time.monotonic() - 0.01
        assert claimer._ready(claimer._free()) == [heavy]

    asyncio.run(scenario())


def test_a_lighter_id_due_now_does_not_spin_the_loop_while_a_weighed_one_waits() -> None:
    async def scenario() -> None:
        ledger = Ledger()
        ledger.start(_job(3), cast(Any, None), None)
        claimer = _claimer(ledger, concurrency=4)
        heavy, light = uuid.uuid4(), uuid.uuid4()
        claimer.waiting[heavy] = _Waiting()
        claimer.waiting[light] = _Waiting()  # due at once
        claimer._wait_for_room(heavy, claimer._free())
        # the loop sleeps until the weighed one's retry (or a slot frees), not 0 s
        wait = claimer._next_retry()
        assert wait is not None and wait > 0.5

    asyncio.run(scenario())
