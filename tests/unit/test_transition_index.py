"""The index of schema/states.py against the code: every statement it names exists,
every caller it names imports and runs that statement, nothing else runs it, and
the machine it describes is the one docs/design/state-machine.md draws. No services."""

from __future__ import annotations

import importlib
import re

from hybrid_jobs.schema import docs
from hybrid_jobs.schema import queries as q
from hybrid_jobs.schema.states import (
    OPERATIONS,
    OPERATOR_ONLY,
    TERMINAL,
    TRANSITIONS,
    Edge,
    JobState,
    Operation,
    edges_of,
)


def test_every_statement_of_the_index_is_a_statement_of_schema_queries() -> None:
    known = {s.name for s in docs.statements()}
    for op in OPERATIONS:
        assert isinstance(getattr(q, op.statement, None), str), op.statement
        assert op.statement in known, op.statement
    names = [op.statement for op in OPERATIONS]
    assert len(names) == len(set(names)), "one operation per statement"


def test_every_caller_imports() -> None:
    for op in OPERATIONS:
        for caller in op.callers:
            module, _, qualname = caller.partition(":")
            target: object = importlib.import_module(module)
            for part in qualname.split("."):
                target = getattr(target, part)
            assert callable(target), caller


def test_every_caller_runs_its_statement_and_no_other_code_does() -> None:
    assert docs.index_problems() == []


def test_the_index_check_catches_a_wrong_caller_a_missing_one_and_a_wrong_name() -> None:
    moves: dict[Edge, str] = {(JobState.QUEUED, JobState.RUNNING): "claim"}
    wrong = [
        Operation("JOB_CLAIM_MANY", ("relay.maintenance:sweep_expired",), moves),
        Operation("JOB_CLAIM_MANY", ("consumers.claimer:Claimer.no_such_method",), moves),
        Operation("JOB_NO_SUCH_STATEMENT", ("consumers.claimer:Claimer._claim",), moves),
    ]
    problems = docs.index_problems(wrong)
    assert "JOB_CLAIM_MANY: relay.maintenance:sweep_expired does not run it" in problems
    assert any("consumers.store:JobStore.claim runs it but is not among" in p for p in problems)
    missing = "caller consumers.claimer:Claimer.no_such_method is no function"
    assert any(missing in p for p in problems)
    assert "JOB_NO_SUCH_STATEMENT: no such statement in schema/queries/" in problems
    unlisted = "JOB_SWEEP_EXPIRED moves jobs (inserts, deletes or sets a state) but has no entry"
    assert any(p.startswith(unlisted) for p in problems)


def test_the_legal_transitions_are_the_edges_of_the_index() -> None:
    edges = {edge for op in OPERATIONS for edge in op.moves}
    legal = {(before, after) for before, afters in TRANSITIONS.items() for after in afters}
    assert legal == {(b, a) for b, a in edges if b is not None and a is not None}
    assert edges_of("JOB_HEARTBEAT_MANY") == frozenset(), "a heartbeat moves no job"


def test_only_an_operator_leaves_a_terminal_state() -> None:
    for op in OPERATIONS:
        for before, after in op.moves:
            if before in TERMINAL and after is not None:
                assert (before, after) in OPERATOR_ONLY, (op.statement, before, after)
                assert all(c.startswith("outbox.replay:") for c in op.callers), op.statement


def test_every_state_is_reached_from_an_enqueue_and_reaches_a_final_one() -> None:
    edges = {edge for op in OPERATIONS for edge in op.moves}
    reached: set[JobState | None] = {None}
    while new := {a for b, a in edges if b in reached and a not in reached}:
        reached |= new
    assert reached >= set(JobState)
    for state in JobState:
        seen: set[JobState | None] = {state}
        while new := {a for b, a in edges if b in seen and a not in seen}:
            seen |= new
        assert seen & TERMINAL, f"{state} never finishes"


def _diagram_edges(text: str) -> set[Edge]:
    block = text.split("```mermaid", 1)[1].split("```", 1)[0]
    found: set[Edge] = set()
    for before, after in re.findall(r"^\s*(\[\*\]|\w+) --> (\[\*\]|\w+)", block, re.M):
        found.add(
            (
                None if before == "[*]" else JobState(before),
                None if after == "[*]" else JobState(after),
            )
        )
    return found


def test_the_diagram_draws_exactly_the_edges_of_the_index() -> None:
    """The diagram is drawn by hand; [*] is where a job enters (its enqueue) and
    leaves (retention deletes a finished one)."""
    drawn = _diagram_edges(docs.STATE_DOC.read_text())
    indexed = {edge for op in OPERATIONS for edge in op.moves}
    assert drawn - indexed == set(), "drawn in docs/design/state-machine.md, in no operation"
    assert indexed - drawn == set(), "in schema/states.py OPERATIONS, not drawn"
