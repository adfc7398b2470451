"""The chaos soak: a short form (2,500 jobs, 40 s of faults) and the long one (20,000
jobs, 120 s of faults, also `scripts/chaos`), both run by `./scripts/test-soak`. The
default suite leaves them out: it checks each fault on its own (test_faults.py,
test_stop.py, test_supervisor.py) and the gates' composition under races
(test_gates_model.py), in a fraction of the time."""

from __future__ import annotations

import json

import pytest

from hybrid_jobs.jobctl.check import violations
from tests.chaos.run import run


def _assert_clean(report: dict) -> None:
    shown = json.dumps(report, indent=2, default=str)
    assert report["settled"], f"jobs still open after the settle time:\n{shown}"
    assert violations(report) == {}, shown
    assert report["lost"] == 0
    assert report["stale_writes_accepted"] == 0
    assert report["effects_applied_more_than_once"] == 0
    assert report["not_succeeded"] == 0, "the budget lets every job end as planned; all must"
    assert report["slots_leaked_or_released_twice"] == 0
    assert report["cap_exceeded"] == 0 and report["cap_samples"] > 100
    assert report["key_limit_exceeded"] == 0
    assert report["key_leases_leaked_or_released_twice"] == 0
    # each rate-limited bucket's starts stayed within burst + rate x t in every window
    assert report["rate_limit_exceeded"] == 0 and report["rate_limited_starts"] > 100
    # the graphs: no child started before all its parents succeeded, the children of
    # a failed parent ended CANCELLED PARENT_FAILED, each edge counted once
    assert report["children_started_before_parents"] == 0
    assert report["children_of_failed_parents_not_cancelled"] == 0
    assert report["dependency_counts_off"] == 0
    assert report["children_succeeded"] > 20 and report["cancelled_for_a_parent"] > 0


@pytest.mark.soak
@pytest.mark.timeout(400)
def test_short_chaos_soak_keeps_every_promise() -> None:
    report = run(jobs=2500, seconds=40, seed=20261129)
    _assert_clean(report)
    assert sum(report["chaos"].values()) >= 10, "faults were actually inflicted"


@pytest.mark.soak
@pytest.mark.timeout(1800)
def test_long_chaos_soak_keeps_every_promise() -> None:
    report = run(jobs=20_000, seconds=120, seed=7)
    _assert_clean(report)
    assert report["fence_rejections_seen"], "stale workers came back and were turned away"
