"""Backpressure over a real broker on a slow disk (benchmarks/slow_disk_broker.py): the event loop
never waits for the disk, and memory is bounded in bytes.

- A full log writer queue mutes only the connections that produce: another connection's
  Metadata and ApiVersions are answered at once, the producer's queued bytes stay within one
  request of the limit, and it resumes when the queue drains; every acked record is stored.
- queued.max.request.bytes: while the unanswered requests hold it, no connection is read (a
  Metadata waits for the held produce's answer); a produce larger than the whole limit is still
  admitted when nothing else is held.
"""
from __future__ import annotations

import re
import socket
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from common.errors import NONE
from broker.process import BrokerProcess
from protocol import ApiKey
from tests.helpers.raw_produce import batch, create_topic, produce_frame, send_pipelined, values_of
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
SLOW_S = 2.0  # how long the slow disk takes for one segment write or .log fsync


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def slow_broker(tmp_path):
    """start(slow pwrite ms, slow .log fsync ms, **configs) -> (BrokerProcess, metrics port)."""
    started: list[BrokerProcess] = []

    def start(pwrite_ms: float, fsync_ms: float, **overrides: object) -> tuple[BrokerProcess, int]:
        metrics_port = free_port()
        process = BrokerProcess(tmp_path / "broker", {"metrics.port": metrics_port, **overrides}, cwd=REPO,
                                module="benchmarks.slow_disk_broker",
                                env={"PYMQ_SLOW_PWRITE_MS": str(pwrite_ms), "PYMQ_SLOW_FSYNC_MS": str(fsync_ms)})
        started.append(process)
        return process.start(), metrics_port

    yield start
    for process in started:
        process.kill()


