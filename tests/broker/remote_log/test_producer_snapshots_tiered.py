"""Tiered segments carry the producer state at their end (KIP-405's producer snapshot): a follower
rebuilt from the tier knows the producers, and old manifest entries without one still read."""
from __future__ import annotations

import os

from broker.log import FileCache, UnifiedLog
from broker.log.producer_state import SNAPSHOT_SUFFIX, decode_snapshot
from segment_format.manifest import RemoteSegment
from tests.broker.log.appends import append
from dataclasses import replace
from pathlib import Path

import pytest

from broker.remote_log.remote_log_manager import RemoteLogManager
from tests.helpers.logs import SMALL, TOPIC_ID, idempotent_batch as idem
from tiered_storage import RemoteSegmentStore

R = 3
TIERED = replace(SMALL, remote_storage_enable=True, local_retention_bytes=0, retention_ms=-1)


def open_log(tmp_path: Path, clock) -> UnifiedLog:
    return UnifiedLog.open(tmp_path / "data" / "topic-0", "topic", 0, TIERED, topic_id=TOPIC_ID, cache=FileCache(),
                           clock=clock, remote_storage=True)


@pytest.fixture
def store(tmp_path: Path) -> RemoteSegmentStore:
    return RemoteSegmentStore.from_url(f"file://{tmp_path}/remote")


def manager(store: RemoteSegmentStore, partition_log: UnifiedLog, clock) -> RemoteLogManager:
    """A manager that leads `partition_log`."""
    rlm = RemoteLogManager(store, clock=clock, thread_pool_size=2)
    rlm.on_leadership_change([(partition_log, 0)], [])
    return rlm


def test_uploaded_segments_carry_the_producer_state_at_their_end(tmp_path, clock, store):
    """Each remote segment's snapshot is the state of the batches below its next offset."""
    partition_log = open_log(tmp_path, clock)
    for sequence in range(0, 7 * R, R):
        append(partition_log, idem(7, 0, sequence))
    partition_log.flush()
    rlm = manager(store, partition_log, clock)
    try:
        rlm.run_once()
        manifest = store.load_manifest("topic", 0)
        assert len(manifest.segments) >= 2
        for segment in manifest.segments:
            data = store.read_optional_object("topic", 0, segment, "snapshot")
            entries = decode_snapshot(data, "test")
            assert entries[7].last_offset == segment.next_offset - 1
    finally:
        rlm.close()
        partition_log.close()


def test_a_missing_snapshot_is_rebuilt_before_the_upload(tmp_path, clock, store):
    """The roll's snapshot is gone (an older log): one is built from the log and uploaded."""
    partition_log = open_log(tmp_path, clock)
    for sequence in range(0, 7 * R, R):
        append(partition_log, idem(7, 0, sequence))
    partition_log.flush()
    first_end = partition_log.segments()[0].next_offset
    os.unlink(partition_log.directory / f"{first_end:020d}{SNAPSHOT_SUFFIX}")
    rlm = manager(store, partition_log, clock)
    try:
        rlm.run_once()
        segment = store.load_manifest("topic", 0).segments[0]
        entries = decode_snapshot(store.read_optional_object("topic", 0, segment, "snapshot"), "test")
        assert entries[7].last_offset == first_end - 1 and entries[7].last_seq == first_end - 1
    finally:
        rlm.close()
        partition_log.close()


def test_a_follower_rebuilt_from_the_tier_dedups_a_retry(tmp_path, clock, store):
    """rebuild_from_remote with the last segment's snapshot: the follower, made leader, answers a
    retry of a batch below the remote log end with its original offsets."""
    leader_log = open_log(tmp_path, clock)
    for sequence in range(0, 7 * R, R):
        append(leader_log, idem(7, 0, sequence))
    leader_log.flush()
    follower_log = UnifiedLog.open(tmp_path / "f" / "topic-0", "topic", 0, TIERED, topic_id=TOPIC_ID,
                                   cache=FileCache(), clock=clock, remote_storage=True)
    rlm = manager(store, leader_log, clock)
    try:
        rlm.run_once()
        manifest = store.load_manifest("topic", 0)
        end = manifest.log_end_offset
        follower_log.rebuild_from_remote(end, manifest.log_start_offset, manifest.leader_epochs,
                                         rlm.producer_snapshot(follower_log, manifest))
        assert follower_log.log_end_offset == end
        retry = follower_log.append_as_leader(idem(7, 0, end - R), 1)
        assert (retry.first_offset, follower_log.log_end_offset) == (end - R, end)
        assert follower_log.append_as_leader(idem(7, 0, end), 1).first_offset == end
    finally:
        rlm.close()
        leader_log.close()
        follower_log.close()


def test_manifest_entries_without_a_snapshot_still_read():
    """An entry from before snapshots (three objects) parses; its snapshot is None."""
    entry = {"format_version": 1, "base_offset": 0, "next_offset": 3, "min_timestamp": 1, "max_timestamp": 2,
             "size_bytes": 10, "record_count": 3, "leader_epochs": [[0, 0]], "crc32c": 5,
             "upload_id": "0123456789abcdef",
             "objects": {kind: {"name": f"{0:020d}-0123456789abcdef.{kind}", "size_bytes": 10 if kind == "log" else 0,
                                "crc32c": 5 if kind == "log" else 0} for kind in ("log", "index", "timeindex")}}
    segment = RemoteSegment.from_dict(entry)
    assert segment.object_of("snapshot") is None and len(segment.objects()) == 3
    with_snapshot = RemoteSegment.from_dict(
        {**entry, "objects": {**entry["objects"], "snapshot": {"name": f"{0:020d}-0123456789abcdef.snapshot",
                                                              "size_bytes": 4, "crc32c": 1}}})
    assert with_snapshot.object_of("snapshot").size_bytes == 4
    assert RemoteSegment.from_dict(with_snapshot.to_dict()) == with_snapshot


def test_aborted_transactions_tier_with_their_segments_and_read_back(tmp_path, clock, store):
    """The `.txnindex` of a segment holding an ABORT marker uploads with it; the tier answers
    collect_aborted_transactions as the local log does."""
    from segment_format import record

    partition_log = open_log(tmp_path, clock)
    for sequence in range(0, 3 * R, R):
        append(partition_log, idem(7, 0, sequence, attributes=record.TRANSACTIONAL_BIT))
    partition_log.append_transaction_marker(7, 0, False, 0, 0)
    for sequence in range(0, 4 * R, R):
        append(partition_log, idem(8, 0, sequence))
    partition_log.flush()
    rlm = manager(store, partition_log, clock)
    try:
        rlm.run_once()
        manifest = store.load_manifest("topic", 0)
        end = manifest.log_end_offset
        assert sum(1 for s in manifest.segments if s.object_of("txnindex") is not None) == 1
        local = partition_log.collect_aborted_transactions(0, end)
        assert local == [(7, 0)]
        assert store.collect_aborted_transactions("topic", 0, manifest, 0, end) == local
        assert store.collect_aborted_transactions("topic", 0, manifest, 3 * R + 1, end) == []
    finally:
        rlm.close()
        partition_log.close()
