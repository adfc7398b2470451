"""What a notification on the outbox channel sends the relay to look at: the queues
it names, every queue (a scan for those with wake-ups due), or, for a tenant's freed
slot, the queues whose last pass held wake-ups back."""

from __future__ import annotations

import asyncio
import time

import pytest

from hybrid_jobs.plumbing.config import AmqpUrl, DatabaseUrl
from hybrid_jobs.relay.service import Relay, nudged
from hybrid_jobs.relay.settings import RelaySettings
from hybrid_jobs.schema import names
from hybrid_jobs.schema.tables import TENANT_SLOTS_FREED


def test_a_commit_names_its_queues_or_none() -> None:
    assert nudged("billing,mail", set()) == {"billing", "mail"}
    assert nudged("", {"billing"}) is None, "too many queues to name: look everywhere"


def test_a_freed_tenant_slot_sends_the_relay_to_the_queues_it_held_back_not_to_a_scan() -> None:
    """Under tenant caps every end of a lease frees a slot. Read as "any queue", each
    made the relay scan for due queues: 719 scans of 4.6 ms in a drain of 20,000 jobs
    over 10,000 capped tenants, against 12 without tenants."""
    assert nudged(TENANT_SLOTS_FREED, {"billing", "mail"}) == {"billing", "mail"}


def test_a_freed_slot_no_relay_held_back_costs_one_scan_a_quarter_poll_interval() -> None:
    """At low load nothing is held back, and every end of a capped tenant's lease
    frees a slot: read as "scan", each made the relay scan for due queues and pass
    over them, a second pass for every job (6,000 scans for 6,000 jobs in `python -m
    bench.full_feature --seconds 30`). Such a slot now costs a scan at most every
    quarter poll interval: another relay that held a queue back may be gone, or a
    wake-up may have come due without a notification."""
    assert nudged(TENANT_SLOTS_FREED, set()) == set()
    relay = Relay(
        RelaySettings(
            database=DatabaseUrl.parse("postgresql://127.0.0.1/none"),
            amqp=AmqpUrl.parse("amqp://127.0.0.1/"),
        )
    )
    idle = asyncio.Event()
    relay.idle.append(idle)
    # a scan just now: the slot costs nothing
    relay.look_everywhere, relay.scanned_at = False, time.monotonic()
    relay.nudge(TENANT_SLOTS_FREED)
    assert not idle.is_set() and not relay.more and not relay.look_everywhere
    # none for a quarter of the poll interval: this slot costs one
    relay.scanned_at = time.monotonic() - relay.settings.poll_interval / 4
    relay.nudge(TENANT_SLOTS_FREED)
    assert idle.is_set() and relay.look_everywhere
    # a queue held back: straight to it, no scan
    idle.clear()
    relay.idle.append(idle)
    relay.look_everywhere, relay.scanned_at = False, time.monotonic()
    relay.backlogged.add("billing")
    relay.nudge(TENANT_SLOTS_FREED)
    assert idle.is_set() and relay.hinted == {"billing"} and not relay.look_everywhere


def test_the_marker_can_name_no_queue() -> None:
    with pytest.raises(ValueError):
        names.queue(TENANT_SLOTS_FREED)
