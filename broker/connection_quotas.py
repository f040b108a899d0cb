"""ConnectionQuotas: how many client connections are open, in all and per client address (Kafka's
`ConnectionQuotas` in its SocketServer).

`max.connections` bounds the broker's connections; `max.connections.per.ip` bounds those of one
client address, so that one client cannot take every slot and lock everyone else out, and
`max.connections.per.ip.overrides` ("host:count,host:count", IP addresses) raises or lowers it
for named addresses (a trusted gateway, a Spark cluster behind one NAT address). A connection
over either limit is closed right after accept, before anything is read from it.

Pure and loop-local: the connection calls `try_open` when it is accepted and `closed` when it is
lost (only if it was admitted).
"""
from __future__ import annotations

import ipaddress
from collections import Counter
from typing import Any

from common.errors import InvalidConfigError


def parse_overrides(text: str) -> dict[str, int]:
    """`max.connections.per.ip.overrides` as {normalized address: limit}; InvalidConfigError
    naming the entry that is not `address:count` (IPv6 addresses may be written bare or in [])."""
    overrides: dict[str, int] = {}
    for entry in filter(None, (part.strip() for part in text.split(","))):
        host, sep, count = entry.rpartition(":")
        try:
            if not sep:
                raise ValueError("no ':count'")
            address, limit = normalize_address(host.strip("[]")), int(count)
            if limit < 0:
                raise ValueError("a negative count")
        except ValueError as err:
            raise InvalidConfigError(f"max.connections.per.ip.overrides: {entry!r} is not address:count ({err})") from None
        overrides[address] = limit
    return overrides


def normalize_address(host: str) -> str:
    """One spelling per address (`::1` and `0:0::1` count together, and an IPv4 client of a
    dual-stack listener, `::ffff:10.0.0.5`, as `10.0.0.5`); ValueError if not an IP address."""
    address = ipaddress.ip_address(host)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.compressed
    return address.compressed


class ConnectionQuotas:
    def __init__(self, max_connections: int, max_per_ip: int, overrides: dict[str, int] | None = None) -> None:
        self.max_connections = max_connections
        self.max_per_ip = max_per_ip
        self.overrides = overrides or {}
        self.open = 0
        self.per_address: Counter[str] = Counter()

    @classmethod
    def from_config(cls, config: Any) -> "ConnectionQuotas":
        return cls(config["max.connections"], config["max.connections.per.ip"],
                   parse_overrides(config["max.connections.per.ip.overrides"]))

    def limit_for(self, address: str) -> int:
        return self.overrides.get(address, self.max_per_ip)

    def try_open(self, address: str) -> str | None:
        """Count a connection from `address` and return None, or return why it is refused (the
        config that is reached) and count nothing."""
        if self.open >= self.max_connections:
            return "max.connections reached"
        if self.per_address[address] >= self.limit_for(address):
            return (f"max.connections.per.ip{'.overrides' if address in self.overrides else ''} "
                    f"({self.limit_for(address)}) reached for {address}")
        self.open += 1
        self.per_address[address] += 1
        return None

    def closed(self, address: str) -> None:
        """An admitted connection from `address` is gone."""
        self.open -= 1
        self.per_address[address] -= 1
        if not self.per_address[address]:
            del self.per_address[address]  # a broker seen by many addresses keeps no entry per past client
