"""A TCP proxy on loopback that loses acknowledgements: it forwards requests to one broker intact
and, on command, swallows the responses of Produce requests, then closes the client's connection.
The broker wrote the batch; the client never heard, so it sends the batch again on a new
connection: the retry an idempotent producer must not store twice.

It reads the frames (protocol/framing.py) in both directions of each connection, on a thread
per direction: a request's header gives its api key and correlation id, which the proxy notes
before forwarding it; a response's header gives only the correlation id, which names the request
it answers. `drop_every(n, times)` swallows every n-th Produce response (counting all of them,
over all connections) until `times` were swallowed. Clients must reach the broker only through
the proxy: start the broker with `advertised.port` = `proxy.port`, so Metadata names the proxy.
"""
from __future__ import annotations

import socket
import threading
from typing import Any

from protocol.framing import REQUEST_HEADER, RESPONSE_HEADER, ApiKey

_SIZE_BYTES = 4


class LossyProxy:
    """Listens on a free port of `host` at once, so the broker can be started advertising it;
    forwards to the target given to `forward_to` (the broker, once it listens)."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._server = socket.create_server((host, 0))
        self.host, self.port = self._server.getsockname()[:2]
        self._target: tuple[str, int] | None = None
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._closed = False
        self._every = 0
        self._to_drop = 0
        self.produce_responses = 0  # seen, dropped or not
        self.dropped = 0

    def forward_to(self, target: tuple[str, int]) -> "LossyProxy":
        self._target = target
        threading.Thread(target=self._accept, daemon=True, name="lossy-proxy-accept").start()
        return self

    def drop_every(self, n: int, times: int) -> None:
        """Swallow every `n`-th Produce response from now on, `times` of them in all."""
        with self._lock:
            self._every, self._to_drop, self.produce_responses = n, times, 0

    def _drops(self) -> bool:
        """Whether to swallow the Produce response at hand (called once per Produce response)."""
        with self._lock:
            self.produce_responses += 1
            if self._to_drop > 0 and self.produce_responses % self._every == 0:
                self._to_drop -= 1
                self.dropped += 1
                return True
            return False

    def close(self) -> None:
        self._closed = True
        self._server.close()
        with self._lock:
            doomed, self._sockets = list(self._sockets), set()
        _close(*doomed)

    def __enter__(self) -> "LossyProxy":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _accept(self) -> None:
        assert self._target is not None
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(self._target, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets |= {client, upstream}
            in_flight: dict[int, int] = {}  # correlation id -> api key, of this connection's requests
            threading.Thread(target=self._requests, args=(client, upstream, in_flight), daemon=True,
                             name="lossy-proxy-requests").start()
            threading.Thread(target=self._responses, args=(upstream, client, in_flight), daemon=True,
                             name="lossy-proxy-responses").start()

    def _release(self, *sockets: socket.socket) -> None:
        with self._lock:
            self._sockets.difference_update(sockets)
        _close(*sockets)

    def _requests(self, client: socket.socket, upstream: socket.socket, in_flight: dict[int, int]) -> None:
        """Client -> broker, every frame intact, each noted before it goes (its response may come at once)."""
        try:
            while frame := _read_frame(client):
                _, api_key, _, correlation_id, _ = REQUEST_HEADER.unpack_from(frame)
                in_flight[correlation_id] = api_key
                upstream.sendall(frame)
        except OSError:
            pass
        finally:
            self._release(client, upstream)

    def _responses(self, upstream: socket.socket, client: socket.socket, in_flight: dict[int, int]) -> None:
        """Broker -> client; a Produce response to drop is swallowed and the connection closed."""
        try:
            while frame := _read_frame(upstream):
                _, correlation_id, _ = RESPONSE_HEADER.unpack_from(frame)
                if in_flight.pop(correlation_id, None) == ApiKey.PRODUCE and self._drops():
                    break
                client.sendall(frame)
        except OSError:
            pass
        finally:
            self._release(client, upstream)


def _read_frame(sock: socket.socket) -> bytes | None:
    """One whole frame (its size field included), or None at the end of the stream."""
    head = _read_exactly(sock, _SIZE_BYTES)
    if head is None:
        return None
    body = _read_exactly(sock, int.from_bytes(head, "big"))
    return None if body is None else head + body


def _read_exactly(sock: socket.socket, count: int) -> bytes | None:
    buffer = bytearray(count)
    view, got = memoryview(buffer), 0
    while got < count:
        received = sock.recv_into(view[got:])
        if not received:
            return None
        got += received
    return bytes(buffer)


def _close(*sockets: socket.socket) -> None:
    for sock in sockets:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()
