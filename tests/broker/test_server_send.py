"""How a broker connection sends fetch responses with segment ranges (broker/server.py, the send
side): over both event loops, with sendfile on a dup of the socket. Real broker processes over
TCP, payloads compared byte for byte with the segment file on disk; in-process tests over a real
socket pair prove that the default path never reads a range into memory and that a range waits
for the bytes the transport still holds."""
from __future__ import annotations

import asyncio
import fcntl
import io
import os
import socket
import struct
import termios
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import uvloop

import protocol
from client import Admin, Producer
from common.errors import OffsetOutOfRangeError
from broker.config import BrokerConfig
from broker.log import FetchSlice
from protocol import ApiKey
from broker.connection import Connection
from broker.server import Broker
from tests.waiting import wait_until

LOOPS = pytest.mark.parametrize("event_loop", ["uvloop", "asyncio"])
TOPIC = "wide"
FIRST_SEGMENT = "00000000000000000000.log"


def load(bootstrap: str, records: int, start: int = 0, **configs: object) -> None:
    """`records` values of 200 bytes (distinct per record: a response out of place cannot match)."""
    if start == 0:
        with Admin(bootstrap) as admin:
            admin.create_topic(TOPIC, partitions=1, configs=configs)
    ids = np.arange(start, start + records)
    values = pa.array([i.to_bytes(8, "big") * 25 for i in ids.tolist()], pa.binary())
    with Producer(bootstrap, linger_ms=5, batch_size=256 * 1024) as producer:
        producer.send_batch(TOPIC, pa.table({"value": values}), partition=0)
        producer.flush()


def fetch(max_bytes: int) -> dict:
    """A Fetch of up to `max_bytes` from offset 0, answered at once."""
    return {"max_wait_ms": 0, "min_bytes": 0, "max_bytes": max_bytes,
            "topics": [{"name": TOPIC, "partitions": [{"partition": 0, "fetch_offset": 0, "max_bytes": max_bytes}]}]}


def small_receive_buffer(raw_client, port: int):
    """A RawClient whose socket has a 4 KB receive buffer (set before the handshake: the window
    is fixed then), so the broker's sends fill up while it does not read."""
    client = raw_client(port, timeout_s=30.0)
    client.sock.close()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(30.0)
    sock.connect(("127.0.0.1", port))
    client.sock = sock
    return client


def wait_filled(client) -> None:
    """Wait until the broker's responses fill `client`'s small receive buffer (2 KB of the 4 KB
    unread): from then on the broker's sends to it wait, which is what the tests need."""
    def unread() -> int:
        return struct.unpack("i", fcntl.ioctl(client.sock.fileno(), termios.FIONREAD, b"\0" * 4))[0]

    wait_until(lambda: unread() >= 2048, 30, "the broker's responses fill the slow reader's receive buffer")


def check_fetch(client, sent: int, file_bytes: bytes, at_least: int, out_of_range_ok: bool = False) -> bool:
    """The next response answers `sent` with a prefix of the segment file of `at_least` bytes or
    more (True); with `out_of_range_ok`, OFFSET_OUT_OF_RANGE and no records pass too (False)."""
    correlation_id, control, payload = client.recv_response()
    assert correlation_id == sent
    code = control["topics"][0]["partitions"][0]["error_code"]
    if out_of_range_ok and code == OffsetOutOfRangeError.code:
        assert not payload
        return False
    assert code == 0
    assert len(payload) >= at_least
    assert payload == file_bytes[:len(payload)], f"response {sent}: payload differs from the segment file"
    return True


@LOOPS
def test_pipelined_large_fetches_and_metadata_come_back_in_order_byte_exact(broker_factory, raw_client, event_loop):
    """24 pipelined fetches of 0.5-3 MB from offset 0, a Metadata request between each, on one
    connection whose reader is slow to start: every response comes back in request order and
    each fetch payload is exactly the segment file's first bytes (no byte lost, doubled or
    overtaken by a response written through the transport)."""
    broker = broker_factory(**{"event.loop": event_loop}).start()
    load(broker.bootstrap, 20_000)  # ~4 MB in one segment
    file_bytes = (broker.log_dir / f"{TOPIC}-0" / FIRST_SEGMENT).read_bytes()
    client = small_receive_buffer(raw_client, broker.port)
    sizes = [(1 + i % 6) * 512 * 1024 for i in range(24)]
    frames, expected = [], []
    for size in sizes:
        fetch_id, frame = client.frame(ApiKey.FETCH, fetch(size))
        metadata_id, metadata = client.frame(ApiKey.METADATA, {"topics": [TOPIC]})
        frames += [frame, metadata]
        expected += [(fetch_id, size), (metadata_id, None)]
    client.send_raw(b"".join(frames))
    wait_filled(client)
    for sent, size in expected:
        if size is None:
            correlation_id, control, _ = client.recv_response()
            assert (correlation_id, control["topics"][0]["name"]) == (sent, TOPIC)
        else:
            check_fetch(client, sent, file_bytes, min(size, len(file_bytes)) - 256 * 1024)


