"""AMQP_URL as a list of a cluster's nodes: parsed, redacted, and each bad entry
named by its place. The failover itself is tests/test_failover.py."""

from __future__ import annotations

import pytest

from hybrid_jobs.plumbing.config import AmqpUrl, ConfigError

SECRET = "hunter2-mq"


def test_amqp_url_takes_one_url_per_node_comma_separated() -> None:
    url = AmqpUrl.parse(
        f"amqp://app:{SECRET}@h1:5672/jobs, amqp://app:p,w@h2:5673/jobs,amqps://app:x@h3/jobs"
    )
    assert url.urls == (
        f"amqp://app:{SECRET}@h1:5672/jobs",
        "amqp://app:p,w@h2:5673/jobs",  # a comma in a password does not split it
        "amqps://app:x@h3/jobs",
    )
    assert url.address == "h1:5672,h2:5673,h3:5671"
    assert url.redacted() == "amqp://h1:5672/jobs,amqp://h2:5673/jobs,amqps://h3/jobs"
    assert SECRET not in repr(url)
    assert [n.address for n in url.nodes] == ["h1:5672", "h2:5673", "h3:5671"]
    assert (url.user, url.vhost, url.has_password) == ("app", "jobs", True)
    # Handed on to a child process as the setting's own value.
    assert AmqpUrl.parse(url.url) == url
    assert AmqpUrl.parse("amqp://127.0.0.1:5672/").urls == ("amqp://127.0.0.1:5672/",)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("amqp://h1/,amqp://h2:0/", "AMQP_URL (URL 2) has an invalid port"),
        ("amqp://h1/,", "AMQP_URL (URL 2) is empty"),
        ("amqp://h1/,http://h2/", "AMQP_URL (URL 2) must be an amqp:// or amqps:// URL"),
        ("amqp://h1/a,amqp://h2/b", "AMQP_URL: every URL must name the same virtual host"),
    ],
)
def test_a_bad_url_in_the_list_is_named_by_its_place(value: str, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        AmqpUrl.parse(value)
    assert str(refused.value).startswith(message)
