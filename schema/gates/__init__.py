"""The gates: each feature that can keep a due job from starting, in a module of its
own, and the registry the claim is composed from.

A gate declares, in its module:

- ``USES``: which jobs use it, as a condition on the job's row ``j`` (and its
  handler's terms ``t``), a mark set at enqueue;
- ``REASONS``: the delay reasons a claim it turns down records (``explain`` says
  them in words, schema/states.py, and the metrics count them by name);
- ``CLAIM_ADMIT``: its read-only admission step in the claim, which locks what it
  reads in the gate's rank and takes nothing;
- ``CLAIM_TAKE``: what it takes, once every gate has admitted the job;
- ``REFUSED``: the lines of the claim's CASE that name its reason;
- ``HOLDS`` (a gate whose lease keeps something until it ends: keys, resources):
  which leases hold it, so that an end of a lease composed without the gate's
  release (:func:`~hybrid_jobs.schema.queries.job_finish_many`) leaves theirs alone;
- and, for a statement composed without it, ``CLAIM_ADMIT_ABSENT`` and
  ``CLAIM_TAKE_ABSENT``: the same names, empty, for the steps after it to read.

A claim is composed (schema/queries/lease.py, :func:`job_claim_many`) from the gates
its batch's jobs use: one that uses none runs the plain claim, with no gate's SQL in
it, and one that uses the key gate runs a claim with the key's steps and no other
gate's. Every gate checks, in rank order, before any takes: a job one gate turns
down takes nothing from another (no token, no slot, no key).

The tenant cap and the dedicated runners are in every claim (the plain one too): they
are a probe of the job's own tenant. What a lease releases at its end, and who is
woken then, is :func:`~hybrid_jobs.schema.queries.fragments.lease_ended` (keys and
resources, each composed in only for the leases that hold it) with
:func:`~hybrid_jobs.schema.queries.fragments.key_wake_next` and
:func:`~hybrid_jobs.schema.queries.fragments.resource_wake_next`; any end of a
waiting job passes its turn on too (trigger ``jobs_hand_on``).
"""

from __future__ import annotations

from typing import Final

# The optional gates, in their rank: the order a claim locks what they hold (a
# key's usage row, then a rate limit's bucket, then a resource's hold), after the
# tenants' slots. A new gate adds its module and its name here. A concurrency
# limit's row (concurrency_limits) ranks before the tenants' slots: the claim locks
# it after the rate limits' buckets and before the tenants, and every end of a
# lease releases it before the tenants' slots (fragments.lease_ended). A queue's
# concurrency limit (queue_limits) ranks right after the types' limits and before
# the tenants', in the claim and in every end of a lease alike.
# A job's weight locks nothing: it changes how many slots the others count it for.
GATES: Final = ("key", "rate", "resource", "deadline", "concurrency", "queue_limit", "weight")

# The gates whose lease holds something until it ends (a key's lease, a resource's
# hold, a slot of a type's or a queue's concurrency limit, a weight's slots): the
# ones the end of a lease releases, and is composed of.
HELD_GATES: Final = frozenset({"key", "resource", "concurrency", "queue_limit", "weight"})
