"""The consumer's handler registry: what it refuses at registration."""

from __future__ import annotations

import pytest

from hybrid_jobs import consumers
from hybrid_jobs.consumers import Registry


def test_registry_refuses_bad_handlers() -> None:
    registry = Registry()
    with pytest.raises(ValueError, match="queue"):
        registry.handler("t", queue="bad queue")
    with pytest.raises(ValueError, match="job_type"):
        registry.handler("")
    with pytest.raises(ValueError, match="max_attempts"):
        registry.handler("t", max_attempts=0)
    with pytest.raises(TypeError, match="exactly one argument"):
        registry.handler("t")(lambda: None)

    @registry.handler("t")
    def ok(job: consumers.Job) -> None: ...

    with pytest.raises(ValueError, match="already"):
        registry.handler("t")(ok)


def test_the_claim_terms_are_made_again_only_when_a_handler_is_registered() -> None:
    # Every claim asks for them: one list until the handlers change.
    registry = Registry()

    @registry.handler("first")
    async def first(job: consumers.Job) -> None: ...

    terms = registry.claim_terms()
    assert [t["job_type"] for t in terms] == ["first"]
    assert registry.claim_terms() is terms

    @registry.handler("second", max_attempts=7)
    def second(job: consumers.Job) -> None: ...

    again = registry.claim_terms()
    assert again is not terms
    assert [(t["job_type"], t["sync"], t["max_attempts"]) for t in again][1] == (
        "second",
        True,
        7,
    )
