"""Tiered storage in a real broker process (broker/remote_log/remote_log_manager.py) with a file:// store
under tmp: sealed segments end up in the manifest and leave the local disk, none before it was
uploaded; SIGKILL during uploads leaves a consistent manifest and no record lost or doubled.

The remote part is checked twice: straight from the store, and through the broker (a consumer
from offset 0, and time lookups, answered from the remote tier below the local log start)."""
from __future__ import annotations

import time

import pyarrow as pa
import pytest

from segment_format import record
from client import Admin, Consumer, Producer
from tiered_storage import RemoteSegmentStore
from tests.helpers.tiering import (
    TOPIC,
    all_sealed_tiered,
    check_complete,
    check_nothing_local_lost,
    consume_from,
    create_topic,
    local_bases,
    manifest_of,
    produce,
    remote_values,
    tiering_broker,
    value,
)
from tests.waiting import wait_until


@pytest.mark.slow
def test_sealed_segments_tier_and_leave_the_local_disk(broker_factory, tmp_path):
    """20,000 records (batches of 500) in 16 KiB segments with local.retention.bytes 32 KiB: the manifest lists
    every sealed segment, the local directory keeps a few recent ones, no local segment went
    before the manifest named it, and remote plus local hold every record once."""
    broker = tiering_broker(broker_factory, tmp_path).start()
    store = RemoteSegmentStore.from_url(f"file://{tmp_path}/remote")
    create_topic(broker.bootstrap, 16 << 10, 32 << 10)
    produced = 20_000
    produce(broker.bootstrap, 0, produced)
    wait_until(lambda: all_sealed_tiered(broker, store, 4), 60, "every sealed segment is tiered")
    manifest = manifest_of(store)
    assert len(manifest.segments) >= 30  # 40 batches of 500 records, each past a 16 KiB segment
    check_complete(broker.bootstrap, broker.log_dir, store, produced)
    with Consumer(broker.bootstrap, auto_offset_reset="none") as consumer:
        assert consumer.beginning_offsets([(TOPIC, 0)]) == {(TOPIC, 0): 0}  # the whole log starts at 0
    assert local_bases(broker.log_dir)[0] > 0
    for _ in range(2):  # cold, then from the broker's cache
        assert consume_from(broker.bootstrap, 0, produced) == [value(i) for i in range(produced)]
    check_time_lookups(broker.bootstrap, store)


