"""docs/design/queries.sql and the table of docs/design/state-machine.md are what the code
generates now (``python -m hybrid_jobs.schema.docs`` writes them), and say what they claim to.
No services."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hybrid_jobs.schema import docs
from hybrid_jobs.schema import queries as q
from hybrid_jobs.schema.queries import lease

REGENERATE = f"stale: run `{docs.COMMAND}` and commit what it writes"


@pytest.fixture
def fresh_caches() -> Iterator[None]:
    docs.statements.cache_clear()
    yield
    docs.statements.cache_clear()


def test_the_generated_files_are_current() -> None:
    stale = [str(path.relative_to(docs.ROOT)) for path in docs.stale()]
    assert stale == [], f"{', '.join(stale)} {REGENERATE}"


def test_the_check_command_passes() -> None:
    assert docs.main(["--check"]) == 0, REGENERATE


def test_a_changed_statement_makes_queries_sql_stale(
    monkeypatch: pytest.MonkeyPatch, fresh_caches: None
) -> None:
    monkeypatch.setattr(lease, "JOB_HEARTBEAT_MANY", lease.JOB_HEARTBEAT_MANY + " -- changed")
    docs.statements.cache_clear()
    assert docs.stale() == [docs.SQL_FILE]
    assert docs.main(["--check"]) == 1


def test_queries_sql_holds_every_statement_whole_under_its_name() -> None:
    sql = docs.SQL_FILE.read_text()
    for s in docs.statements():
        header = f"-- name: {s.name}\n"
        assert sql.count(header) == 1, s.name
        body = sql.split(header, 1)[1]
        assert s.text.strip("\n") + ";" in body, f"{s.name} is not there as it runs"
        assert "-- Run by " in body.split(s.text.strip("\n"), 1)[0], f"{s.name}: who runs it?"


def test_every_statement_says_what_it_is_for() -> None:
    assert docs.note_problems() == []


def test_every_statement_is_exported_and_known_by_its_text() -> None:
    found = docs.statements()
    for s in found:
        assert getattr(q, s.name, None) == s.text, f"{s.name}: not in schema/queries/__init__.py"
    texts = [s.text for s in found]
    assert len(texts) == len(set(texts)), "two statements with one text"


def test_every_waiting_reason_is_in_the_state_machine_document() -> None:
    assert docs.wait_problems() == []
    text = docs.STATE_DOC.read_text()
    waits = text.split(docs.WAITS_BEGIN, 1)[1].split(docs.WAITS_END, 1)[0]
    for code in (
        "APPROVAL_REQUIRED",
        "DEPENDENCY",
        "RESOURCE_BUSY",
        "RESOURCE_UNCERTAIN",
        "NO_AUTHORIZED_RUNNER",
    ):
        assert f"| `{code}` |" in waits, code
