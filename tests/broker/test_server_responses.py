"""How a connection writes responses whose segment ranges cannot be sent as framed: a response too
large for the int32 frame size is answered MESSAGE_TOO_LARGE (not a struct.error), and a range
that comes back short (its file was truncated under the read) aborts the connection, since the
frame header already promised its size. Real sockets (a socketpair) and real files; the broker
object is built but not started."""
from __future__ import annotations

import asyncio
import io
import socket
from pathlib import Path

import pytest

import protocol
from broker.config import BrokerConfig
from common.errors import MessageTooLargeError
from broker.log import FetchSlice
from broker.connection import Connection
from broker.server import Broker


async def respond(tmp_path: Path, zero_copy: bool, parts: list[FetchSlice]) -> bytes:
    """Everything the peer receives after one `_respond` (until the connection closes or idles)."""
    broker = Broker(BrokerConfig.load(overrides={"log.dir": str(tmp_path / "data"), "zero.copy": zero_copy,
                                                 "event.loop": "asyncio"}))
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    loop = asyncio.get_running_loop()
    connection = Connection(broker)
    await loop.connect_accepted_socket(lambda: connection, ours)
    connection._respond(7, ({"error_code": 0, "topics": []}, list(parts)))
    received = bytearray()
    while True:
        try:
            chunk = await asyncio.wait_for(loop.sock_recv(theirs, 1 << 16), 1.0)
        except (TimeoutError, ConnectionResetError):
            break
        if not chunk:
            break
        received += chunk
    connection.transport.close()
    theirs.close()
    return bytes(received)


@pytest.fixture
def segment_file(tmp_path: Path) -> Path:
    path = tmp_path / "segment.log"
    path.write_bytes(b"x" * 1000)
    return path


@pytest.mark.parametrize("zero_copy", [False, True], ids=["pread", "sendfile"])
def test_a_response_too_large_to_frame_is_message_too_large(tmp_path, segment_file, zero_copy):
    huge = FetchSlice(io.FileIO(segment_file, "r"), 0, 3 << 30, 0)  # a 3 GiB range: past int32
    received = asyncio.run(respond(tmp_path, zero_copy, [huge]))
    (response,) = list(protocol.ResponseDecoder(1 << 20).feed(received))
    assert response.correlation_id == 7
    assert response.control["error_code"] == MessageTooLargeError.code
    assert huge.file.closed  # the range's descriptor is released, not leaked


@pytest.mark.parametrize("zero_copy", [False, True], ids=["pread", "sendfile"])
def test_a_range_that_comes_back_short_aborts_the_connection(tmp_path, segment_file, zero_copy):
    """The slice promises 2,000 bytes of a 1,000-byte file (truncated after the read was planned):
    the peer must not get a frame whose size lies; it gets a closed connection and retries."""
    short = FetchSlice(io.FileIO(segment_file, "r"), 0, 2000, 0)
    received = asyncio.run(respond(tmp_path, zero_copy, [short]))
    header = protocol.framing.RESPONSE_HEADER
    if len(received) >= header.size:
        size = header.unpack_from(received)[0]
        assert len(received) < 4 + size, "a whole frame arrived although its range was short"
    assert short.file.closed
