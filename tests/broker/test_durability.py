"""Acknowledgements mean what the topic's flush policy promises, proven on a real broker process
whose fsyncs the test controls (tests/faults/broker.py: block, fail or count them).

- `flush.messages=1`: a produce is acknowledged only after the fsync that covers it, and its
  records stay invisible to consumers (above the high watermark) until then.
- the default policy (no forced flush) acknowledges without waiting for any fsync.
- a failed fsync takes the log directory offline: the waiting produce and every later request
  for any partition of that directory get KAFKA_STORAGE_ERROR, and a later successful fsync does
  not bring it back (nothing unflushed is ever reported durable); a restart recovers it.
- an acknowledgement that cannot be given within the produce's `timeout_ms` is REQUEST_TIMED_OUT.
- disk work of admin requests runs off the event loop: a 1,000-partition topic creation stuck
  in its filesystem sync does not stop other connections from producing and fetching.
- SIGKILL with produces in flight loses no acknowledged record.

Waits are bounded by the fault: a test asserts that something has NOT happened while an fsync
is held, then releases it and asserts that it does happen.
"""
from __future__ import annotations

import itertools
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from segment_format import batch_body, record
from common.errors import NONE, KafkaStorageError, RequestTimedOutError
from broker.process import BrokerProcess
from protocol import ApiKey
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
_names = itertools.count()


class FaultyBroker(BrokerProcess):
    """A broker process under tests/faults/broker.py, with its fault directory."""

    def __init__(self, directory: Path, overrides: dict[str, Any] | None = None) -> None:
        self.faults = directory / "faults"
        self.faults.mkdir(parents=True, exist_ok=True)
        super().__init__(directory / "broker", overrides, cwd=REPO, module="tests.faults.broker",
                         env={"PYMQ_FAULT_DIR": str(self.faults)})

    def hold_fsyncs(self) -> None:
        (self.faults / "fsync.block").touch()

    def release_fsyncs(self) -> None:
        (self.faults / "fsync.block").unlink(missing_ok=True)

    def fail_fsyncs(self, failing: bool = True) -> None:
        path = self.faults / "fsync.fail"
        path.touch() if failing else path.unlink(missing_ok=True)

    @property
    def fsyncs(self) -> int:
        path = self.faults / "fsync.count"
        return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.fixture
def faulty(tmp_path: Path):
    """A started FaultyBroker (scheduled flushes off, so only policy-driven fsyncs happen)."""
    broker = FaultyBroker(tmp_path, {"log.flush.scheduler.interval.ms": 3_600_000,
                                     "log.flush.offset.checkpoint.interval.ms": 3_600_000})
    yield broker.start()
    broker.release_fsyncs()
    broker.kill()


def batch(*values: bytes) -> bytes:
    return bytes(record.encode_batch(batch_body.make_body(list(values), timestamps_ms=batch_body.now_ms())))


def create_topic(client, configs: dict[str, Any] | None = None, partitions: int = 1) -> str:
    name = f"durable-{next(_names)}"
    reply, _ = client.request(ApiKey.CREATE_TOPICS, {"topics": [
        {"name": name, "num_partitions": partitions, "replication_factor": 1, "configs": configs or {}}]})
    assert reply["topics"][0]["error_code"] == NONE, reply
    return name


def send_produce(client, topic: str, payload: bytes, acks: int = 1, timeout_ms: int = 30_000) -> int:
    return client.send_frame(ApiKey.PRODUCE, {"acks": acks, "timeout_ms": timeout_ms, "topics": [
        {"name": topic, "partitions": [{"partition": 0, "size": len(payload)}]}]}, payload)


def produce_result(client, sent: int) -> dict[str, Any]:
    correlation_id, reply, _ = client.recv_response()
    assert correlation_id == sent
    assert reply["error_code"] == NONE, reply
    return reply["topics"][0]["partitions"][0]


def produce(client, topic: str, payload: bytes, acks: int = 1, timeout_ms: int = 30_000) -> dict[str, Any]:
    return produce_result(client, send_produce(client, topic, payload, acks, timeout_ms))


def no_response_within(client, seconds: float) -> bool:
    """True if nothing arrives on the connection for `seconds` (the response is being held)."""
    client.sock.settimeout(seconds)
    try:
        peeked = client.sock.recv(1, socket.MSG_PEEK)  # leave any bytes for recv_response
    except TimeoutError:
        return True
    finally:
        client.sock.settimeout(10.0)
    if not peeked:
        raise ConnectionError("the broker closed the connection instead of answering")
    return False


def latest_offset(client, topic: str) -> int:
    reply, _ = client.request(ApiKey.LIST_OFFSETS, {"topics": [
        {"name": topic, "partitions": [{"partition": 0, "timestamp": -1}]}]})
    entry = reply["topics"][0]["partitions"][0]
    assert entry["error_code"] == NONE, reply
    return entry["offset"]


def fetch_entry(client, topic: str, offset: int = 0) -> tuple[dict[str, Any], bytes]:
    reply, payload = client.request(ApiKey.FETCH, {"max_wait_ms": 0, "min_bytes": 0, "topics": [
        {"name": topic, "partitions": [{"partition": 0, "fetch_offset": offset}]}]})
    return reply["topics"][0]["partitions"][0], payload


