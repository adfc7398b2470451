"""`jobctl doctor`'s levels and exit status, on findings alone (no services)."""

from __future__ import annotations

import pytest

from hybrid_jobs.jobctl.doctor.findings import Finding, Level, counts, exit_code, failing, verdict


def found(*levels: Level) -> list[Finding]:
    return [Finding("test", level, f"finding {i}") for i, level in enumerate(levels)]


@pytest.mark.parametrize(
    ("levels", "plain", "strict"),
    [
        ((), 0, 0),
        ((Level.OK, Level.OK), 0, 0),
        ((Level.OK, Level.NOTE), 0, 0),
        ((Level.OK, Level.WARNING, Level.NOTE), 0, 1),
        ((Level.WARNING, Level.PROBLEM), 1, 1),
        ((Level.PROBLEM,), 1, 1),
    ],
)
def test_a_problem_fails_a_warning_only_with_strict_and_a_note_never(
    levels: tuple[Level, ...], plain: int, strict: int
) -> None:
    assert exit_code(found(*levels)) == plain
    assert exit_code(found(*levels), strict=True) == strict


def test_the_failing_findings_are_the_ones_at_or_above_the_bar() -> None:
    findings = found(Level.OK, Level.NOTE, Level.WARNING, Level.PROBLEM)
    assert [f.level for f in failing(findings)] == [Level.PROBLEM]
    assert [f.level for f in failing(findings, strict=True)] == [Level.WARNING, Level.PROBLEM]


def test_counts_name_every_level() -> None:
    assert counts(found(Level.PROBLEM, Level.PROBLEM, Level.OK)) == {
        "ok": 1,
        "note": 0,
        "warning": 0,
        "problem": 2,
    }


def test_the_verdict_says_the_counts_and_the_exit_status() -> None:
    findings = found(Level.WARNING, Level.OK, Level.OK)
    assert verdict(findings) == "0 problems, 1 warning, 0 notes, 2 ok: exit 0"
    assert verdict(findings, strict=True) == (
        "0 problems, 1 warning, 0 notes, 2 ok: exit 1 (--strict: warnings fail)"
    )
    assert verdict(found(Level.PROBLEM)).endswith(": exit 1")


def test_a_finding_as_json_has_its_level_as_a_word() -> None:
    finding = Finding("schema", Level.PROBLEM, "index x is missing", "why", "what to do")
    assert finding.as_dict() == {
        "check": "schema",
        "level": "problem",
        "title": "index x is missing",
        "detail": "why",
        "fix": "what to do",
    }