@LOOPS
def test_a_slow_reader_does_not_stall_other_connections(broker_factory, raw_client, event_loop):
    """A client with a tiny receive buffer pipelines 8 fetches of the whole 4 MB log and reads nothing: another
    connection still gets its fetches and metadata answered at once, and the slow reader then
    receives all of its responses whole."""
    broker = broker_factory(**{"event.loop": event_loop}).start()
    load(broker.bootstrap, 20_000)
    file_bytes = (broker.log_dir / f"{TOPIC}-0" / FIRST_SEGMENT).read_bytes()
    slow = small_receive_buffer(raw_client, broker.port)
    sent = [slow.send_frame(ApiKey.FETCH, fetch(8 << 20)) for _ in range(8)]
    wait_filled(slow)
    other = raw_client(broker.port, timeout_s=5.0)
    for _ in range(5):
        started = time.monotonic()
        check_fetch(other, other.send_frame(ApiKey.FETCH, fetch(8 << 20)), file_bytes, len(file_bytes))
        reply, _ = other.request(ApiKey.METADATA, {"topics": [TOPIC]})
        assert reply["topics"][0]["name"] == TOPIC
        assert time.monotonic() - started < 5.0
    for correlation_id in sent:
        check_fetch(slow, correlation_id, file_bytes, len(file_bytes))


@LOOPS
def test_retention_deleting_a_segment_under_a_pending_send_still_sends_it_whole(broker_factory, raw_client, event_loop):
    """Fetches of the first segment wait behind a reader that does not read while retention deletes
    that segment: once the client reads, every response built before the deletion is the deleted
    file's bytes, whole (the range owns a descriptor), one built after it is OFFSET_OUT_OF_RANGE,
    and the connection goes on serving."""
    broker = broker_factory(**{"event.loop": event_loop, "log.retention.check.interval.ms": 100,
                               "file.delete.delay.ms": 0}).start()
    load(broker.bootstrap, 10_000, **{"segment.bytes": 1 << 20, "retention.bytes": 2 << 20})
    first = broker.log_dir / f"{TOPIC}-0" / FIRST_SEGMENT
    file_bytes = first.read_bytes()
    slow = small_receive_buffer(raw_client, broker.port)
    sent = [slow.send_frame(ApiKey.FETCH, fetch(1 << 20)) for _ in range(6)]
    wait_filled(slow)
    loader = threading.Thread(target=load, args=(broker.bootstrap, 20_000, 10_000))
    loader.start()
    loader.join(60)
    wait_until(lambda: not first.exists(), 30, "retention deletes the first segment")
    # The first fetch was answered before the deletion (its response fills the reader's buffer).
    # The broker stops reading a connection whose responses wait (backpressure), so the later
    # fetches may have been read only after it: those answer OFFSET_OUT_OF_RANGE, and from the
    # first such one on, every one does.
    at_least = min(len(file_bytes), 1 << 20) - 256 * 1024
    check_fetch(slow, sent[0], file_bytes, at_least)
    answered = [check_fetch(slow, correlation_id, file_bytes, at_least, out_of_range_ok=True) for correlation_id in sent[1:]]
    assert answered == sorted(answered, reverse=True), f"records after an out-of-range answer: {answered}"
    reply, _ = slow.request(ApiKey.METADATA, {"topics": [TOPIC]})
    assert reply["topics"][0]["name"] == TOPIC