def metric(port: int, name: str, labels: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    found = re.search(rf"^{re.escape(name)}{{{re.escape(labels)}}} (\S+)$", text, re.M)
    assert found, f"{name}{{{labels}}} not in the scrape"
    return float(found.group(1))


def timed_request(client, api_key: int, control: dict) -> tuple[dict, float]:
    started = time.monotonic()
    reply, _ = client.request(api_key, control)
    return reply, time.monotonic() - started


@pytest.mark.slow
def test_full_writer_queue_mutes_the_producer_and_serves_other_connections(slow_broker, raw_client):
    """Each segment write takes SLOW_S and the writer queue holds one byte, so the first queued
    produce spends it. Before the fix, the next produce blocked the event loop for a whole write
    (every connection waited SLOW_S); now the producer alone stops being read."""
    broker, metrics_port = slow_broker(SLOW_S * 1000, 0, **{"log.writer.offload.bytes": 0,
                                                           "log.writer.queued.max.bytes": 1})
    producer, other = raw_client(broker.port, timeout_s=60), raw_client(broker.port, timeout_s=60)
    create_topic(other, "slow", 1)
    frames = [produce_frame(producer, [("slow", 0, batch(f"b{i}", 64, 1024))]) for i in range(3)]
    batch_bytes = max(len(data) for _, data in frames)
    replies: dict[int, dict] = {}
    sender = threading.Thread(target=lambda: replies.update(send_pipelined(producer, frames)))
    sender.start()
    wait_until(lambda: metric(metrics_port, "pymq_backpressure_used_bytes", 'budget="log writer queue"') > 0, 30,
               "the first write under way and the writer queue spent")
    latencies = []
    for api_key, control in [(ApiKey.METADATA, {"topics": None}), (ApiKey.API_VERSIONS, {})] * 3:
        reply, elapsed = timed_request(other, api_key, control)
        assert reply.get("error_code", NONE) == NONE, reply
        latencies.append(elapsed)
        time.sleep(0.3)  # not a wait: the six probes are spread over the slow writes
    sender.join(timeout=60)
    assert not sender.is_alive(), "the producer was never resumed"
    assert max(latencies) < SLOW_S / 2, f"other connections waited for the disk: {latencies}"
    for cid, _ in frames:
        assert replies[cid]["topics"][0]["partitions"][0]["error_code"] == NONE, replies[cid]
    # Muted: the producer's later requests stayed in its socket instead of the writer's queue
    # (one request past the limit may be read with the one that spent it).
    peak = metric(metrics_port, "pymq_backpressure_peak_bytes", 'budget="log writer queue"')
    assert peak <= 2 * batch_bytes, (peak, batch_bytes)
    assert metric(metrics_port, "pymq_backpressure_used_bytes", 'budget="log writer queue"') == 0
    assert values_of(other, "slow", 0) == [f"b{i}-{j}" for i in range(3) for j in range(64)]


@pytest.mark.slow
def test_queued_max_request_bytes_stops_reading_every_connection_until_answered(slow_broker, raw_client):
    """A produce waiting SLOW_S for its fsync (flush.messages=1) holds more than
    queued.max.request.bytes: it is admitted though larger than the limit (nothing else is held),
    and no connection is read until it is answered, so a Metadata sent meanwhile on another
    connection is answered after it."""
    limit = 64 << 10
    broker, metrics_port = slow_broker(0, SLOW_S * 1000, **{"queued.max.request.bytes": limit})
    producer, other = raw_client(broker.port, timeout_s=60), raw_client(broker.port, timeout_s=60)
    reply, _ = other.request(ApiKey.CREATE_TOPICS, {"topics": [{"name": "synced", "num_partitions": 1,
                                                                "configs": {"flush.messages": "1"}}]})
    assert reply["topics"][0]["error_code"] == NONE, reply
    cid, data = produce_frame(producer, [("synced", 0, batch("big", 128, 1024))])
    assert len(data) > limit
    producer.send_raw(data)
    wait_until(lambda: metric(metrics_port, "pymq_backpressure_used_bytes", 'budget="queued.max.request.bytes"') > 0,
               30, "the produce read and waiting for its fsync")
    answered: dict[str, float] = {}

    def produce_answer() -> None:
        correlation_id, control, _ = producer.recv_response()
        assert correlation_id == cid and control["topics"][0]["partitions"][0]["error_code"] == NONE, control
        answered["produce"] = time.monotonic()

    waiter = threading.Thread(target=produce_answer)
    waiter.start()
    reply, _ = other.request(ApiKey.METADATA, {"topics": None})
    answered["metadata"] = time.monotonic()
    waiter.join(timeout=60)
    assert "produce" in answered, "the produce was not answered"
    # Both answers leave the broker in the same loop iteration (the produce's first); the two
    # client threads may note them a little apart. Before the fix Metadata came SLOW_S earlier.
    assert answered["metadata"] >= answered["produce"] - 0.2, "a connection was read while the request bytes were spent"
    assert metric(metrics_port, "pymq_backpressure_peak_bytes", 'budget="queued.max.request.bytes"') >= len(data) - 1024
    assert metric(metrics_port, "pymq_backpressure_used_bytes", 'budget="queued.max.request.bytes"') == 0
    # Reading resumed: the same connections are served at once again.
    assert timed_request(producer, ApiKey.METADATA, {"topics": None})[1] < SLOW_S
    assert values_of(other, "synced", 0) == [f"big-{j}" for j in range(128)]


@pytest.mark.slow
@pytest.mark.parametrize("event_loop", ["uvloop", "asyncio"])
@pytest.mark.parametrize("frames, records", [(300, 40), (24, 1000)], ids=["40KB-frames", "1MB-frames"])
def test_a_pipelining_producer_muted_by_the_request_budget_keeps_its_connection(slow_broker, raw_client, event_loop,
                                                                                frames, records):
    """A producer pipelines 12 MB of produces into a 2 MiB queued.max.request.bytes while each
    fsync takes 50 ms: frames of ~40 KB (many wait in the connection's scratch buffer) or ~1 MB
    (each waits at its header for room in the budget, its body filling the scratch buffer). The
    connection is muted and resumed again and again; every produce is answered and stored.
    Before the fix the socket was resumed before the held frames were delivered; uvloop read
    first, into a scratch buffer with no room left, and the empty buffer closed the connection
    ("unhandled error (or an empty buffer) in get_buffer()")."""
    broker, _ = slow_broker(0, 50, **{"queued.max.request.bytes": 2 << 20, "event.loop": event_loop})
    producer = raw_client(broker.port, timeout_s=120)
    create_topic(producer, "piped", configs={"flush.messages": "1"})
    sent = [produce_frame(producer, [("piped", 0, batch(f"f{n:03d}", records, 1000))]) for n in range(frames)]
    replies = send_pipelined(producer, sent)
    assert all(reply["topics"][0]["partitions"][0]["error_code"] == NONE for reply in replies.values())
    assert values_of(producer, "piped", 0) == [f"f{n:03d}-{j}" for n in range(frames) for j in range(records)]
