"""Who is asking: the socket's peer, or the client a trusted reverse proxy names.

``X-Forwarded-For`` and ``X-Forwarded-Proto`` are anyone's to write, so they are
believed only from a peer named by ``--forwarded-allow-ips`` (none by default), and
only as a well-formed address: any other value leaves the request its socket's peer.
The client then is what the wrong-token limit counts, the access log shows and the
records of who acted keep (:func:`client_address`).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Final

from starlette.types import ASGIApp, Receive, Scope, Send

from hybrid_jobs.plumbing.config import ConfigError

# Where the middleware leaves its finding in the ASGI scope.
CALLER_KEY: Final = "hybrid_jobs.caller"
# A request whose socket has no peer address (not one over TCP).
UNKNOWN: Final = "unknown"
# Longer than any address with a port ("[" + 45 + "]:65535"): not one.
_MAX_ENTRY_CHARS: Final = 64
_SCHEMES: Final = frozenset({"http", "https"})

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_address(text: str) -> str | None:
    """An IP address, alone or with a port (``203.0.113.7``, ``203.0.113.7:4711``,
    ``2001:db8::1``, ``[2001:db8::1]:443``), in its normal text (lower case,
    compressed; an IPv4-mapped IPv6 address as IPv4), without the port; None for
    anything else, a scoped IPv6 address (``fe80::1%eth0``) or an IPv4 address
    with leading zeros included."""
    value = text.strip()
    if not value or len(value) > _MAX_ENTRY_CHARS or not value.isascii():
        return None
    port = ""
    if value.startswith("["):
        value, bracket, rest = value[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return None
        port = rest[1:]
        if rest and not port:
            return None
    elif value.count(":") == 1:
        value, _, port = value.partition(":")
        if not port:
            return None
    if port and not (port.isdigit() and len(port) <= 5 and int(port) <= 65535):
        return None
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address):
        if address.scope_id is not None:
            return None
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
    return str(address)


@dataclass(frozen=True)
class TrustedProxies:
    """The peers whose forwarded headers are believed (``--forwarded-allow-ips``):
    addresses and networks, or every peer (``*``)."""

    networks: tuple[Network, ...] = ()
    every_peer: bool = False

    @classmethod
    def parse(cls, raw: str, setting: str = "--forwarded-allow-ips") -> TrustedProxies:
        """Comma- or space-separated addresses (``10.0.0.1``, ``::1``) and networks
        (``10.0.0.0/8``), or ``*``; empty: none."""
        items = [item for item in raw.replace(",", " ").split() if item]
        if "*" in items:
            return cls(every_peer=True)
        networks: list[Network] = []
        for item in items:
            try:
                networks.append(ipaddress.ip_network(item.strip("[]"), strict=False))
            except ValueError:
                shown = item[:60].encode("ascii", "backslashreplace").decode()
                raise ConfigError(
                    f"{setting}: {shown!r} is not an IP address or network (10.0.0.1,"
                    " 10.0.0.0/8, ::1) or '*'"
                ) from None
        return cls(tuple(networks))

    def __bool__(self) -> bool:
        return self.every_peer or bool(self.networks)

    def __contains__(self, address: object) -> bool:
        """Whether ``address`` (an address's normal text) is a trusted proxy."""
        if not isinstance(address, str):
            return False
        if self.every_peer:
            return True
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip.version == net.version and ip in net for net in self.networks)

    def describe(self) -> str | list[str]:
        """For the start-up line: ``none``, ``any`` or the networks."""
        if self.every_peer:
            return "any"
        if not self.networks:
            return "none"
        return [str(n.network_address) if n.num_addresses == 1 else str(n) for n in self.networks]

    def client_named(self, forwarded_for: list[bytes]) -> str | None:
        """The client a trusted proxy names in ``X-Forwarded-For`` (every line of it,
        in order): the right-most address that is not itself a trusted proxy, the
        one the nearest proxy added (addresses further left are whatever the client
        wrote); with ``*``, or when every address is a trusted one, the right-most
        (never one a client may have written). None, so that the header is ignored,
        when that entry is not a well-formed address, or there is none."""
        text = ",".join(value.decode("latin-1") for value in forwarded_for)
        entries = text.split(",")
        nearest = parse_address(entries[-1])
        if nearest is None or self.every_peer:
            return nearest
        for entry in reversed(entries):
            found = parse_address(entry)
            if found is None or found not in self:
                return found
        return nearest


@dataclass(frozen=True)
class Caller:
    """Who sent a request: its socket's ``peer``, whether that peer is a trusted
    proxy, and the ``client`` (the peer itself, or whom that proxy names)."""

    peer: str
    client: str
    peer_is_proxy: bool = False

    @property
    def forwarded(self) -> bool:
        return self.client != self.peer


def _peer(scope: Scope) -> str:
    client = scope.get("client")
    if not client:
        return UNKNOWN
    return parse_address(str(client[0])) or UNKNOWN


class ForwardedHeaders:
    """Sets the request's client (and scheme) from ``X-Forwarded-For`` (and
    ``X-Forwarded-Proto``) when its peer is a trusted proxy and the header holds a
    well-formed address; leaves the peer (a :class:`Caller`, under
    :data:`CALLER_KEY`) for the wrong-token limit. Outermost: everything after it
    sees the client."""

    def __init__(self, app: ASGIApp, proxies: TrustedProxies) -> None:
        self.app = app
        self.proxies = proxies

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        peer = _peer(scope)
        caller = Caller(peer, peer, peer != UNKNOWN and peer in self.proxies)
        if caller.peer_is_proxy:
            forwarded_for: list[bytes] = []
            proto: bytes | None = None
            for name, value in scope["headers"]:
                if name == b"x-forwarded-for":
                    forwarded_for.append(value)
                elif name == b"x-forwarded-proto":
                    proto = value
            client = self.proxies.client_named(forwarded_for) if forwarded_for else None
            if client is not None:
                caller = Caller(peer, client, peer_is_proxy=True)
                scope["client"] = (client, 0)
            if proto is not None:
                said = proto.decode("latin-1").rsplit(",", 1)[-1].strip().lower()
                if said in _SCHEMES:
                    scope["scheme"] = (
                        said if scope["type"] == "http" else said.replace("http", "ws")
                    )
        scope[CALLER_KEY] = caller
        await self.app(scope, receive, send)


def caller_of(scope: Scope) -> Caller:
    """The :class:`Caller` of a request (the middleware's finding; without it, the
    socket's peer)."""
    found = scope.get(CALLER_KEY)
    if isinstance(found, Caller):
        return found
    peer = _peer(scope)
    return Caller(peer, peer)


def client_address(scope: Scope) -> str:
    """The client's address as the records of who acted keep it: a validated IP
    address (at most 45 characters), never text from a header; :data:`UNKNOWN`
    without one."""
    return caller_of(scope).client