def fetched_values(client, topic: str) -> list[bytes]:
    entry, payload = fetch_entry(client, topic)
    assert entry["error_code"] == NONE, entry
    data = payload[: entry["size"]]
    return [v for pos, header in record.iter_batches(data)
            for v in record.decode_body(data, header, pos).column("value").to_pylist()]


def test_flush_every_message_acknowledges_only_after_the_fsync(faulty, raw_client):
    client = raw_client(faulty.port)
    topic = create_topic(client, {"flush.messages": 1})
    produce(client, topic, batch(b"first"))
    fsyncs = faulty.fsyncs
    assert fsyncs > 0, "the first acknowledgement came without an fsync"

    faulty.hold_fsyncs()
    sent = send_produce(client, topic, batch(b"second"))
    assert no_response_within(client, 0.5), "acknowledged while its fsync was held"
    reader = raw_client(faulty.port)
    assert latest_offset(reader, topic) == 1, "a consumer saw a record that is not yet durable"
    assert fetched_values(reader, topic) == [b"first"]

    faulty.release_fsyncs()
    assert produce_result(client, sent)["base_offset"] == 1
    assert faulty.fsyncs > fsyncs
    assert latest_offset(reader, topic) == 2
    assert fetched_values(reader, topic) == [b"first", b"second"]


def test_one_fsync_covers_every_append_waiting_for_it(faulty, raw_client):
    """Group commit: produces arriving while a flush runs are acknowledged by the next one, not by
    an fsync each."""
    client = raw_client(faulty.port)
    topic = create_topic(client, {"flush.messages": 1})
    produce(client, topic, batch(b"warm"))
    faulty.hold_fsyncs()
    senders = [raw_client(faulty.port) for _ in range(8)]
    sent = [(c, send_produce(c, topic, batch(b"v%d" % i))) for i, c in enumerate(senders)]
    assert all(no_response_within(c, 0.05) for c in senders)
    before = faulty.fsyncs
    faulty.release_fsyncs()
    offsets = sorted(produce_result(c, s)["base_offset"] for c, s in sent)
    assert offsets == list(range(1, 9))
    # each flush fsyncs a handful of files (segment, indexes); 8 separate flushes would be >= 8x that
    assert faulty.fsyncs - before < 8 * 2


def test_default_policy_acknowledges_without_waiting_for_an_fsync(faulty, raw_client):
    client = raw_client(faulty.port)
    topic = create_topic(client)
    faulty.hold_fsyncs()
    fsyncs = faulty.fsyncs
    for i in range(5):
        assert produce(client, topic, batch(b"v%d" % i))["base_offset"] == i
    assert faulty.fsyncs == fsyncs
    assert fetched_values(client, topic) == [b"v%d" % i for i in range(5)]


def test_acknowledgement_not_possible_within_timeout_is_request_timed_out(faulty, raw_client):
    client = raw_client(faulty.port)
    topic = create_topic(client, {"flush.messages": 1})
    faulty.hold_fsyncs()
    sent = send_produce(client, topic, batch(b"late"), timeout_ms=200)
    correlation_id, reply, _ = client.recv_response()
    assert correlation_id == sent
    entry = reply["topics"][0]["partitions"][0]
    assert entry["error_code"] == RequestTimedOutError.code, reply
    faulty.release_fsyncs()


def test_failed_fsync_takes_the_directory_offline_and_is_never_laundered(faulty, raw_client):
    client = raw_client(faulty.port)
    flushed = create_topic(client, {"flush.messages": 1})
    other = create_topic(client)
    produce(client, flushed, batch(b"durable"))
    produce(client, other, batch(b"other"))

    faulty.fail_fsyncs()
    send_produce(client, flushed, batch(b"lost"))
    _, reply, _ = client.recv_response()
    assert reply["topics"][0]["partitions"][0]["error_code"] == KafkaStorageError.code, reply
    faulty.fail_fsyncs(False)  # the disk "recovers": the directory must stay offline anyway

    for topic in (flushed, other):
        send_produce(client, topic, batch(b"after"))
        _, reply, _ = client.recv_response()
        assert reply["topics"][0]["partitions"][0]["error_code"] == KafkaStorageError.code, reply
        entry, _ = fetch_entry(client, topic)
        assert entry["error_code"] == KafkaStorageError.code, entry
    assert "offline" in faulty.log_tail()

    faulty.kill()
    faulty.start()  # a restart recovers the directory from its files
    client = raw_client(faulty.port)
    assert fetched_values(client, flushed)[0] == b"durable"
    assert fetched_values(client, other) == [b"other"]
    assert produce(client, other, batch(b"again"))["base_offset"] == 1


