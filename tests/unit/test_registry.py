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
