"""A blocking raw-socket client that speaks pymq framing byte by byte (the `raw_client` fixture of
tests/conftest.py makes them), for bad-input, hostile-client and fuzz tests."""
from __future__ import annotations

import socket
import struct

import msgpack


class RawClient:
    """A blocking raw-socket client that speaks pymq framing byte by byte, for bad-input tests.

    Nothing is validated on the way out: callers can send any control bytes, any payload, any
    header size. `recv_response` parses one response frame (size | correlation_id |
    control_length | msgpack control | payload). Not thread-safe; one socket per instance.
    """

    def __init__(self, port: int, host: str = "127.0.0.1", timeout_s: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = bytearray()
        self._next_id = 1

    def frame(self, api_key: int, control: "dict | bytes", payload: bytes = b"", api_version: int = 0,
              correlation_id: int | None = None, size_override: int | None = None) -> tuple[int, bytes]:
        """(correlation_id, frame bytes) of one request; `control` bytes are sent as they are."""
        if correlation_id is None:
            correlation_id, self._next_id = self._next_id, self._next_id + 1
        packed = control if isinstance(control, (bytes, bytearray)) else msgpack.packb(control, use_bin_type=True)
        size = 12 + len(packed) + len(payload) if size_override is None else size_override  # header after size: 12 bytes
        header = struct.pack(">ihhii", size, api_key, api_version, correlation_id, len(packed))
        return correlation_id, header + bytes(packed) + bytes(payload)

    def send_frame(self, api_key: int, control: "dict | bytes", payload: bytes = b"", api_version: int = 0,
                   correlation_id: int | None = None, size_override: int | None = None) -> int:
        """Send one request frame; returns its correlation id."""
        correlation_id, data = self.frame(api_key, control, payload, api_version, correlation_id, size_override)
        self.sock.sendall(data)
        return correlation_id

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _read_exactly(self, n: int) -> bytes:
        while len(self._buf) < n:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("connection closed by the broker")
            self._buf += chunk
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def recv_response(self) -> tuple[int, dict, bytes]:
        """(correlation_id, control map, payload) of the next response; raises on close/timeout."""
        (size,) = struct.unpack(">i", self._read_exactly(4))
        body = self._read_exactly(size)
        correlation_id, control_length = struct.unpack_from(">ii", body)
        control = msgpack.unpackb(body[8 : 8 + control_length], raw=False)
        return correlation_id, control, body[8 + control_length :]

    def request(self, api_key: int, control: "dict | bytes", payload: bytes = b"", **kwargs: object) -> tuple[dict, bytes]:
        """Send one frame and return (control, payload) of its response (checks the correlation id)."""
        sent = self.send_frame(api_key, control, payload, **kwargs)  # type: ignore[arg-type]
        correlation_id, control_out, payload_out = self.recv_response()
        assert correlation_id == sent, f"response for correlation id {correlation_id}, expected {sent}"
        return control_out, payload_out

    def is_closed(self, timeout_s: float = 5.0) -> bool:
        """True once the broker has closed the connection (EOF or reset) within `timeout_s`."""
        old = self.sock.gettimeout()
        self.sock.settimeout(timeout_s)
        try:
            while True:
                chunk = self.sock.recv(1 << 16)
                if not chunk:
                    return True
                self._buf += chunk
        except socket.timeout:
            return False
        except OSError:
            return True
        finally:
            self.sock.settimeout(old)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "RawClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
