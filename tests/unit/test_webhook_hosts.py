"""Where webhook calls may go: public addresses, and what the operator allows."""

from __future__ import annotations

import ipaddress

import pytest

from hybrid_jobs.plumbing.config import ConfigError
from hybrid_jobs.relay.webhook_hosts import AllowedHosts


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/x",
        "http://169.254.169.254/latest/meta-data/",  # a cloud's metadata service
        "https://10.0.0.7/hook",
        "https://192.168.1.1/",
        "http://[::1]/x",
        "http://localhost/x",
        "http://0.0.0.0/",
    ],
)
async def test_an_address_that_is_not_public_is_refused_by_default(url: str) -> None:
    refusal = await AllowedHosts.parse("").refusal(url)
    assert refusal is not None and "not a public address" in refusal


async def test_a_public_address_is_called() -> None:
    assert await AllowedHosts.parse("").refusal("https://93.184.215.14/hook") is None


async def test_allowed_networks_and_names_are_called() -> None:
    allowed = AllowedHosts.parse("10.1.0.0/16, hooks.internal., ::1")
    assert await allowed.refusal("https://10.1.2.3/x") is None
    assert await allowed.refusal("https://10.2.0.1/x") is not None
    assert await allowed.refusal("https://HOOKS.internal/x") is None
    assert await allowed.refusal("http://[::1]:9000/x") is None


async def test_a_name_that_does_not_resolve_is_left_to_the_call() -> None:
    assert await AllowedHosts.parse("").refusal("https://no-such-host.invalid/x") is None


def test_a_malformed_list_is_refused_at_start() -> None:
    with pytest.raises(ConfigError, match="empty item"):
        AllowedHosts.parse("10.0.0.0/8,,hooks.internal")
    assert AllowedHosts.parse("").allows(ipaddress.ip_address("8.8.8.8"))
