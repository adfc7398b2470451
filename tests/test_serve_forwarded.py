"""Whose address a request is: X-Forwarded-For is believed only from a proxy named by
--forwarded-allow-ips (none by default), only as a well-formed address, and the
wrong-token limit counts the socket's peer too. Each point through a real `jobctl
serve` process, reached over real loopback sockets from two addresses: 127.0.0.1
(where a proxy would run, or any other process of the machine) and 127.0.0.2 (a
direct client that is not the proxy)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from hybrid_jobs import defaults
from hybrid_jobs.schema.topology import Topology
from tests.support.api import BEARER, TOKEN, free_port, served
from tests.support.jobs import enqueue
from tests.support.processes import BIN, service_env
from tests.support.services import AMQP_URL

WRONG = {"Authorization": "Bearer " + "x" * 43}
GARBAGE = "<img src=x onerror=alert(1)>"
HUGE = "1" * 5000


@contextmanager
def client_from(address: str) -> Iterator[httpx.Client]:
    """A client whose connections leave from ``address`` (any 127.x.y.z is this
    machine's loopback)."""
    transport = httpx.HTTPTransport(local_address=address)
    with httpx.Client(transport=transport, timeout=10) as client:
        yield client


def forwarded(address: str, **more: str) -> dict[str, str]:
    return {"X-Forwarded-For": address} | more


def actor(client: httpx.Client, base: str, headers: dict[str, str]) -> str:
    """Who the server records as having paused and resumed a queue (a write)."""
    paused = client.post(f"{base}/v1/queues/mail/pause", headers=BEARER | headers)
    assert paused.status_code == 200, paused.text[:300]
    resumed = client.post(f"{base}/v1/queues/mail/resume", headers=BEARER | headers)
    assert resumed.status_code == 200, resumed.text[:300]
    assert resumed.json()["paused_by"] == resumed.json()["resumed_by"]
    by: str = resumed.json()["resumed_by"]
    return by


def test_a_forwarded_for_from_a_direct_client_is_ignored_by_default(db_url, engine) -> None:
    enqueue(engine, "greet", {}, queue="mail")
    with (
        served(db_url) as (base, daemon),
        client_from("127.0.0.1") as local,
        client_from("127.0.0.2") as operator,
    ):
        # Wrong tokens, each naming another address, one of them the operator's: the
        # header is not believed, so they are all this one client's.
        names = [f"198.51.100.{n}" for n in range(defaults.SERVE_FAILURES_ALLOWED - 1)]
        for name in [*names, "127.0.0.2"]:
            refused = local.get(f"{base}/v1/jobs", headers=WRONG | forwarded(name))
            assert refused.status_code == 401, (name, refused.text)
        limited = local.get(f"{base}/v1/jobs", headers=WRONG | forwarded("203.0.113.99"))
        assert limited.status_code == 429, limited.text
        assert "127.0.0.1" in limited.json()["detail"]
        # The operator, whose address the header named, is not locked out.
        assert operator.get(f"{base}/v1/jobs", headers=BEARER).status_code == 200
        assert actor(operator, base, forwarded("198.51.100.23")) == "api (127.0.0.2)"
        # X-Forwarded-Proto is not believed either: no HSTS over plain http.
        answer = operator.get(f"{base}/healthz", headers={"X-Forwarded-Proto": "https"})
        assert "Strict-Transport-Security" not in answer.headers
        serving = daemon.wait_for_event("api.serving")
    assert serving["forwarded_allow_ips"] == "none"
    logged = [e for e in daemon.events() if e.get("event") == "api.wrong_token"]
    assert {e["client"] for e in logged} == {"127.0.0.1"}


def test_a_malformed_or_huge_forwarded_for_reaches_no_record_and_refuses_no_write(
    db_url, engine
) -> None:
    enqueue(engine, "greet", {}, queue="mail")
    for args in ((), ("--forwarded-allow-ips", "127.0.0.1")):
        with served(db_url, args=args) as (base, daemon), client_from("127.0.0.1") as local:
            for header in (
                GARBAGE,
                HUGE,
                "203.0.113.007",
                "fe80::1%<b>x</b>",
                f"203.0.113.7, {GARBAGE}",
                "203.0.113.7:99999",
                "[2001:db8::1]x",
            ):
                assert actor(local, base, forwarded(header)) == "api (127.0.0.1)", (args, header)
                wrong = local.get(f"{base}/v1/jobs", headers=WRONG | forwarded(header))
                assert wrong.status_code == 401
                assert GARBAGE not in wrong.text and HUGE not in wrong.text
        assert GARBAGE not in daemon.text() and HUGE not in daemon.text(), args


def test_a_trusted_proxys_forwarded_for_is_honoured_and_bounded(db_url, engine) -> None:
    enqueue(engine, "greet", {}, queue="mail")
    args = ("--forwarded-allow-ips", "127.0.0.1")
    with (
        served(db_url, args=args) as (base, daemon),
        client_from("127.0.0.1") as proxy,
        client_from("127.0.0.2") as direct,
    ):
        # The client the proxy names: the right-most address that is not itself a
        # trusted proxy (what nginx's $proxy_add_x_forwarded_for appended), in its
        # normal form, without a port.
        for header, client in (
            ("203.0.113.7", "203.0.113.7"),
            ("198.51.100.1, 203.0.113.7:4711", "203.0.113.7"),
            ("[2001:DB8::1]:443, 127.0.0.1", "2001:db8::1"),
            ("::ffff:203.0.113.8", "203.0.113.8"),
        ):
            assert actor(proxy, base, forwarded(header)) == f"api ({client})", header
        https = proxy.get(f"{base}/healthz", headers={"X-Forwarded-Proto": "https"})
        assert https.headers["Strict-Transport-Security"].startswith("max-age=")
        # Only the proxy is believed: a direct client's header names nobody.
        assert actor(direct, base, forwarded("203.0.113.7")) == "api (127.0.0.2)"
        plain = direct.get(f"{base}/healthz", headers={"X-Forwarded-Proto": "https"})
        assert "Strict-Transport-Security" not in plain.headers
        # Wrong tokens count against the client the proxy names: it is refused, a
        # client beside it is not, nor one whose address a forger wrote further left.
        for _ in range(defaults.SERVE_FAILURES_ALLOWED):
            wrong = proxy.get(f"{base}/v1/jobs", headers=WRONG | forwarded("203.0.113.66"))
            assert wrong.status_code == 401
        for header in ("203.0.113.66", "203.0.113.7, 203.0.113.66"):
            limited = proxy.get(f"{base}/v1/jobs", headers=BEARER | forwarded(header))
            assert limited.status_code == 429, header
            assert "203.0.113.66" in limited.json()["detail"]
        beside = proxy.get(f"{base}/v1/jobs", headers=BEARER | forwarded("203.0.113.7"))
        assert beside.status_code == 200
        # And against the proxy as a whole, with a larger allowance: a forger who
        # names another address each time still meets a limit.
        extra = defaults.SERVE_PROXY_FAILURES_ALLOWED - defaults.SERVE_FAILURES_ALLOWED
        for n in range(extra):
            rotated = forwarded(f"10.{n // 250}.{n % 250}.1")
            assert proxy.get(f"{base}/v1/jobs", headers=WRONG | rotated).status_code == 401, n
        fresh = proxy.get(f"{base}/v1/jobs", headers=WRONG | forwarded("192.0.2.200"))
        assert fresh.status_code == 429, fresh.text
        assert "127.0.0.1" in fresh.json()["detail"] and "proxy" in fresh.json()["detail"]
        # A direct client is counted as itself, whatever the proxy's count.
        assert direct.get(f"{base}/v1/jobs", headers=BEARER).status_code == 200
    logged = [e for e in daemon.events() if e.get("event") == "api.wrong_token"]
    assert logged[0]["client"] == "203.0.113.66" and logged[0]["peer"] == "127.0.0.1"


def test_a_proxy_named_by_no_address_stops_the_server_and_none_named_is_warned_of(
    db_url,
) -> None:
    environment = service_env(db_url, AMQP_URL, Topology(prefix="unused"))
    environment["JOBCTL_API_TOKEN"] = TOKEN
    refused = subprocess.run(
        [str(BIN / "jobctl"), "serve", "--port", str(free_port())],
        env=environment | {"JOBCTL_FORWARDED_ALLOW_IPS": "127.0.0.1,proxy.internal"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip().splitlines() == [
        "jobctl serve: --forwarded-allow-ips: 'proxy.internal' is not an IP address or"
        " network (10.0.0.1, 10.0.0.0/8, ::1) or '*'"
    ]
    with served(db_url, args=("--public-url", "https://jobs.example.com")) as (_, daemon):
        warned = daemon.wait_for_event("api.no_trusted_proxy")
    assert "--forwarded-allow-ips" in warned["detail"]
