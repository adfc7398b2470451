"""`python -m bench.write_cost` end to end at a small size: every copy of jobs is
written at both sizes, and every CHECK of jobs is timed on its own. No timing is
asserted: benchmarks print figures, tests never judge them."""

from __future__ import annotations

from tests.support.bench import bench_json


def test_every_copy_and_every_check_is_timed() -> None:
    data = bench_json("write_cost", "--jobs", "300", "--batch", "5", "--repeat", "25", timeout=180)
    assert list(data["claim_write"]) == [
        "jobs_with_its_triggers",
        "as_migrated",
        "checks_only",
        "indexes_only",
        "primary_key_only",
    ]
    for figures in data["claim_write"].values():
        assert figures["one_row_ms"] > 0 and figures["5_rows_ms"] > 0, figures
    assert data["claim_write"]["primary_key_only"]["added_per_statement_us"] == 0
    assert len(data["by_check"]) == data["jobs_checks"] > 20
    assert data["jobs_indexes"] > 20
