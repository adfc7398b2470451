"""The strength check of `jobctl serve`'s API token (jobctl.api.tokens): a long
token that is a repeat or a sequence is as weak as its pattern, and what
``secrets`` makes always passes."""

from __future__ import annotations

import random
import secrets

import pytest

from hybrid_jobs.jobctl.api.tokens import MIN_TOKEN_BITS, checked, estimated_bits
from hybrid_jobs.plumbing.config import ConfigError

SETTING = "JOBCTL_API_TOKEN"


@pytest.mark.parametrize(
    "weak",
    [
        pytest.param("0123456789" * 4, id="repeated-digits"),
        pytest.param("0123456789" * 20, id="repeated-digits-long"),
        pytest.param("abcdefghij" * 3, id="repeated-alphabet"),
        pytest.param("abcdefghijklmnopqrstuvwxyz" * 3, id="whole-alphabet-repeated"),
        pytest.param("a" * 80, id="one-character"),
        pytest.param("xQ7" * 30, id="period-3"),
        pytest.param("Zq8-" * 25, id="period-4-all-classes"),
        pytest.param("13579" * 10, id="odd-digits-repeated"),
        # six symbols of four classes, in no pattern: 52 bits at most, not 131
        pytest.param("aA1!bBa1A!Bb1a!AbB!1", id="six-symbols-four-classes"),
    ],
)
def test_a_long_repetitive_token_is_refused_in_one_line(weak: str) -> None:
    assert estimated_bits(weak) < MIN_TOKEN_BITS
    with pytest.raises(ConfigError) as refused:
        checked(weak, SETTING)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"{SETTING} is too weak to guard payloads (about ")
    assert f"at least {MIN_TOKEN_BITS} needed" in message
    assert "secrets.token_urlsafe(32)" in message
    assert weak not in message


def test_tokens_made_by_secrets_always_pass() -> None:
    for _ in range(1000):
        token = secrets.token_urlsafe(32)
        assert checked(token, SETTING) == token
    for _ in range(200):
        token = secrets.token_hex(32)
        assert checked(token, SETTING) == token


def test_the_compose_demo_token_passes() -> None:
    demo = "demo-5Pq9Zr2Wn7Lx4Tk8Hc3Vb6Jm1Fs0Gd"
    assert checked(demo, SETTING) == demo


def test_a_repeat_costs_no_more_than_its_characters() -> None:
    # A pattern is never counted above the characters it stands for.
    token = secrets.token_urlsafe(32)
    assert estimated_bits(token + token) >= estimated_bits(token)
    assert estimated_bits("") == 0.0


def test_a_128_bit_hex_token_that_drew_few_digits_is_refused() -> None:
    # token_hex(16) holds exactly 128 bits; this one drew only 9 of the 16 hex
    # digits (about one in 10,000 does), which the estimate cannot tell from a
    # token of 9 symbols: refused, with the advice to make one with secrets.
    drawn = "14b835b1684b47461b17b355e1e4b63e"
    assert len(set(drawn)) == 9
    with pytest.raises(ConfigError, match="token_urlsafe"):
        checked(drawn, SETTING)


def test_few_distinct_characters_in_a_random_order_are_refused() -> None:
    token = "".join(random.Random(7).choice("ab") for _ in range(100))
    with pytest.raises(ConfigError):
        checked(token, SETTING)
