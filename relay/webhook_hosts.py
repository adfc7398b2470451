"""Where a relay's webhook calls may go: public addresses, and the hosts and networks
the operator allows (``--webhook-allow-hosts``).

A URL often comes from a producer's own user ("notify me here"). Called as given, it
would let that user make the relay send signed requests into the network the relay
runs in (a metadata service at 169.254.169.254, an admin port on localhost), and read
which answer from the error the operators' surfaces show. So each call first resolves
its host, and every address it resolves to must be public or allowed.

The check is made before the call, and the call resolves the name again: a name whose
answers change in between (DNS rebinding) could still reach a private address. An
endpoint that must be internal is named in the allow list instead.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass

import yarl

from hybrid_jobs.plumbing.config import ConfigError

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class AllowedHosts:
    names: frozenset[str]
    networks: tuple[Network, ...]

    @classmethod
    def parse(cls, raw: str) -> AllowedHosts:
        """``hooks.internal,10.1.0.0/16,127.0.0.1``; ConfigError for an empty item."""
        names: set[str] = set()
        networks: list[Network] = []
        for item in (part.strip() for part in raw.split(",")) if raw.strip() else ():
            if not item:
                raise ConfigError("webhook_allow_hosts has an empty item (two commas?)")
            try:
                networks.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                names.add(item.lower().rstrip("."))
        return cls(frozenset(names), tuple(networks))

    def allows(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        return address.is_global or any(address in net for net in self.networks)

    async def refusal(self, url: str) -> str | None:
        """Why a call to ``url`` may not be made, or None. A name that does not
        resolve is left to the call, which fails with its own error."""
        parsed = yarl.URL(url)
        host = (parsed.host or "").lower().rstrip(".")
        if host in self.names:
            return None
        try:
            addresses = [ipaddress.ip_address(host)]
        except ValueError:
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(
                    host, parsed.port, type=socket.SOCK_STREAM
                )
            except OSError:
                return None
            addresses = [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]
        for address in addresses:
            if not self.allows(address):
                return (
                    f"{host} is {address}, not a public address: calls go there only if"
                    " --webhook-allow-hosts names it"
                )
        return None
