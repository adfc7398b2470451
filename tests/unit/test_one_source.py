"""Facts written once: each daemon flag's default is its settings' default, the
worker TTL is one constant every judgement of liveness uses, the reasons a job or a
tenant waits are the enums of schema/states.py, and every advisory lock key is in
schema/locks.py. No services."""

from __future__ import annotations

import dataclasses
import importlib
import re
import uuid
from pathlib import Path
from typing import Any

import click
import pytest

from hybrid_jobs.consumers.cli import main as consumer_main
from hybrid_jobs.consumers.settings import ConsumerSettings
from hybrid_jobs.jobctl.metrics import CollectorSettings
from hybrid_jobs.jobctl.service import queries as service_queries
from hybrid_jobs.plumbing.cli import default_of, settings_from
from hybrid_jobs.plumbing.config import DEFAULT_AMQP_URL, DEFAULT_DATABASE_URL, AmqpUrl, DatabaseUrl
from hybrid_jobs.relay.cli import main as relay_main
from hybrid_jobs.relay.settings import RelaySettings
from hybrid_jobs.schema import docs
from hybrid_jobs.schema import queries as q
from hybrid_jobs.schema.locks import LockKey
from hybrid_jobs.schema.states import DelayReason, HeldReason

ROOT = Path(__file__).resolve().parents[2]


def _flag_defaults(command: click.Command) -> dict[str, Any]:
    return {p.name: p.default for p in command.params if p.name is not None}


@pytest.mark.parametrize(
    ("command", "settings"), [(relay_main, RelaySettings), (consumer_main, ConsumerSettings)]
)
def test_every_flag_that_sets_a_setting_defaults_to_the_settings_default(
    command: click.Command, settings: type[Any]
) -> None:
    flags = _flag_defaults(command)
    fields = {f.name: f for f in dataclasses.fields(settings)}
    # (--queue sets a required field: its default is the registry's, not the settings'.)
    shared = sorted(
        n for n in set(flags) & set(fields) if fields[n].default is not dataclasses.MISSING
    )
    assert len(shared) >= 6, shared
    for name in shared:
        default = fields[name].default
        # A setting that defaults to None (automatic, for ever) is 0 on the command line.
        expected = 0 if default is None else default
        assert flags[name] == expected, f"--{name.replace('_', '-')}: {flags[name]!r}"
        assert default_of(settings, name, none=0) == expected


def test_the_daemons_settings_from_their_default_flags_are_the_settings_defaults() -> None:
    # settings_from reads every flag a setting_option declared by the field's name;
    # a flag at its 'none' value (0: automatic, for ever, no limit) is None again.
    given = {
        "database": DatabaseUrl.parse(DEFAULT_DATABASE_URL),
        "amqp": AmqpUrl.parse(DEFAULT_AMQP_URL),
    }
    relay = settings_from(RelaySettings, _flag_defaults(relay_main), **given)
    assert relay == RelaySettings(**given)
    flags = {**_flag_defaults(relay_main), "window": 0, "keep_effects": 0.0, "batch_size": 7}
    changed = settings_from(RelaySettings, flags, **given)
    assert (changed.window, changed.keep_effects, changed.batch_size) == (None, None, 7)
    flags = {**_flag_defaults(consumer_main), "default_timeout": 0.0, "concurrency": 3}
    consumer = settings_from(ConsumerSettings, flags, **given, queues=("default",))
    assert (consumer.default_timeout, consumer.concurrency) == (None, 3)
    assert consumer.lease_seconds == ConsumerSettings(**given, queues=("default",)).lease_seconds


def test_the_metrics_flags_default_to_the_collectors_settings() -> None:
    from hybrid_jobs.jobctl.commands.serve import serve

    flags = _flag_defaults(serve)
    assert flags["metrics_max_queues"] == CollectorSettings().max_queues
    assert flags["metrics_max_job_types"] == CollectorSettings().max_job_types


