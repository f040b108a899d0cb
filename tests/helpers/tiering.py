"""A tiering broker's topic as the tiering tests see it: numbered values produced to one topic,
the local segment files and the committed manifest, and the checks that remote plus local hold
every record once (tests/broker/test_tiering_e2e.py, test_tiering_outage.py)."""
from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa

from client import Admin, Consumer, Producer
from common.errors import OffsetOutOfRangeError
from segment_format import record
from segment_format.manifest import PartitionManifest
from tiered_storage import RemoteSegmentStore

TOPIC = "tiered"
VALUE_BYTES = 100


def tiering_broker(broker_factory, tmp_path: Path, **overrides):  # type: ignore[no-untyped-def]
    return broker_factory(**{
        "remote.log.storage.system.enable": True, "remote.storage.url": f"file://{tmp_path}/remote",
        "remote.log.manager.task.interval.ms": 50, "log.retention.check.interval.ms": 50,
        "file.delete.delay.ms": 0, "log.flush.scheduler.interval.ms": 20, **overrides})


def create_topic(bootstrap: str, segment_bytes: int, local_retention_bytes: int, partitions: int = 1) -> None:
    with Admin(bootstrap) as admin:
        admin.create_topic(TOPIC, partitions=partitions, configs={
            "segment.bytes": segment_bytes, "remote.storage.enable": "true",
            "local.retention.bytes": local_retention_bytes, "retention.ms": -1})


def value(i: int) -> bytes:
    return b"%010d" % i + b"v" * (VALUE_BYTES - 10)


def produce(bootstrap: str, start: int, count: int, partition: int = 0) -> None:
    with Producer(bootstrap, linger_ms=5) as producer:
        for chunk in range(start, start + count, 500):
            ids = range(chunk, min(chunk + 500, start + count))
            producer.send_batch(TOPIC, pa.table({"key": [None] * len(ids), "value": [value(i) for i in ids]},
                                                schema=pa.schema([("key", pa.binary()), ("value", pa.binary())])),
                                partition=partition)
        producer.flush()


def local_bases(log_dir: Path) -> list[int]:
    return sorted(int(p.name[:20]) for p in (log_dir / f"{TOPIC}-0").glob("*.log"))


def manifest_of(store: RemoteSegmentStore) -> PartitionManifest:
    return store.load_manifest(TOPIC, 0)


def all_sealed_tiered(broker, store: RemoteSegmentStore, local_at_most: int) -> bool:  # type: ignore[no-untyped-def]
    """Whether the manifest reaches the active segment with at most `local_at_most` segments left
    local; checks on each call that no local segment went before the manifest named it."""
    check_nothing_local_lost(broker.log_dir, store)
    bases = local_bases(broker.log_dir)
    return manifest_of(store).log_end_offset == bases[-1] and len(bases) <= local_at_most


def check_nothing_local_lost(log_dir: Path, store: RemoteSegmentStore) -> None:
    """Every offset below the local log start is in the committed manifest (read the local
    listing first: a segment leaves the disk only after the manifest names it)."""
    bases = local_bases(log_dir)
    manifest = manifest_of(store)
    if bases and bases[0] > 0:
        assert manifest.log_end_offset >= bases[0], (manifest.log_end_offset, bases[0])


def remote_values(store: RemoteSegmentStore, manifest: PartitionManifest) -> dict[int, bytes]:
    """offset -> value of every record the manifest's segments hold (batches CRC-checked)."""
    out: dict[int, bytes] = {}
    for segment in manifest.segments:
        data = store.read_batches(TOPIC, 0, segment, segment.base_offset)
        for pos, _ in record.iter_batches(data):
            header, body = record.decode_batch(data, pos)
            for offset, v in zip(record.record_offsets(header, body).to_pylist(), body.column("value").to_pylist()):
                assert offset not in out, f"offset {offset} twice in the remote log"
                out[offset] = v
    return out


def local_values(bootstrap: str, start: int, end: int) -> dict[int, bytes]:
    consumer = Consumer(bootstrap, auto_offset_reset="none")
    try:
        consumer.assign([(TOPIC, 0)])
        consumer.seek((TOPIC, 0), start)
        out: dict[int, bytes] = {}
        deadline = time.monotonic() + 60
        while len(out) < end - start:
            assert time.monotonic() < deadline, f"read {len(out)} of {end - start} local records"
            table = consumer.poll_arrow(timeout_ms=500)
            out.update(zip(table["offset"].to_pylist(), table["value"].to_pylist()))
        return out
    finally:
        consumer.close()


def check_complete(bootstrap: str, log_dir: Path, store: RemoteSegmentStore, produced: int) -> None:
    """Remote plus local hold offsets 0..produced-1 exactly once each, with the values produced."""
    manifest = manifest_of(store)
    bases = [s.base_offset for s in manifest.segments]
    assert bases == sorted(set(bases))
    for before, after in zip(manifest.segments, manifest.segments[1:]):
        assert before.next_offset == after.base_offset
    assert manifest.log_start_offset == 0
    remote = remote_values(store, manifest)
    assert sorted(remote) == list(range(manifest.log_end_offset))
    for _ in range(20):  # local retention may still move the local log start while we read
        local_start = local_bases(log_dir)[0]
        assert local_start <= manifest.log_end_offset
        try:
            local = local_values(bootstrap, local_start, produced)
            break
        except OffsetOutOfRangeError:
            continue
    else:
        raise AssertionError("the local log start kept moving")
    merged = {**local, **remote}
    assert sorted(merged) == list(range(produced))
    assert all(merged[i] == value(i) for i in range(produced))


def consume_from(bootstrap: str, start: int, end: int) -> list[bytes]:
    """The values of offsets [start, end) read in order by one consumer (each offset once)."""
    values: list[bytes] = []
    with Consumer(bootstrap, auto_offset_reset="none") as consumer:
        consumer.assign([(TOPIC, 0)])
        consumer.seek((TOPIC, 0), start)
        deadline = time.monotonic() + 60
        while len(values) < end - start:
            assert time.monotonic() < deadline, f"read {len(values)} of {end - start} records"
            table = consumer.poll_arrow(timeout_ms=500)
            assert table["offset"].to_pylist() == list(range(start + len(values), start + len(values) + table.num_rows))
            values += table["value"].to_pylist()
    return values
