"""Produce and fetch over a raw connection (tests/conftest.py's RawClient), with no client library
between the test and the wire: record batches, produce frames and requests, pipelined sends, a
partition's records read back in offset order, a fingerprint of a topic's stored files, and the
check that the broker still serves."""
from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

from common.errors import NONE
from protocol import ApiKey
from segment_format import batch_body, record

INT64_MAX = 2**63 - 1
TS = 1_700_000_000_000
SEED_VALUES = [b"seed-0", b"seed-1", b"seed-2"]


def batch(tag: str, count: int, value_bytes: int) -> bytes:
    values = [f"{tag}-{i}".encode().ljust(value_bytes, b".") for i in range(count)]
    return bytes(record.encode_batch(batch_body.make_body(values, timestamps_ms=TS)))


def produce_frame(client, parts: list[tuple[str, int, bytes]]) -> tuple[int, bytes]:
    """One produce request with a record set per (topic, partition, batch bytes)."""
    topics: dict[str, list[dict]] = {}
    for topic, partition, data in parts:
        topics.setdefault(topic, []).append({"partition": partition, "size": len(data)})
    control = {"acks": 1, "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]}
    return client.frame(ApiKey.PRODUCE, control, b"".join(data for _, _, data in parts))


def values_of(client, topic: str, partition: int) -> list[str]:
    """Every value of a partition, in offset order, checked to start at 0 without gaps."""
    values, offset = [], 0
    while True:
        control = {"max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20,
                   "topics": [{"name": topic, "partitions": [{"partition": partition, "fetch_offset": offset}]}]}
        reply, payload = client.request(ApiKey.FETCH, control)
        entry = reply["topics"][0]["partitions"][0]
        assert entry["error_code"] == NONE, reply
        if not entry["size"]:
            return values
        for pos, header in record.iter_batches(payload[: entry["size"]]):
            assert header.base_offset == offset
            body = record.decode_body(payload, header, pos)
            values += [v.split(b".")[0].decode() for v in body.column("value").to_pylist()]
            offset = header.next_offset


def send_pipelined(client, frames: list[tuple[int, bytes]]) -> dict[int, dict]:
    """Send every frame in one write; return each response's control by correlation id."""
    client.send_raw(b"".join(data for _, data in frames))
    replies = {}
    for _ in frames:
        correlation_id, control, _ = client.recv_response()
        replies[correlation_id] = control
    assert set(replies) == {cid for cid, _ in frames}
    return replies


def stored_files(log_dir: Path, topic: str) -> dict[str, tuple[int, str]]:
    """(size, sha256) of every file in every partition dir of `topic`, by path under log_dir."""
    out = {}
    for directory in sorted(log_dir.iterdir()):
        match = re.fullmatch(r"(.+)-(\d+)", directory.name)
        if not directory.is_dir() or match is None or match.group(1) != topic:
            continue
        for path in sorted(p for p in directory.rglob("*") if p.is_file()):
            data = path.read_bytes()
            out[str(path.relative_to(log_dir))] = (len(data), hashlib.sha256(data).hexdigest())
    return out


def make_batch(values: list[bytes], ts: int = TS) -> bytearray:
    return record.encode_batch(batch_body.make_body(values, timestamps_ms=ts))


def create_topic(client, name: str, partitions: int = 1, configs: dict[str, Any] | None = None) -> None:
    reply, _ = client.request(ApiKey.CREATE_TOPICS, {"topics": [
        {"name": name, "num_partitions": partitions, "replication_factor": 1, "configs": configs or {}}]})
    assert reply["topics"][0]["error_code"] == NONE, reply


def produce_request(topic: Any, partition: Any, payload: bytes, acks: Any = 1) -> dict[str, Any]:
    return {"acks": acks, "topics": [{"name": topic, "partitions": [{"partition": partition, "size": len(payload)}]}]}


def produce(client, topic: Any, partition: Any, payload: bytes) -> dict[str, Any]:
    """One partition's produce result."""
    reply, _ = client.request(ApiKey.PRODUCE, produce_request(topic, partition, payload), bytes(payload))
    assert reply["error_code"] == NONE, reply
    return reply["topics"][0]["partitions"][0]


def fetch_request(topic: Any, partition: Any, offset: Any) -> dict[str, Any]:
    return {"max_wait_ms": 0, "min_bytes": 0,
            "topics": [{"name": topic, "partitions": [{"partition": partition, "fetch_offset": offset}]}]}


def fetch_records(client, topic: str, partition: int = 0) -> list[tuple[int, bytes]]:
    """Every (offset, value) of one partition, decoded from raw fetches (one segment's bytes
    each) until one returns nothing."""
    out: list[tuple[int, bytes]] = []
    offset = 0
    while True:
        reply, payload = client.request(ApiKey.FETCH, fetch_request(topic, partition, offset))
        entry = reply["topics"][0]["partitions"][0]
        assert entry["error_code"] == NONE, reply
        data = payload[: entry["size"]]
        batches = list(record.iter_batches(data))
        if not batches:
            return out
        for pos, header in batches:
            body = record.decode_body(data, header, pos)
            out += zip(record.record_offsets(header, body).to_pylist(), body.column("value").to_pylist())
        offset = batches[-1][1].next_offset


def assert_metadata(client) -> None:
    reply, _ = client.request(ApiKey.METADATA, {})
    assert reply["error_code"] == NONE and reply["brokers"], reply


def assert_serving(server, raw_client, same=None) -> None:
    """The broker process is alive and answers Metadata on a fresh connection (and on `same`)."""
    assert server.proc is not None and server.proc.poll() is None, "broker process died"
    with raw_client(server.port) as fresh:
        assert_metadata(fresh)
    if same is not None:
        assert_metadata(same)
