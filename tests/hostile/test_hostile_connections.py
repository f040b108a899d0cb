"""Hostile clients against a real broker's connections (issue 34, items 7, 8, 9, 11): each flood
runs with bounded counts while a well-behaved client, on a connection of its own, produces a batch
and fetches it back; that round trip must complete within WELL_BEHAVED_S (seconds, where it took
tens of seconds or never completed before).

- Partly received frames count against `queued.max.request.bytes`: connections that announce
  large frames and send part of them hold no more memory than the budget (item 7).
- `max.connections.per.ip` (and its overrides) closes one address's connections over its limit
  right after accept; others still connect (item 8). An idle connection costs little memory, and
  the memory of closed connections goes back (item 8).
- A client that never reads its fetch responses holds a bounded number of segment descriptors,
  and gives them back when it goes (item 9).
- Slowloris: a request must arrive whole within `request.read.timeout.ms`; an idle connection
  between requests still lives by `connections.max.idle.ms` (item 11).
"""
from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator

import msgpack
import pytest

from common.errors import NONE
from broker.process import BrokerProcess
from protocol import ApiKey
from segment_format import batch_body, record
from tests.waiting import wait_until

WELL_BEHAVED_S = 5.0  # a well-behaved client's produce + fetch round trip during a flood
WAIT_S = 30.0  # generous bound for conditions the broker reaches by itself
TOPIC = "calm"
TS = 1_700_000_000_000
MiB = 1 << 20


# -- helpers ------------------------------------------------------------------------------------


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def connections(broker: BrokerProcess) -> int:
    return int(broker.metrics()["pymq_connections"])


def request_bytes_used(broker: BrokerProcess) -> float:
    return broker.metrics()['pymq_backpressure_used_bytes{budget="queued.max.request.bytes"}']


