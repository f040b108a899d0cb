"""BrokerChannel: requests from this broker to another, on connections identified as this broker
(BrokerHandshake, broker/cluster/broker_identity.py): what the transaction coordinator sends
partition leaders (WriteTxnMarkers), which they serve only to registered brokers.

One connection per peer, opened on first use and again after it closed. Loop-local.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from client.connection import BrokerConnection
from common.errors import NetworkError
from protocol import BrokerHandshakeRequest, RequestMessage

R = TypeVar("R")


class BrokerChannel:
    def __init__(self, broker_id: int, incarnation: Callable[[], str], address: Callable[[int], tuple[str, int] | None],
                 request_timeout_s: float = 30.0, local_host: str | None = None) -> None:
        self.broker_id = broker_id
        self._incarnation = incarnation  # this broker's, known once it registered
        self._address = address
        self.request_timeout_s = request_timeout_s
        self.local_host = local_host
        self._connections: dict[int, BrokerConnection] = {}

    async def send(self, broker: int, request: RequestMessage[R]) -> R:
        """`request`'s response from `broker`; NetworkError if it is not registered or unreachable,
        or the PymqError its answer names."""
        connection = await self._connection(broker)
        try:
            return await connection.send(request, timeout_s=self.request_timeout_s)
        except NetworkError:
            connection.close()
            raise

    async def _connection(self, broker: int) -> BrokerConnection:
        connection = self._connections.get(broker)
        if connection is not None and not connection.closed:
            return connection
        address = self._address(broker)
        if address is None:
            raise NetworkError(f"broker {broker} is not registered")
        connection = await BrokerConnection.open(*address, timeout_s=self.request_timeout_s, local_host=self.local_host)
        try:
            await connection.send(BrokerHandshakeRequest(self.broker_id, self._incarnation()),
                                  timeout_s=self.request_timeout_s)
        except BaseException:
            connection.close()
            raise
        self._connections[broker] = connection
        return connection

    def close(self) -> None:
        for connection in self._connections.values():
            connection.close()
        self._connections.clear()
