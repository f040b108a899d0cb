"""Produce and fetch over a raw connection (tests/conftest.py's RawClient), with no client library
between the test and the wire: record batches of tagged values, produce frames, pipelined sends,
and a partition's values read back in offset order."""
from __future__ import annotations

from broker.errors import NONE
from broker.protocol import ApiKey
from segment_format import batch_body, record

TS = 1_700_000_000_000


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


def create_topic(client, name: str, partitions: int) -> None:
    reply, _ = client.request(ApiKey.CREATE_TOPICS, {"topics": [{"name": name, "num_partitions": partitions}]})
    assert reply["topics"][0]["error_code"] == NONE, reply


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