def test_default_of_refuses_a_field_it_does_not_know() -> None:
    with pytest.raises(TypeError):
        default_of(RelaySettings, "no_such_setting")
    with pytest.raises(TypeError):
        default_of(RelaySettings, "database")  # required: no default to show


def test_one_worker_ttl_for_the_relay_the_consumer_explain_and_jobctl() -> None:
    ttl = q.WORKER_TTL_SECONDS
    assert _flag_defaults(relay_main)["worker_ttl"] == ttl
    assert default_of(RelaySettings, "worker_ttl") == ttl
    assert default_of(ConsumerSettings, "worker_ttl") == ttl
    explain = importlib.import_module("hybrid_jobs.outbox.explain")
    assert explain._params(uuid.uuid4())["worker_ttl"] == ttl


def test_liveness_is_judged_by_the_bound_ttl_never_by_a_figure_in_the_sql() -> None:
    texts = {s.name: s.text for s in docs.statements()}
    # jobctl's own statements; a fragment it imports from schema.queries (LIVE_WORKER,
    # LEASE_LAPSED) is judged in the statements it is composed into
    texts |= {
        name: value
        for name, value in vars(service_queries).items()
        if name.isupper() and isinstance(value, str) and getattr(q, name, None) is not value
    }
    # (A relay's liveness is its own figure, RELAY_LIVE_SECONDS: it refreshes its row
    # far more often than a consumer.)
    judging = {
        name
        for name, text in texts.items()
        if re.search(r"w\.last_seen_at|FROM workers", text) and "last_seen_at" in text
    }
    assert {"WORKER_EXPIRE", "JOB_EXPLAIN", "STATS_WORKERS", "WORKERS_LIST"} <= judging
    for name in judging - {"WORKER_SEEN"}:
        assert "%(worker_ttl)s" in texts[name], name
        assert not re.search(r"interval '60|secs => 60\b", texts[name]), name


_REASON = re.compile(
    r"'(QUEUE_PAUSED|NO_HANDLER|TENANT_CAP|RATE_LIMITED|KEY_BUSY|KEY_ORDER|NO_AUTHORIZED_RUNNER"
    r"|RESOURCE_BUSY|RESOURCE_UNCERTAIN|WINDOW|FAIR_SHARE|DEPENDENCY|SNOOZED|CONCURRENCY_LIMIT"
    r"|QUEUE_CONCURRENCY_LIMIT|WEIGHT_OVER_CONCURRENCY)'"
)


def test_the_reasons_the_sql_writes_are_the_enums() -> None:
    # DEPENDENCY is the enqueue's (and a replay's), lifted by the end of the last parent;
    # SNOOZED the outcome's of a snoozed attempt
    claims = set(DelayReason) - {DelayReason.DEPENDENCY, DelayReason.SNOOZED}
    assert set(_REASON.findall(q.JOB_CLAIM_MANY)) == claims
    assert set(_REASON.findall(q.JOB_INSERT_MANY)) == {DelayReason.DEPENDENCY}
    assert DelayReason.SNOOZED in _REASON.findall(q.JOB_FINISH_MANY)
    assert set(_REASON.findall(q.OUTBOX_WAKE_QUEUE)) == set(HeldReason)
    for s in docs.statements():
        found = set(_REASON.findall(s.text))
        assert found <= set(DelayReason) | set(HeldReason), s.name


def test_every_advisory_lock_key_is_in_the_one_table() -> None:
    """A fixed key written anywhere else could reuse one (the orphan walk once shared
    the retention chore's, so each skipped the other's rounds)."""
    assert len(set(LockKey)) == len(LockKey.__members__)
    strays = []
    for path in ROOT.glob("*/**/*.py"):
        if ".venv" in path.parts or path.name == "locks.py" or "tests" in path.parts:
            continue
        text = path.read_text(encoding="utf-8")
        # a fixed key, or a lock's text (OpenTelemetry attribute names share the prefix)
        if re.search(r"0x6A6F|6A6F62|advisory[^\n]*hybrid_jobs\.", text, re.IGNORECASE):
            strays.append(str(path.relative_to(ROOT)))
    assert strays == []
