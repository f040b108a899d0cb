"""A TCP proxy on loopback that can cut the connections coming from one address.

It forwards every connection to its target, byte for byte, on a thread of its own. `cut(host)`
closes the connections whose peer is `host` and refuses new ones from it until `heal()`: a
network partition between that address and the target, while everyone else still gets through.
Brokers connect to other brokers from their own loopback address (127.0.0.{id+1}), so cutting a
follower's address cuts exactly its replication from the leader behind the proxy.
"""
from __future__ import annotations

import socket
import threading
from typing import Any


class CuttingProxy:
    def __init__(self, target: tuple[str, int], host: str = "127.0.0.1", port: int = 0) -> None:
        self.target = target
        self._server = socket.create_server((host, port))
        self.address = self._server.getsockname()[:2]
        self._cut: set[str] = set()
        self._pairs: list[tuple[socket.socket, socket.socket, str]] = []
        self._lock = threading.Lock()
        self._closed = False
        self.refused = 0
        threading.Thread(target=self._accept, daemon=True, name="proxy-accept").start()

    @property
    def port(self) -> int:
        return self.address[1]

    def cut(self, host: str) -> None:
        with self._lock:
            self._cut.add(host)
            doomed = [pair for pair in self._pairs if pair[2] == host]
        for client, upstream, _ in doomed:
            _close(client, upstream)

    def heal(self) -> None:
        with self._lock:
            self._cut.clear()

    def close(self) -> None:
        self._closed = True
        self._server.close()
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for client, upstream, _ in pairs:
            _close(client, upstream)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, (peer, _) = self._server.accept()
            except OSError:
                return
            with self._lock:
                refused = peer in self._cut
            if refused:
                self.refused += 1
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._pairs.append((client, upstream, peer))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(source, sink), daemon=True, name="proxy-pump").start()

    def __enter__(self) -> "CuttingProxy":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while chunk := source.recv(1 << 16):
            sink.sendall(chunk)
    except OSError:
        pass
    finally:
        _close(source, sink)


def _close(*sockets: socket.socket) -> None:
    for sock in sockets:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()
