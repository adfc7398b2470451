"""Which statements the consumer's store runs: the test sees the SQL of each, in
order, while the store runs them as it would."""

from __future__ import annotations

import pytest

from hybrid_jobs.consumers import store as store_module
from hybrid_jobs.plumbing.db import Native


def record_statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """From now on, every statement the store runs is appended to the list returned."""
    ran: list[str] = []
    real_native = store_module.native

    def recording(sql: str) -> Native:
        ran.append(sql)
        return real_native(sql)

    monkeypatch.setattr(store_module, "native", recording)
    return ran
