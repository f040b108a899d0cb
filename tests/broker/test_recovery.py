"""Crash recovery on a real broker process: bounded by the unflushed tail, and never "repairing"
damage in flushed data by deleting it (Kafka's recovery-point contract).

With the default flush policy a segment is flushed when it rolls and the recovery point
checkpoint follows, so after SIGKILL only the active segment is re-validated. Damage found below
the recovery point is kept and reported (a log line, CORRUPT_MESSAGE or a CRC mismatch for
readers, the `pymq_log_damaged_segments` metric); every other record, in that segment and in every
later one, survives.
"""
from __future__ import annotations

import asyncio
import re
import struct
from pathlib import Path

import pytest

from segment_format import batch_body, record
from broker.cluster.local_metadata_store import LocalMetadataStore
from broker.cluster.topics import TopicRegistry
from broker.config import BrokerConfig
from common.errors import NONE, CorruptMessageError
from broker.log.checkpoint import read_offsets
from broker.log.log_manager import RECOVERY_POINT_CHECKPOINT
from protocol import ApiKey
from broker.server import METADATA_FILE
from tests.waiting import wait_until

TOPIC = "recovering"
BATCHES = 60
VALUE_BYTES = 600  # with 4 KiB segments: two or three batches per segment, twenty or more segments


@pytest.fixture
def crashed(broker_factory, raw_client):
    """A broker that wrote BATCHES one-record batches over 20-30 small segments and was SIGKILLed
    once the recovery point checkpoint reached its last sealed segment; stopped, so that the test
    can damage files before restarting it."""
    broker = broker_factory(**{"log.flush.offset.checkpoint.interval.ms": 3_600_000}).start()
    client = raw_client(broker.port)
    reply, _ = client.request(ApiKey.CREATE_TOPICS, {"topics": [
        {"name": TOPIC, "num_partitions": 1, "replication_factor": 1, "configs": {"segment.bytes": 4096}}]})
    assert reply["topics"][0]["error_code"] == NONE, reply
    for i in range(BATCHES):
        payload = bytes(record.encode_batch(batch_body.make_body([value(i)], timestamps_ms=batch_body.now_ms())))
        reply, _ = client.request(ApiKey.PRODUCE, {"acks": 1, "topics": [
            {"name": TOPIC, "partitions": [{"partition": 0, "size": len(payload)}]}]}, payload)
        assert reply["topics"][0]["partitions"][0]["error_code"] == NONE, reply
    segments = segment_files(broker.log_dir)
    assert len(segments) >= 10
    wait_for_recovery_point(broker.log_dir, int(segments[-2].stem))
    broker.kill()
    return broker


def value(i: int) -> bytes:
    return b"%05d" % i + b"x" * (VALUE_BYTES - 5)


def segment_files(log_dir: Path) -> list[Path]:
    return sorted((log_dir / f"{TOPIC}-0").glob("*.log"))


def wait_for_recovery_point(log_dir: Path, offset: int, timeout_s: float = 30.0) -> None:
    """The recovery point is checkpointed right after each rolled segment is flushed."""
    wait_until(lambda: read_offsets(log_dir / RECOVERY_POINT_CHECKPOINT).get((TOPIC, 0), 0) >= offset, timeout_s,
               "the recovery point follows the rolled segments", 0.02)


def fetch(client, offset: int) -> tuple[dict, bytes]:
    reply, payload = client.request(ApiKey.FETCH, {"max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20, "topics": [
        {"name": TOPIC, "partitions": [{"partition": 0, "fetch_offset": offset, "max_bytes": 1 << 20}]}]})
    entry = reply["topics"][0]["partitions"][0]
    return entry, payload[: entry.get("size", 0)]


def read_everything(client) -> tuple[dict[int, bytes], list[int], list[int]]:
    """Every record the broker serves from offset 0 on, checking each batch's CRC the way a
    consumer does: (offset -> value, offsets of batches failing their CRC, offsets answered
    CORRUPT_MESSAGE). Skips past a bad batch as a skip-and-continue consumer would."""
    values: dict[int, bytes] = {}
    bad_crc, refused = [], []
    offset = 0
    while offset < BATCHES:
        entry, data = fetch(client, offset)
        if entry["error_code"] == CorruptMessageError.code:
            refused.append(offset)
            offset += 1
            continue
        assert entry["error_code"] == NONE, entry
        assert data, f"nothing served at offset {offset}"
        position = 0
        while position < len(data):
            header = record.read_header(data, position)
            if position + header.size > len(data):
                break  # a batch cut by max_bytes: fetched again from its offset
            try:
                record.validate_batch(data, position)
            except CorruptMessageError:
                bad_crc.append(header.base_offset)
            else:
                body = record.decode_body(data, header, position)
                for i, v in enumerate(body.column("value").to_pylist()):
                    values[header.base_offset + i] = v
            offset = header.next_offset
            position += header.size
    return values, bad_crc, refused


