"""Dedicated runners (tenant_limits.runners = 'dedicated'): a tenant's jobs run only
on consumers that name it (``consumer --tenant``). In every claim, the plain one too:
one probe of the job's own tenant, however many tenants are dedicated. Nothing is
taken, so nothing to release."""

from __future__ import annotations

from typing import Final

from hybrid_jobs.schema.states import DelayReason

REASONS: Final = (DelayReason.NO_AUTHORIZED_RUNNER,)

# A dedicated tenant this worker does not name (%(tenants)s): its jobs are not this
# worker's to take.
NOT_OURS: Final = """EXISTS (SELECT 1 FROM tenant_limits AS d
                            WHERE d.tenant = j.tenant AND d.runners = 'dedicated'
                              AND d.tenant <> ALL(%(tenants)s::text[]))"""