def check_time_lookups(bootstrap: str, store: RemoteSegmentStore) -> None:
    """offsets_for_times finds the first record at or after a time held only remotely: the first
    record of each of a few remote segments, looked up by its own timestamp."""
    manifest = manifest_of(store)
    with Consumer(bootstrap, auto_offset_reset="none") as consumer:
        for segment in manifest.segments[:: max(len(manifest.segments) // 4, 1)]:
            data = store.read_batches(TOPIC, 0, segment, segment.base_offset)
            header, body = record.decode_batch(data, 0)
            first_ts = body.column("timestamp").cast(pa.int64())[0].as_py()
            found = consumer.offsets_for_times({(TOPIC, 0): first_ts})[(TOPIC, 0)]
            assert found is not None and found[0] <= segment.base_offset and found[1] >= first_ts, (segment, found)


@pytest.mark.slow
def test_sigkill_during_uploads_keeps_the_manifest_consistent(broker_factory, tmp_path):
    """Uploads throttled to 1 MiB/s of 256 KiB segments; SIGKILL three times while they run,
    more records after each restart: the manifest has no duplicate or overlapping segment, and
    remote plus local hold every record once."""
    broker = tiering_broker(broker_factory, tmp_path, **{"remote.log.manager.copy.max.bytes.per.second": 1 << 20}).start()
    store = RemoteSegmentStore.from_url(f"file://{tmp_path}/remote")
    create_topic(broker.bootstrap, 256 << 10, 256 << 10)
    produced = 0
    for _ in range(3):
        produce(broker.bootstrap, produced, 15_000)
        produced += 15_000
        uploaded = len(manifest_of(store).segments)
        wait_until(lambda: len(manifest_of(store).segments) > uploaded, 60, "an upload commits")
        time.sleep(0.1)  # not a wait: the kill lands somewhere in the next upload, wherever that has got to
        broker.kill()
        check_nothing_local_lost(broker.log_dir, store)
        broker.start()
    wait_until(lambda: all_sealed_tiered(broker, store, 3), 120, "every sealed segment is tiered")
    check_complete(broker.bootstrap, broker.log_dir, store, produced)


@pytest.mark.slow
def test_deleting_a_topic_deletes_its_remote_data(broker_factory, tmp_path):
    """Once some segments are tiered, DeleteTopics removes the topic's remote folder too."""
    broker = tiering_broker(broker_factory, tmp_path).start()
    store = RemoteSegmentStore.from_url(f"file://{tmp_path}/remote")
    create_topic(broker.bootstrap, 16 << 10, 32 << 10)
    produce(broker.bootstrap, 0, 5_000)
    wait_until(lambda: len(manifest_of(store).segments) >= 3, 60, "segments are tiered")
    with Admin(broker.bootstrap) as admin:
        admin.delete_topics([TOPIC])
    wait_until(lambda: not (tmp_path / "remote" / TOPIC).exists(), 30, "the remote folder is gone")
    assert manifest_of(store).version == 0


def test_a_compacted_topic_tiers_and_reads_back_from_offset_0(broker_factory, tmp_path):
    """cleanup.policy=compact with remote.storage.enable (Kafka refuses this): sealed segments
    tier and leave the disk while the cleaner compacts only what tiering does not hold; a
    consumer from offset 0 reads records in offset order, each with the value produced at its
    offset, and the latest record of every key among them."""
    broker = tiering_broker(broker_factory, tmp_path, **{"log.cleaner.backoff.ms": 50}).start()
    store = RemoteSegmentStore.from_url(f"file://{tmp_path}/remote")
    with Admin(broker.bootstrap) as admin:
        admin.create_topic(TOPIC, partitions=1, configs={
            "segment.bytes": 16 << 10, "remote.storage.enable": "true", "cleanup.policy": "compact",
            "local.retention.bytes": 32 << 10, "min.cleanable.dirty.ratio": 0.01})
    keys = 50
    produced = 10_000
    schema = pa.schema([("key", pa.binary()), ("value", pa.binary())])
    with Producer(broker.bootstrap, linger_ms=5) as producer:
        for chunk in range(0, produced, 500):
            ids = range(chunk, chunk + 500)
            producer.send_batch(TOPIC, pa.table({"key": [b"k%d" % (i % keys) for i in ids],
                                                 "value": [value(i) for i in ids]}, schema=schema))
        producer.flush()
    # (No check_nothing_local_lost here, and no count of segments: the cleaner may compact, empty
    # and drop segments before they tier.)
    wait_until(lambda: manifest_of(store).segments and manifest_of(store).log_end_offset
               == local_bases(broker.log_dir)[-1] > 0, 60, "a compacted topic's sealed segments are tiered "
               "and leave the disk")
    manifest = manifest_of(store)
    with Consumer(broker.bootstrap, auto_offset_reset="none") as consumer:
        # The cleaner may have emptied the oldest segments before they tiered (every key recurs):
        # the log then starts at the first segment tiering found non-empty.
        start = consumer.beginning_offsets([(TOPIC, 0)])[(TOPIC, 0)]
        assert start == manifest.log_start_offset
        consumer.assign([(TOPIC, 0)])
        consumer.seek((TOPIC, 0), start)
        offsets: list[int] = []
        latest: dict[bytes, int] = {}
        deadline = time.monotonic() + 60
        while not offsets or offsets[-1] < produced - 1:
            assert time.monotonic() < deadline, f"read up to {offsets[-1] if offsets else None}"
            table = consumer.poll_arrow(timeout_ms=500)
            for offset, key, v in zip(table["offset"].to_pylist(), table["key"].to_pylist(), table["value"].to_pylist()):
                assert v == value(offset)
                offsets.append(offset)
                latest[key] = offset
    assert offsets == sorted(set(offsets)) and offsets[0] >= start
    # Below the remote log end the broker answered exactly what the remote tier holds (segments
    # as they were when uploaded: the cleaner may have compacted them before).
    remote = remote_values(store, manifest)
    assert [o for o in offsets if o < manifest.log_end_offset] == sorted(o for o in remote if o >= start)
    assert latest == {b"k%d" % k: produced - keys + k for k in range(keys)}


def test_a_tampered_remote_segment_answers_corrupt_message(broker_factory, tmp_path):
    """A byte flipped in a tiered segment's `.log` object: a consumer reading there gets
    CORRUPT_MESSAGE (CorruptMessageError) naming the object, never the bad bytes, after every
    record before the bad batch, while the topic's other partition is consumed in full."""
    from common.errors import CorruptMessageError

    broker = tiering_broker(broker_factory, tmp_path).start()
    store = RemoteSegmentStore.from_url(f"file://{tmp_path}/remote")
    create_topic(broker.bootstrap, 16 << 10, 0, partitions=2)
    produce(broker.bootstrap, 0, 3_000)
    produce(broker.bootstrap, 0, 1_000, partition=1)
    wait_until(lambda: len(manifest_of(store).segments) >= 3 and local_bases(broker.log_dir)[0]
               >= manifest_of(store).segments[2].next_offset, 60, "three segments are tiered and deleted locally")
    victim = manifest_of(store).segments[1]
    path = tmp_path / "remote" / TOPIC / "0" / victim.log.name
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF  # inside the last batch's records: only its CRC can tell
    path.write_bytes(bytes(data))
    with Consumer(broker.bootstrap, auto_offset_reset="none") as consumer:
        consumer.assign([(TOPIC, 0), (TOPIC, 1)])
        consumer.seek((TOPIC, 0), 0)
        consumer.seek((TOPIC, 1), 0)
        seen: dict[int, list[int]] = {0: [], 1: []}
        errors = 0
        deadline = time.monotonic() + 30
        while len(seen[1]) < 1_000 or not errors:
            assert time.monotonic() < deadline, f"{len(seen[1])} records of partition 1, {errors} errors"
            try:
                table = consumer.poll_arrow(timeout_ms=500)
            except CorruptMessageError as err:
                assert victim.log.name in str(err)
                # Every record of partition 0 before the bad batch came first, in order, as Kafka's
                # fetcher delivers a partition's records before its error (a batch of the victim).
                assert seen[0] == list(range(len(seen[0]))) and victim.base_offset <= len(seen[0]) < victim.next_offset
                assert consumer.position((TOPIC, 0)) == len(seen[0])
                errors += 1  # and again, until a seek
                continue
            for p in (0, 1):
                seen[p] += table.filter(pa.compute.equal(table["partition"], p))["offset"].to_pylist()
        assert seen[1] == list(range(1_000))


def test_whole_log_retention_expires_remote_segments_and_earliest_moves(broker_factory, tmp_path):
    """retention.bytes over the whole log (remote plus local): the oldest remote segments leave
    the manifest and the store, ListOffsets earliest moves to the new remote log start, and a
    consumer from there reads every remaining record in order."""
    broker = tiering_broker(broker_factory, tmp_path).start()
    store = RemoteSegmentStore.from_url(f"file://{tmp_path}/remote")
    with Admin(broker.bootstrap) as admin:
        admin.create_topic(TOPIC, partitions=1, configs={
            "segment.bytes": 16 << 10, "remote.storage.enable": "true", "local.retention.bytes": 32 << 10,
            "retention.ms": -1, "retention.bytes": 200 << 10})
    produced = 10_000
    produce(broker.bootstrap, 0, produced)
    wait_until(lambda: manifest_of(store).log_start_offset > 0 and manifest_of(store).log_end_offset
               == local_bases(broker.log_dir)[-1], 60, "remote retention removed the oldest segments")
    manifest = manifest_of(store)
    assert manifest.segments[0].base_offset == manifest.log_start_offset
    folder = tmp_path / "remote" / TOPIC / "0"
    wait_until(lambda: sorted(p.name for p in folder.glob("*.log")) == sorted(s.log.name for s in manifest_of(store).segments),
               30, "the expired segments' objects are deleted")
    with Consumer(broker.bootstrap, auto_offset_reset="earliest") as consumer:
        earliest = consumer.beginning_offsets([(TOPIC, 0)])[(TOPIC, 0)]
        assert earliest == manifest_of(store).log_start_offset > 0
    assert consume_from(broker.bootstrap, earliest, produced) == [value(i) for i in range(earliest, produced)]