def connect(port: int, source: str = "127.0.0.1", rcvbuf: int | None = None, timeout_s: float = 10.0) -> socket.socket:
    """A TCP connection to the broker from `source` (any 127/8 address is this machine's)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # before the handshake: fixes the window
    sock.settimeout(timeout_s)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def frame(api_key: int, control: dict, payload: bytes = b"", correlation_id: int = 1,
          size: int | None = None) -> bytes:
    packed = msgpack.packb(control, use_bin_type=True)
    size = 12 + len(packed) + len(payload) if size is None else size
    return struct.pack(">ihhii", size, api_key, 0, correlation_id, len(packed)) + packed + payload


def read_response(sock: socket.socket) -> tuple[int, dict, bytes]:
    """(correlation_id, control, payload) of the next response; ConnectionError on EOF."""
    def exactly(n: int) -> bytes:
        data = bytearray()
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed by the broker")
            data += chunk
        return bytes(data)

    (size,) = struct.unpack(">i", exactly(4))
    body = exactly(size)
    correlation_id, control_length = struct.unpack_from(">ii", body)
    return correlation_id, msgpack.unpackb(body[8:8 + control_length], raw=False), body[8 + control_length:]


def request(sock: socket.socket, api_key: int, control: dict, payload: bytes = b"") -> tuple[dict, bytes]:
    sock.sendall(frame(api_key, control, payload))
    _, reply, data = read_response(sock)
    return reply, data


def fetch_control(topic: str, partitions: int, max_bytes: int = 1 << 20) -> dict:
    return {"max_wait_ms": 0, "min_bytes": 0, "max_bytes": max_bytes,
            "topics": [{"name": topic, "partitions": [{"partition": p, "fetch_offset": 0, "max_bytes": max_bytes}
                                                      for p in range(partitions)]}]}


def produce(sock: socket.socket, topic: str, partition: int, values: list[bytes]) -> int:
    """Append `values` with acks=1; the base offset."""
    data = bytes(record.encode_batch(batch_body.make_body(values, timestamps_ms=TS)))
    reply, _ = request(sock, ApiKey.PRODUCE, {"acks": 1, "topics": [
        {"name": topic, "partitions": [{"partition": partition, "size": len(data)}]}]}, data)
    answer = reply["topics"][0]["partitions"][0]
    assert answer["error_code"] == NONE, reply
    return answer["base_offset"]


def create_topic(port: int, name: str, partitions: int = 1) -> None:
    with contextlib.closing(connect(port)) as sock:
        reply, _ = request(sock, ApiKey.CREATE_TOPICS, {"topics": [{"name": name, "num_partitions": partitions}]})
        assert reply["topics"][0]["error_code"] == NONE, reply


def round_trip(port: int, source: str = "127.0.0.1") -> float:
    """A well-behaved client: connect, produce one record to TOPIC, fetch it back; the seconds taken."""
    started = time.monotonic()
    value = f"calm-{started}".encode()
    with contextlib.closing(connect(port, source, timeout_s=WAIT_S)) as sock:
        offset = produce(sock, TOPIC, 0, [value])
        control = fetch_control(TOPIC, 1)
        control["topics"][0]["partitions"][0]["fetch_offset"] = offset
        reply, payload = request(sock, ApiKey.FETCH, control)
        entry = reply["topics"][0]["partitions"][0]
        assert entry["error_code"] == NONE, reply
        (_, header), *_ = record.iter_batches(payload[:entry["size"]])
        assert record.decode_body(payload, header, 0).column("value").to_pylist()[offset - header.base_offset] == value
    return time.monotonic() - started


def assert_served(port: int, source: str = "127.0.0.1") -> None:
    took = round_trip(port, source)
    assert took < WELL_BEHAVED_S, f"a well-behaved produce + fetch took {took:.1f} s during the flood"


def is_closed(sock: socket.socket, timeout_s: float) -> bool:
    """Whether the broker closed `sock` (EOF or reset) within `timeout_s`; bytes read are dropped."""
    sock.settimeout(timeout_s)
    try:
        while sock.recv(1 << 16):
            pass
        return True
    except socket.timeout:
        return False
    except OSError:
        return True


@pytest.fixture(params=["uvloop", "asyncio"])
def started(broker_factory, request) -> Iterator[Callable[..., BrokerProcess]]:
    """start(**configs) -> a running broker (on either event loop) with TOPIC created and one
    well-behaved round trip done."""
    def start(**overrides: object) -> BrokerProcess:
        broker = broker_factory(**{"event.loop": request.param, **overrides}).start()
        create_topic(broker.port, TOPIC)
        round_trip(broker.port)
        return broker

    yield start


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    """Sockets a test opens; all closed at teardown."""
    opened: list[socket.socket] = []
    yield opened
    for sock in opened:
        sock.close()


# -- item 7: partly received frames count against queued.max.request.bytes ----------------------


@pytest.mark.slow
def test_partly_received_large_frames_hold_no_more_than_queued_max_request_bytes(started, sockets):
    """8 connections each announce a 24 MiB produce and send 16 MiB of it, under a 48 MiB budget:
    the broker reads only the frames the budget has room for (2), so its memory grows by about
    32 MiB, not 128 MiB; the reservations fill the budget, yet a well-behaved client is served
    meanwhile (frames announced and not sent do not stop everyone's reads)."""
    broker = started(**{"queued.max.request.bytes": 48 * MiB})
    announced, sent = 24 * MiB, 16 * MiB
    baseline = rss_bytes(broker.pid)
    body = bytes(sent)
    header = frame(ApiKey.PRODUCE, {"acks": 1, "topics": []}, size=announced)

    def send_part(sock: socket.socket) -> None:
        with contextlib.suppress(OSError):  # a frame the broker does not read times out, as intended
            sock.sendall(header + body)

    for _ in range(8):
        sock = connect(broker.port, timeout_s=3.0)
        sockets.append(sock)
    senders = [threading.Thread(target=send_part, args=(sock,)) for sock in sockets]
    for sender in senders:
        sender.start()
    wait_until(lambda: request_bytes_used(broker) >= 2 * (announced - 16), WAIT_S, "two frames reserved")
    assert_served(broker.port)
    for sender in senders:
        sender.join(WAIT_S)
    grown = rss_bytes(broker.pid) - baseline
    assert grown < 64 * MiB, f"the broker grew by {grown / MiB:.0f} MiB holding partly received frames"
    assert_served(broker.port)
    for sock in sockets:
        sock.close()
    wait_until(lambda: request_bytes_used(broker) == 0, WAIT_S, "the reservations of closed connections given back")


@pytest.mark.slow
def test_a_large_frame_waits_for_room_in_the_budget_and_is_read_when_it_frees(started, sockets):
    """Honest large produces are not lost to the reservation: A reserves 1 MiB of a 1.5 MiB budget
    and sends half; B's whole 1 MiB produce waits at its header (nothing of it is reserved); once
    A's frame is complete, both are answered and stored."""
    broker = started(**{"queued.max.request.bytes": 3 * MiB // 2})
    frames = []
    for name in "AB":
        data = bytes(record.encode_batch(batch_body.make_body([name.encode() * (MiB - 4096)], timestamps_ms=TS)))
        frames.append(frame(ApiKey.PRODUCE, {"acks": 1, "topics": [
            {"name": TOPIC, "partitions": [{"partition": 0, "size": len(data)}]}]}, data))
    a, b = connect(broker.port, timeout_s=WAIT_S), connect(broker.port, timeout_s=WAIT_S)
    sockets.extend([a, b])
    half = len(frames[0]) // 2
    a.sendall(frames[0][:half])
    wait_until(lambda: request_bytes_used(broker) >= len(frames[0]) - 64, WAIT_S, "A's frame reserved")
    sender = threading.Thread(target=b.sendall, args=(frames[1],))
    sender.start()
    assert is_closed(b, 0.5) is False  # B is not answered (nor closed) while A holds the room
    assert request_bytes_used(broker) < 2 * MiB
    a.sendall(frames[0][half:])
    sender.join(WAIT_S)
    for sock in (a, b):
        sock.settimeout(WAIT_S)
        _, reply, _ = read_response(sock)
        assert reply["topics"][0]["partitions"][0]["error_code"] == NONE, reply
    assert_served(broker.port)


# -- item 8: connections per address, and their memory --------------------------------------------


def test_max_connections_per_ip_closes_one_address_flood_and_serves_the_others(started, sockets):
    """100 connections from 127.0.0.1 (limit 40) and 60 from 127.0.0.3 (override 50): the ones over
    each limit are closed right after accept; a client from 127.0.0.2 still connects and is served."""
    broker = started(**{"max.connections": 200, "max.connections.per.ip": 40,
                        "max.connections.per.ip.overrides": "127.0.0.3:50"})
    for source, count, limit in [("127.0.0.1", 100, 40), ("127.0.0.3", 60, 50)]:
        flood = [connect(broker.port, source) for _ in range(count)]
        sockets.extend(flood)
        for sock in flood:
            sock.sendall(frame(ApiKey.API_VERSIONS, {}))
        answered = 0
        for sock in flood:
            with contextlib.suppress(ConnectionError, OSError):
                read_response(sock)
                answered += 1
        assert answered == limit, f"{answered} of {count} connections from {source} served, limit {limit}"
    assert_served(broker.port, "127.0.0.2")
    wait_until(lambda: connections(broker) == 90, WAIT_S, "40 + 50 connections open once the served client left")


def test_idle_connections_cost_little_memory_and_give_it_back_when_closed(started, sockets):
    """300 connections, each answered one request and then idle: each costs under 64 KiB of the
    broker's RSS, and once they close the broker keeps under 4 MiB of what they took."""
    broker = started()
    count = 300
    for _ in range(3):  # warm up what any connection allocates once (code paths, the loop's structures)
        with contextlib.closing(connect(broker.port)) as sock:
            request(sock, ApiKey.API_VERSIONS, {})
    wait_until(lambda: connections(broker) == 0, WAIT_S, "the warm-up connections closed")
    baseline = rss_bytes(broker.pid)
    for _ in range(count):
        sock = connect(broker.port)
        sockets.append(sock)
        request(sock, ApiKey.API_VERSIONS, {})
    per_connection = (rss_bytes(broker.pid) - baseline) / count
    for sock in sockets:
        sock.close()
    wait_until(lambda: connections(broker) == 0, WAIT_S, "the broker saw every connection close")
    kept = rss_bytes(broker.pid) - baseline
    print(f"per connection {per_connection / 1024:.0f} KiB, kept after close {kept / MiB:.1f} MiB")
    assert per_connection < 64 << 10, f"an idle connection costs {per_connection / 1024:.0f} KiB"
    assert kept < 4 * MiB, f"{kept / MiB:.0f} MiB kept after {count} connections closed"


# -- item 9: responses queued for a client that never reads -----------------------------------------


def test_a_client_that_never_reads_holds_bounded_descriptors_and_returns_them(started, sockets):
    """10 connections with 4 KiB receive windows each pipeline 1,000 fetches of 4 partitions and
    never read: the descriptors their queued responses hold stay within queued.max.response.descriptors
    (200) and every one is given back when they close; a well-behaved client is served meanwhile."""
    limit = 200
    broker = started(**{"queued.max.response.descriptors": limit})
    create_topic(broker.port, "wide", partitions=4)
    with contextlib.closing(connect(broker.port)) as sock:
        for p in range(4):
            produce(sock, "wide", p, [bytes(1000)] * 200)
    baseline = open_descriptors(broker.pid)
    fetches = b"".join(frame(ApiKey.FETCH, fetch_control("wide", 4), correlation_id=i) for i in range(1000))

    def flood(sock: socket.socket) -> None:
        with contextlib.suppress(OSError):  # the broker stops reading: the rest of the send times out
            sock.sendall(fetches)

    for _ in range(10):
        sockets.append(connect(broker.port, rcvbuf=4096, timeout_s=3.0))
    senders = [threading.Thread(target=flood, args=(sock,)) for sock in sockets]
    for sender in senders:
        sender.start()
    assert_served(broker.port)
    for sender in senders:
        sender.join(WAIT_S)
    held = open_descriptors(broker.pid) - baseline
    # Past the limit: a response each (4 ranges), and each connection's socket and the dup it sends on.
    assert held <= limit + 10 * (4 + 2) + 10, f"{held} descriptors held for clients that do not read"
    assert_served(broker.port)
    for sock in sockets:
        sock.close()
    wait_until(lambda: connections(broker) == 0, WAIT_S, "the broker saw every connection close")
    wait_until(lambda: open_descriptors(broker.pid) <= baseline, WAIT_S, "every descriptor given back")


# -- item 11: slowloris ---------------------------------------------------------------------------


def test_a_request_that_does_not_arrive_whole_within_request_read_timeout_closes_its_connection(started, sockets):
    """100 connections send a request a byte every 0.2 s (each byte used to reset the idle timer):
    with request.read.timeout.ms=2000 the broker closes them all; a well-behaved client is served
    meanwhile, and a connection idle between requests stays open (connections.max.idle.ms)."""
    broker = started(**{"request.read.timeout.ms": 2000})
    idle = connect(broker.port)
    request(idle, ApiKey.API_VERSIONS, {})
    slow = [connect(broker.port) for _ in range(100)]
    sockets.extend([idle, *slow])
    data = frame(ApiKey.API_VERSIONS, {}) * 10
    closed: set[int] = set()
    deadline = time.monotonic() + WAIT_S
    served = False
    for position in range(len(data)):
        for i, sock in enumerate(slow):
            if i not in closed:
                try:
                    sock.sendall(data[position:position + 1])
                except OSError:
                    closed.add(i)
        if not served:
            assert_served(broker.port)
            served = True
        if len(closed) == len(slow) or time.monotonic() > deadline:
            break
        time.sleep(0.2)  # not a wait: the slow peers send a byte every 200 ms
    still_open = [i for i, sock in enumerate(slow) if i not in closed and not is_closed(sock, 0.5)]
    assert not still_open, f"{len(still_open)} slow connections still open after {WAIT_S} s"
    request(idle, ApiKey.API_VERSIONS, {})  # the idle one was not closed