def recovered_bytes(broker) -> int:
    found = re.findall(r"recovered (\d+) bytes of \d+ logs", broker.log_tail(200_000))
    assert found, broker.log_tail()
    return int(found[-1])


@pytest.mark.slow
def test_restart_after_sigkill_revalidates_only_the_unflushed_tail(crashed, raw_client):
    total = sum(path.stat().st_size for path in segment_files(crashed.log_dir))
    crashed.start()
    assert recovered_bytes(crashed) <= 2 * 4096 + 2 * VALUE_BYTES, f"re-validated most of a {total} byte log"
    values, bad_crc, refused = read_everything(raw_client(crashed.port))
    assert values == {i: value(i) for i in range(BATCHES)} and not bad_crc and not refused


@pytest.mark.slow
def test_flipped_byte_in_an_old_segment_loses_nothing_else(crashed, raw_client):
    victim = segment_files(crashed.log_dir)[2]
    first = record.read_header(victim.read_bytes(), 0)
    with open(victim, "r+b") as f:  # a bit rot in the first batch's Arrow body
        f.seek(record.HEADER_SIZE + 40)
        byte = f.read(1)
        f.seek(record.HEADER_SIZE + 40)
        f.write(bytes([byte[0] ^ 0xFF]))
    crashed.start()
    values, bad_crc, refused = read_everything(raw_client(crashed.port))
    assert bad_crc == [first.base_offset] and not refused
    assert values == {i: value(i) for i in range(BATCHES) if i != first.base_offset}


@pytest.mark.slow
def test_broken_framing_in_an_old_segment_is_reported_not_truncated(crashed, raw_client):
    victim = segment_files(crashed.log_dir)[3]
    data = victim.read_bytes()
    first = record.read_header(data, 0)
    second = record.read_header(data, first.size)  # after the segment's only index entry
    with open(victim, "r+b") as f:
        f.seek(first.size + 8)
        f.write(struct.pack("<i", 1 << 30))  # batch_length now runs far past the file
    crashed.overrides["metrics.port"] = 0
    crashed.start()
    assert "damaged segments below its recovery point" in crashed.log_tail(200_000)
    assert crashed.metrics()[f'pymq_log_damaged_segments{{partition="0",topic="{TOPIC}"}}'] == 1
    values, bad_crc, refused = read_everything(raw_client(crashed.port))
    assert refused == [second.base_offset] and not bad_crc
    assert values == {i: value(i) for i in range(BATCHES) if i != second.base_offset}
    # the broker keeps accepting appends after the restart
    client = raw_client(crashed.port)
    payload = bytes(record.encode_batch(batch_body.make_body([b"after"], timestamps_ms=batch_body.now_ms())))
    reply, _ = client.request(ApiKey.PRODUCE, {"acks": 1, "topics": [
        {"name": TOPIC, "partitions": [{"partition": 0, "size": len(payload)}]}]}, payload)
    assert reply["topics"][0]["partitions"][0]["base_offset"] == BATCHES


@pytest.mark.slow
def test_topic_recreated_after_a_crash_between_metadata_and_log_delete_starts_empty(broker_factory, raw_client):
    """The crash leaves the old topic's directory on disk with no metadata; the new topic of the
    same name has a new topic id, so the directory (its partition.metadata names the old id) is
    moved aside instead of being adopted with its records."""
    broker = broker_factory().start()
    client = raw_client(broker.port)
    reply, _ = client.request(ApiKey.CREATE_TOPICS, {"topics": [
        {"name": TOPIC, "num_partitions": 1, "replication_factor": 1, "configs": {}}]})
    assert reply["topics"][0]["error_code"] == NONE, reply
    payload = bytes(record.encode_batch(batch_body.make_body([b"old"], timestamps_ms=batch_body.now_ms())))
    reply, _ = client.request(ApiKey.PRODUCE, {"acks": 1, "topics": [
        {"name": TOPIC, "partitions": [{"partition": 0, "size": len(payload)}]}]}, payload)
    assert reply["topics"][0]["partitions"][0]["error_code"] == NONE, reply
    broker.kill()

    async def delete_metadata_only() -> None:  # what the crash left done
        store = LocalMetadataStore(broker.log_dir / METADATA_FILE)
        registry = TopicRegistry(store, 0, BrokerConfig.load().log_defaults)
        await registry.load()
        await registry.delete(TOPIC)
        await store.close()

    asyncio.run(delete_metadata_only())
    assert (broker.log_dir / f"{TOPIC}-0").is_dir()
    broker.start()
    client = raw_client(broker.port)
    reply, _ = client.request(ApiKey.CREATE_TOPICS, {"topics": [
        {"name": TOPIC, "num_partitions": 1, "replication_factor": 1, "configs": {}}]})
    assert reply["topics"][0]["error_code"] == NONE, reply
    entry, data = fetch(client, 0)
    assert entry["error_code"] == NONE and entry["high_watermark"] == 0 and not data, entry
    assert "stale directory of a deleted topic" in broker.log_tail(200_000)
