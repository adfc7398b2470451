"""The address rules of jobctl.api.proxies and the wrong-token limit's two counts
(tests/test_serve_forwarded.py checks them through a real `jobctl serve`). No
services."""

from __future__ import annotations

import pytest

from hybrid_jobs.jobctl.api.guards import FailureLimiter
from hybrid_jobs.jobctl.api.proxies import Caller, TrustedProxies, parse_address
from hybrid_jobs.plumbing.config import ConfigError


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("203.0.113.7", "203.0.113.7"),
        (" 203.0.113.7:4711 ", "203.0.113.7"),
        ("2001:DB8:0::1", "2001:db8::1"),
        ("[2001:db8::1]:443", "2001:db8::1"),
        ("[2001:db8::1]", "2001:db8::1"),
        ("::ffff:203.0.113.8", "203.0.113.8"),
        ("", None),
        ("unknown", None),
        ("<img src=x onerror=alert(1)>", None),
        ("1" * 5000, None),
        ("203.0.113.007", None),
        ("203.0.113.7:", None),
        ("203.0.113.7:65536", None),
        ("203.0.113.7:\uff18\uff10", None),  # full-width digits
        ("[2001:db8::1]:", None),
        ("[2001:db8::1]x", None),
        ("fe80::1%eth0", None),
        ("localhost", None),
    ],
)
def test_only_a_well_formed_address_is_one(text: str, address: str | None) -> None:
    assert parse_address(text) == address


def test_the_trusted_proxies_are_addresses_or_networks() -> None:
    assert not TrustedProxies.parse("")
    proxies = TrustedProxies.parse("127.0.0.1, 10.0.0.0/8 ::1")
    assert proxies.describe() == ["127.0.0.1", "10.0.0.0/8", "::1"]
    assert "10.1.2.3" in proxies and "::1" in proxies and "127.0.0.2" not in proxies
    assert "unknown" not in proxies
    assert TrustedProxies.parse("*").describe() == "any"
    with pytest.raises(ConfigError, match=r"--forwarded-allow-ips: 'localhost' is not an IP"):
        TrustedProxies.parse("127.0.0.1,localhost")


def test_the_client_is_the_right_most_address_no_proxy_of_ours_vouched_for() -> None:
    proxies = TrustedProxies.parse("10.0.0.0/8")
    assert proxies.client_named([b"198.51.100.1, 203.0.113.7, 10.0.0.5"]) == "203.0.113.7"
    assert proxies.client_named([b"198.51.100.1", b"203.0.113.7:80"]) == "203.0.113.7"
    # Every address a trusted one: the nearest, never one a client may have written.
    assert proxies.client_named([b"10.0.0.77, 10.0.0.9"]) == "10.0.0.9"
    # The entry that would be the client is not an address: the header is ignored.
    assert proxies.client_named([b"203.0.113.7, <b>x</b>"]) is None
    assert proxies.client_named([b""]) is None
    # '*': the nearest proxy's word only.
    assert TrustedProxies.parse("*").client_named([b"198.51.100.1, 203.0.113.7"]) == "203.0.113.7"


def test_wrong_tokens_count_against_the_client_and_its_peer() -> None:
    limiter = FailureLimiter(allowed=2, window=60, proxy_allowed=5)
    direct = Caller("127.0.0.2", "127.0.0.2")
    limiter.failed(direct)
    limiter.failed(direct)
    assert limiter.wait(direct)[0] > 0 and limiter.wait(direct)[1] == "127.0.0.2"
    # Through a trusted proxy: the client it names, and the proxy with a larger share.
    attacker = Caller("127.0.0.1", "203.0.113.66", peer_is_proxy=True)
    operator = Caller("127.0.0.1", "203.0.113.7", peer_is_proxy=True)
    limiter.failed(attacker)
    limiter.failed(attacker)
    assert limiter.wait(attacker)[1] == "203.0.113.66"
    assert limiter.wait(operator) == (0, "203.0.113.7")
    for n in range(3):
        limiter.failed(Caller("127.0.0.1", f"10.0.0.{n}", peer_is_proxy=True))
    assert limiter.wait(operator)[1] == "127.0.0.1", "the proxy's count is full"
    assert limiter.wait(Caller("127.0.0.3", "127.0.0.3")) == (0, "127.0.0.3")
