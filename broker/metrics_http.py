"""The /metrics endpoint: one path, a bounded pool of threads, bounded waits.

prometheus_client's own server starts a thread per connection and answers every path with a full
scrape, so a client that opens connections in a loop (or never finishes sending its request)
makes the broker build scrape after scrape on as many threads. Here:

- only GET /metrics is answered (404 otherwise, without building anything);
- SCRAPE_THREADS threads serve connections; at most QUEUED_CONNECTIONS more wait for one, and a
  connection past that is closed at once;
- a connection that sends nothing for SOCKET_TIMEOUT_S is closed, so it cannot hold a thread.

What one scrape holds is bounded by the collector (broker/metrics.py): per-group series for at
most `metrics.groups.max` groups.
"""
from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

METRICS_PATH = "/metrics"
SCRAPE_THREADS = 2
QUEUED_CONNECTIONS = 8
SOCKET_TIMEOUT_S = 5.0


class _QuietHandler(WSGIRequestHandler):
    """Logs nothing per request; gives up on a client silent for SOCKET_TIMEOUT_S."""

    timeout = SOCKET_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:
        pass


class PooledWSGIServer(WSGIServer):
    """A WSGI server whose connections are served by a fixed pool of threads, with a bounded
    number waiting; `server_close` stops the pool."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[WSGIRequestHandler]) -> None:
        super().__init__(address, handler)
        self._pool = ThreadPoolExecutor(SCRAPE_THREADS, thread_name_prefix="metrics")
        self._slots = threading.BoundedSemaphore(SCRAPE_THREADS + QUEUED_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # too many waiting: the scraper retries at its next interval
            return
        try:
            self._pool.submit(self._serve, request, client_address)
        except RuntimeError:  # the pool is shut down: the server is closing
            self._slots.release()
            self.shutdown_request(request)

    def _serve(self, request: socket.socket, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that went away or timed out: nothing to report

    def shutdown(self) -> None:
        """Stop serve_forever now. It looks for a shutdown between polls of its socket, 0.5 s
        apart, and every broker's clean stop waited for the next one (0.67 s -> 0.11 s without
        it); polling more often costs an idle broker CPU instead. So the flag is set as
        BaseServer.shutdown sets it, and a connection to the server wakes its poll at once."""
        self._BaseServer__shutdown_request = True  # type: ignore[attr-defined]
        with contextlib.suppress(OSError):
            socket.create_connection(self.server_address[:2], timeout=SOCKET_TIMEOUT_S).close()
        super().shutdown()

    def server_close(self) -> None:
        super().server_close()
        self._pool.shutdown(wait=False, cancel_futures=True)


def only_metrics_path(app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    """`app` for GET /metrics, 404 for any other path."""

    def serve(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != METRICS_PATH:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"the metrics are at /metrics\n"]
        return app(environ, start_response)

    return serve


def start_metrics_server(host: str, port: int, registry: CollectorRegistry) -> PooledWSGIServer:
    """Serve `registry` at http://host:port/metrics on a daemon thread; returns the server
    (`server_port`; `shutdown()` then `server_close()` to stop it)."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]  # an IPv6 host needs AF_INET6
    server_class = type("PooledWSGIServer", (PooledWSGIServer,), {"address_family": family})
    server = make_server(host, port, only_metrics_path(make_wsgi_app(registry)), server_class,
                         handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="metrics-accept", daemon=True).start()
    return server  # type: ignore[return-value]