def test_topic_creation_stuck_on_disk_does_not_stall_other_connections(faulty, raw_client):
    client = raw_client(faulty.port)
    busy = create_topic(client)
    creator = raw_client(faulty.port, timeout_s=120)
    faulty.hold_fsyncs()
    sent = creator.send_frame(ApiKey.CREATE_TOPICS, {"topics": [
        {"name": "wide", "num_partitions": 1000, "replication_factor": 1, "configs": {}}]})
    assert no_response_within(creator, 0.2)
    for i in range(20):  # the event loop keeps serving while the creation waits on the disk
        assert produce(client, busy, batch(b"v%d" % i))["base_offset"] == i
    assert len(fetched_values(client, busy)) == 20
    faulty.release_fsyncs()
    correlation_id, reply, _ = creator.recv_response()
    assert correlation_id == sent and reply["topics"][0]["error_code"] == NONE, reply
    meta, _ = client.request(ApiKey.METADATA, {"topics": ["wide"]})
    assert len(meta["topics"][0]["partitions"]) == 1000


@pytest.mark.parametrize("configs", [{}, {"flush.messages": 1}], ids=["default-policy", "flush-every-message"])
def test_sigkill_with_produces_in_flight_keeps_every_acknowledged_record(faulty, raw_client, configs):
    client = raw_client(faulty.port)
    topic = create_topic(client, configs)
    acknowledged: list[bytes] = []
    stop = threading.Event()

    def produce_until_killed() -> None:
        sender = raw_client(faulty.port)
        for i in itertools.count():
            value = b"record-%06d" % i
            try:
                produce(sender, topic, batch(value))
            except (ConnectionError, OSError):
                return
            acknowledged.append(value)
            if stop.is_set():
                return

    thread = threading.Thread(target=produce_until_killed)
    thread.start()
    try:
        wait_until(lambda: len(acknowledged) >= 50, 30, "50 acknowledged produces", 0.01)
    finally:
        faulty.kill()
        stop.set()
        thread.join(30)
    assert len(acknowledged) >= 50

    faulty.start()
    stored = fetched_values(raw_client(faulty.port), topic)
    assert stored[: len(acknowledged)] == acknowledged
    assert len(stored) <= len(acknowledged) + 1  # at most the one in flight, never a gap


def test_topic_creation_failing_part_way_rolls_back_and_the_broker_restarts(faulty, raw_client):
    client = raw_client(faulty.port)
    survivor = create_topic(client)
    produce(client, survivor, batch(b"kept"))
    (faulty.faults / "create.budget").write_text("30")  # 1 file (its .log) per partition: fails at partition 31
    reply, _ = client.request(ApiKey.CREATE_TOPICS, {"topics": [
        {"name": "half", "num_partitions": 50, "replication_factor": 1, "configs": {}}]})
    assert reply["topics"][0]["error_code"] == KafkaStorageError.code, reply
    (faulty.faults / "create.budget").unlink()
    meta, _ = client.request(ApiKey.METADATA, {"topics": None})
    assert "half" not in [t["name"] for t in meta["topics"]]
    assert not list(faulty.log_dir.glob("half-*")), "a failed creation left partition directories behind"
    assert produce(client, survivor, batch(b"still"))["base_offset"] == 1  # the directory is not offline

    faulty.kill()
    faulty.start()
    client = raw_client(faulty.port)
    assert fetched_values(client, survivor) == [b"kept", b"still"]
    create_topic_named = {"name": "half", "num_partitions": 50, "replication_factor": 1, "configs": {}}
    reply, _ = client.request(ApiKey.CREATE_TOPICS, {"topics": [create_topic_named]})
    assert reply["topics"][0]["error_code"] == NONE, reply
    assert len(list(faulty.log_dir.glob("half-*"))) == 50


def earliest_offset(client, topic: str) -> int:
    reply, _ = client.request(ApiKey.LIST_OFFSETS, {"topics": [
        {"name": topic, "partitions": [{"partition": 0, "timestamp": -2}]}]})
    entry = reply["topics"][0]["partitions"][0]
    assert entry["error_code"] == NONE, reply
    return entry["offset"]


def test_retention_failing_for_one_partition_goes_on_for_the_others(tmp_path, raw_client):
    """The renames of one partition's segments fail (its disk area is bad): retention of every
    other partition goes on, the failing one keeps its segments whole and readable, and catches
    up once the renames work again."""
    broker = FaultyBroker(tmp_path, {"log.retention.check.interval.ms": 50, "file.delete.delay.ms": 0})
    broker.start()
    try:
        client = raw_client(broker.port)
        configs = {"segment.bytes": 4096, "retention.bytes": 4096}
        stuck, flowing = create_topic(client, configs), create_topic(client, configs)
        (broker.faults / "rename.fail").write_text(f"{stuck}-0")
        for i in range(12):
            for topic in (stuck, flowing):
                produce(client, topic, batch(b"%04d" % i + b"x" * 1500))
        wait_until(lambda: earliest_offset(client, flowing) > 0, 30, "retention goes on for the other partition")
        assert earliest_offset(client, stuck) == 0
        assert len(fetched_values(client, stuck)) > 0
        assert "retention failed" in broker.log_tail(100_000)
        (broker.faults / "rename.fail").unlink()
        wait_until(lambda: earliest_offset(client, stuck) > 0, 30, "retention resumes once the renames work")
        assert produce(client, stuck, batch(b"after"))["base_offset"] == 12
    finally:
        broker.kill()