def open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="counts the broker's descriptors in /proc")
@LOOPS
@pytest.mark.slow
def test_a_connection_lost_mid_send_releases_its_ranges_and_socket(broker_factory, raw_client, event_loop):
    """A client pipelines 8 fetches of the whole log, reads 100 KB of the first and hangs up: the
    broker closes every descriptor the sends held (queued ranges, the socket's dup) and serves on."""
    broker = broker_factory(**{"event.loop": event_loop}).start()
    load(broker.bootstrap, 20_000)
    file_bytes = (broker.log_dir / f"{TOPIC}-0" / FIRST_SEGMENT).read_bytes()
    other = raw_client(broker.port)
    check_fetch(other, other.send_frame(ApiKey.FETCH, fetch(8 << 20)), file_bytes, len(file_bytes))
    baseline = open_descriptors(broker.pid)
    slow = small_receive_buffer(raw_client, broker.port)
    for _ in range(8):
        slow.send_frame(ApiKey.FETCH, fetch(8 << 20))
    wait_filled(slow)
    assert open_descriptors(broker.pid) > baseline  # the connection, its pending ranges
    slow._read_exactly(100_000)
    slow.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # a reset, not a FIN
    slow.close()
    wait_until(lambda: open_descriptors(broker.pid) <= baseline, 10, "the broker closes the lost connection's descriptors")
    assert open_descriptors(broker.pid) == baseline
    check_fetch(other, other.send_frame(ApiKey.FETCH, fetch(8 << 20)), file_bytes, len(file_bytes))


async def send_and_receive(tmp_path: Path, event_loop: str, parts: list[FetchSlice], before: bytes = b"") -> bytes:
    """The bytes a peer receives (header left out) for `before`, written through the transport, then one
    response with `parts`, sent by a Connection of a default-configured (not started) broker."""
    broker = Broker(BrokerConfig.load(overrides={"log.dir": str(tmp_path / "data"), "event.loop": event_loop}))
    ours, theirs = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # the socket takes little at once
    theirs.setblocking(False)
    loop = asyncio.get_running_loop()
    connection = Connection(broker)
    await loop.connect_accepted_socket(lambda: connection, ours)
    header = protocol.encode_response(7, {"error_code": 0}, sum(p.size for p in parts))
    connection.transport.write(before)
    connection._respond(7, ({"error_code": 0}, list(parts)))
    received = bytearray()
    try:  # before the loop runs again (and the transport sends more): the socket has room at once
        while chunk := theirs.recv(1 << 16):
            received += chunk
    except BlockingIOError:
        pass
    while len(received) < len(before) + len(header) + sum(p.size for p in parts):
        chunk = await asyncio.wait_for(loop.sock_recv(theirs, 1 << 16), 10.0)
        assert chunk, "the connection closed before the response was whole"
        received += chunk
    connection.transport.close()
    theirs.close()
    assert received[len(before):len(before) + len(header)] == header
    return bytes(received[:len(before)] + received[len(before) + len(header):])


@LOOPS
def test_the_default_path_sends_segment_ranges_without_reading_them_into_memory(tmp_path, monkeypatch, event_loop):
    """With default configs, 3 MB of segment ranges go out whole under either event loop although
    reading a range into memory (FetchSlice.read_bytes, the pread path) fails: they are sent with
    sendfile, not copied on the loop."""
    data = os.urandom(3 << 20)
    path = tmp_path / "segment.log"
    path.write_bytes(data)

    def read_bytes(self: FetchSlice) -> bytes:
        raise AssertionError("a segment range was read into memory on the default path")

    monkeypatch.setattr(FetchSlice, "read_bytes", read_bytes)
    parts = [FetchSlice(io.FileIO(path, "r"), 0, 1 << 20, 0), FetchSlice(io.FileIO(path, "r"), 1 << 20, 2 << 20, 0)]
    run = uvloop.run if event_loop == "uvloop" else asyncio.run
    assert run(send_and_receive(tmp_path, event_loop, parts)) == data
    assert all(p.file.closed for p in parts)  # each range's descriptor is released once sent


@LOOPS
def test_a_range_is_sent_after_the_bytes_the_transport_still_holds(tmp_path, event_loop):
    """32 KB written through the transport (more than the socket takes at once, less than makes the
    transport pause writing: it keeps the rest) and then a response with a 1 MB range: the peer
    gets the 32 KB, then the response."""
    data = os.urandom(1 << 20)
    path = tmp_path / "segment.log"
    path.write_bytes(data)
    before = os.urandom(32 << 10)
    parts = [FetchSlice(io.FileIO(path, "r"), 0, 1 << 20, 0)]
    run = uvloop.run if event_loop == "uvloop" else asyncio.run
    assert run(send_and_receive(tmp_path, event_loop, parts, before)) == before + data
