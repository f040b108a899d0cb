"""RemoteLogManager (broker/remote_log/remote_log_manager.py) with UnifiedLog's tiered retention: sealed
segments upload in order to a file:// store, the manifest names them, local retention deletes
only what is uploaded, whole-log retention expires remote segments first, outages lose nothing."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from common.errors import OffsetOutOfRangeError
from broker.log import FileCache, UnifiedLog
from broker.remote_log.remote_log_manager import CopyThrottle, RemoteLogManager
from segment_format import record
from tests.broker.log.appends import append
from tests.helpers.logs import SMALL, TOPIC_ID, build_batch
from tiered_storage import ManifestFencedError, RemoteSegmentStore, RemoteStorageError

TIERED = replace(SMALL, remote_storage_enable=True, local_retention_bytes=0, retention_ms=-1)


def open_log(tmp_path: Path, clock, config=TIERED, remote_storage: bool = True, **offsets) -> UnifiedLog:
    return UnifiedLog.open(tmp_path / "data" / "topic-0", "topic", 0, config, topic_id=TOPIC_ID, cache=FileCache(),
                           clock=clock, remote_storage=remote_storage, **offsets)


def fill(partition_log: UnifiedLog, batches: int) -> None:
    for _ in range(batches):
        append(partition_log, build_batch(records=10, value=b"v" * 100))
    partition_log.flush()


@pytest.fixture
def store(tmp_path: Path) -> RemoteSegmentStore:
    return RemoteSegmentStore.from_url(f"file://{tmp_path}/remote")


def manager(store: RemoteSegmentStore, partition_log: UnifiedLog, clock, **options) -> RemoteLogManager:
    """A manager that leads `partition_log`, as the replica manager would tell it."""
    rlm = RemoteLogManager(store, clock=clock, **{"thread_pool_size": 2, **options})
    rlm.on_leadership_change([(partition_log, 0)], [])
    return rlm


def test_sealed_segments_upload_in_order_then_local_retention_deletes_them(tmp_path, clock, store):
    """Every sealed segment is in the manifest; local retention leaves only the active one; the
    log start stays 0 (the whole log) while the local log start moves."""
    partition_log = open_log(tmp_path, clock)
    fill(partition_log, 30)
    sealed = partition_log.segments()[:-1]
    assert len(sealed) >= 3
    assert partition_log.delete_old_segments(clock()) == []  # nothing uploaded: nothing deleted
    rlm = manager(store, partition_log, clock)
    try:
        rlm.run_once()
        manifest = store.load_manifest("topic", 0)
        assert [s.base_offset for s in manifest.segments] == [s.base_offset for s in sealed]
        assert manifest.log_end_offset == partition_log.segments()[-1].base_offset
        assert partition_log.highest_offset_in_remote_storage == manifest.log_end_offset - 1
        removed = partition_log.delete_old_segments(clock())
        assert [s.base_offset for s in removed] == [s.base_offset for s in sealed]
        assert partition_log.log_start_offset == 0
        assert partition_log.local_log_start_offset == manifest.log_end_offset
        with pytest.raises(OffsetOutOfRangeError, match="remote storage"):
            partition_log.read(0, 1 << 20)
        rlm.run_once()  # nothing new: no new manifest version
        assert store.load_manifest("topic", 0).version == manifest.version
    finally:
        rlm.close()
        partition_log.close()


def test_store_outage_deletes_nothing_local_and_retries(tmp_path, clock, store, monkeypatch):
    """While uploads fail, no local segment goes; after the backoff the upload succeeds."""
    partition_log = open_log(tmp_path, clock)
    fill(partition_log, 20)
    segments_before = [s.base_offset for s in partition_log.segments()]

    def down(*args, **kwargs):
        raise RemoteStorageError("store down")
    real_upload = store.upload_segment
    monkeypatch.setattr(store, "upload_segment", down)
    rlm = manager(store, partition_log, clock)
    try:
        rlm.run_once()
        assert rlm.failures == 1
        rlm.run_once()  # backing off: not even tried
        assert rlm.failures == 1
        assert partition_log.delete_old_segments(clock()) == []
        assert [s.base_offset for s in partition_log.segments()] == segments_before
        monkeypatch.setattr(store, "upload_segment", real_upload)
        clock.advance(60_000)
        rlm.run_once()
        assert len(store.load_manifest("topic", 0).segments) == len(segments_before) - 1
        assert len(partition_log.delete_old_segments(clock())) == len(segments_before) - 1
    finally:
        rlm.close()
        partition_log.close()


def test_restart_reads_the_manifest_and_uploads_nothing_twice(tmp_path, clock, store):
    """A new manager (a restarted broker) learns from the manifest what is uploaded."""
    partition_log = open_log(tmp_path, clock)
    fill(partition_log, 20)
    first = manager(store, partition_log, clock)
    first.run_once()
    first.close()
    uploaded = store.load_manifest("topic", 0)
    fill(partition_log, 10)
    second = manager(store, partition_log, clock)
    try:
        second.run_once()
        manifest = store.load_manifest("topic", 0)
        bases = [s.base_offset for s in manifest.segments]
        assert bases == sorted(set(bases))
        assert bases[:len(uploaded.segments)] == [s.base_offset for s in uploaded.segments]
        assert len(bases) == len(partition_log.segments()) - 1
    finally:
        second.close()
        partition_log.close()


def test_whole_log_retention_expires_remote_segments_first(tmp_path, clock, store):
    """retention.bytes over remote plus local: the oldest remote segments leave the manifest,
    their objects are deleted, and the log start offset moves to the new remote start."""
    partition_log = open_log(tmp_path, clock, config=replace(TIERED, local_retention_bytes=-2, retention_bytes=-1))
    fill(partition_log, 30)
    rlm = manager(store, partition_log, clock)
    try:
        rlm.run_once()
        manifest = store.load_manifest("topic", 0)
        keep = manifest.segments[-1].size_bytes + partition_log.segments()[-1].size
        partition_log.update_config(replace(partition_log.config, retention_bytes=keep, local_retention_bytes=0))
        rlm.run_once()
        after = store.load_manifest("topic", 0)
        assert [s.base_offset for s in after.segments] == [manifest.segments[-1].base_offset]
        assert partition_log.log_start_offset == after.log_start_offset == manifest.segments[-1].base_offset
        gone = manifest.segments[0]
        assert not Path(store.object_path("topic", 0, gone.log)).exists()
        removed = partition_log.delete_old_segments(clock())
        assert partition_log.local_log_start_offset == after.log_end_offset
        assert removed
    finally:
        rlm.close()
        partition_log.close()


def test_without_the_broker_flag_the_log_is_not_tiered(tmp_path, clock):
    """remote.storage.enable alone (remote.log.storage.system.enable off) keeps plain retention."""
    partition_log = open_log(tmp_path, clock, config=replace(TIERED, retention_bytes=0), remote_storage=False)
    try:
        fill(partition_log, 20)
        assert not partition_log.tiered
        assert partition_log.delete_old_segments(clock())
        assert partition_log.log_start_offset == partition_log.local_log_start_offset
    finally:
        partition_log.close()


def test_tiered_log_start_survives_reopen(tmp_path, clock, store):
    """The checkpointed log start below the local segments is kept on reopen (the remote part)."""
    partition_log = open_log(tmp_path, clock)
    fill(partition_log, 20)
    rlm = manager(store, partition_log, clock)
    rlm.run_once()
    rlm.close()
    partition_log.delete_old_segments(clock())
    local_start = partition_log.local_log_start_offset
    partition_log.close()
    reopened = open_log(tmp_path, clock, log_start_offset=0, recovery_point=local_start)
    try:
        assert (reopened.log_start_offset, reopened.local_log_start_offset) == (0, local_start)
    finally:
        reopened.close()


def test_copy_throttle_spaces_uploads_by_their_size():
    """At 1000 bytes/s, a second 500-byte upload waits half a second after the first."""
    now = [0.0]
    slept = []
    throttle = CopyThrottle(1000, clock=lambda: now[0], sleep=slept.append)
    assert throttle.acquire(500) == 0.0
    assert throttle.acquire(500) == pytest.approx(0.5)
    assert slept == [pytest.approx(0.5)]


def test_an_upload_killed_before_its_commit_is_redone_and_its_orphans_cleaned(tmp_path, clock, store):
    """Objects uploaded but never named by a manifest (a broker killed before the commit): the
    next manager uploads the segment again under a new attempt and cleans the orphans."""
    partition_log = open_log(tmp_path, clock)
    fill(partition_log, 20)
    first_segment = partition_log.segments()[0]
    RemoteLogManager(store, clock=clock).close()
    rlm = manager(store, partition_log, clock)
    try:
        rlm.run_once()  # a manifest exists from here on
        fill(partition_log, 10)
        manifest = store.load_manifest("topic", 0)
        crashed = store.upload_segment("topic", 0, partition_log.segments()[len(manifest.segments)].files)
        orphan = Path(store.object_path("topic", 0, crashed.log))
        assert orphan.exists()
    finally:
        rlm.close()
    restarted = manager(store, partition_log, clock, orphan_grace_ms=0)
    try:
        restarted.run_once()
        after = store.load_manifest("topic", 0)
        bases = [s.base_offset for s in after.segments]
        assert bases == sorted(set(bases)) and bases[0] == first_segment.base_offset
        assert crashed.base_offset in bases and after.segment_at(crashed.base_offset).upload_id != crashed.upload_id
        assert not orphan.exists()
    finally:
        restarted.close()
        partition_log.close()


def test_the_cleaner_leaves_what_tiering_holds_alone(tmp_path, clock, store):
    """A tiered compacted log: nothing is cleanable until tiering read the manifest; then only
    segments above the remote log end, never the one being uploaded; and a swap of segments that
    became uploaded or pinned after the cleaner read them is refused (an uploaded segment must be
    exactly one local segment, or the records after it would never tier)."""
    compacted = replace(TIERED, cleanup_policy="compact")
    partition_log = open_log(tmp_path, clock, config=compacted)
    fill(partition_log, 30)
    sealed = partition_log.segments()[:-1]
    assert len(sealed) >= 4
    assert partition_log.cleanable_segments().segments == []  # the remote state is not known yet
    partition_log.update_remote_log_state(0, -1)  # an empty manifest read
    before = partition_log.cleanable_segments()
    assert before.segments == sealed
    assert partition_log.pin_for_upload(sealed[0])
    assert partition_log.cleanable_segments().segments == sealed[1:]
    assert not partition_log.replace_segments(sealed[0], sealed[:2], before.generation)  # pinned: refused, nothing changed
    partition_log.unpin_upload()
    partition_log.update_remote_log_state(0, sealed[1].next_offset - 1)  # two segments uploaded
    assert partition_log.cleanable_segments().segments == sealed[2:]
    assert not partition_log.replace_segments(sealed[1], sealed[1:3], before.generation)
    assert partition_log.segments()[:-1] == sealed


def test_a_compacted_tiered_log_uploads_and_expires_nothing_by_retention(tmp_path, clock, store):
    """cleanup.policy=compact tiers like delete does, but retention.ms never removes remote segments."""
    compacted = replace(TIERED, cleanup_policy="compact", retention_ms=1)
    partition_log = open_log(tmp_path, clock, config=compacted)
    fill(partition_log, 30)
    sealed = partition_log.segments()[:-1]
    rlm = manager(store, partition_log, clock)
    try:
        rlm.run_once()
        clock.advance(60_000)
        rlm.run_once()
        manifest = store.load_manifest("topic", 0)
        assert [s.base_offset for s in manifest.segments] == [s.base_offset for s in sealed]
        assert manifest.log_start_offset == 0 and partition_log.log_start_offset == 0
    finally:
        rlm.close()


def test_deleting_a_topic_waits_for_its_upload_in_flight(tmp_path, clock, store, monkeypatch):
    """An upload still running when its topic is deleted finishes (or fails) before the remote
    folder is emptied, so no manifest it commits survives the deletion."""
    import threading

    partition_log = open_log(tmp_path, clock)
    fill(partition_log, 30)
    started, release = threading.Event(), threading.Event()
    upload = store.upload_segment

    def slow_upload(*args, **kwargs):  # type: ignore[no-untyped-def]
        started.set()
        release.wait(10)
        return upload(*args, **kwargs)

    monkeypatch.setattr(store, "upload_segment", slow_upload)
    rlm = manager(store, partition_log, clock)
    try:
        rlm.schedule()
        assert started.wait(10)
        rlm.forget([("topic", 0)])  # the topic's partitions are no longer led here
        deleter = threading.Thread(target=rlm.delete_topic, args=("topic", TOPIC_ID))
        deleter.start()
        deleter.join(0.3)
        assert deleter.is_alive()  # waiting for the upload
        release.set()
        deleter.join(10)
        assert not deleter.is_alive()
        assert store.load_manifest("topic", 0).version == 0
        assert store.fs.find(store.topic_path("topic")) == []
    finally:
        release.set()
        rlm.close()


def copy_log(source: UnifiedLog, target: UnifiedLog) -> None:
    """What replication does: `target` appends `source`'s batches as they are."""
    while target.log_end_offset < source.log_end_offset:
        target.append_as_follower(memoryview(source.read(target.log_end_offset, 1 << 20).read_bytes()))
    target.maybe_increment_high_watermark(target.log_end_offset)
    target.flush()


def local_bytes(partition_log: UnifiedLog, end_offset: int) -> bytes:
    """The log's batches below `end_offset` (a read answers from one segment at a time)."""
    parts, offset = [], 0
    while offset < end_offset:
        data = partition_log.read(offset, 1 << 30, end_offset).read_bytes()
        parts.append(data)
        position = 0
        while position < len(data):
            header = record.read_header(data, position)
            position, offset = position + header.size, header.next_offset
    return b"".join(parts)


def remote_bytes(store: RemoteSegmentStore) -> bytes:
    manifest = store.load_manifest("topic", 0)
    return b"".join(store.read_batches("topic", 0, segment, segment.base_offset) for segment in manifest.segments)


def test_a_new_leader_fences_the_old_one_and_tiers_on_from_where_its_uploads_ended(tmp_path, clock, store):
    """Leader A (epoch 0) tiers. Replica B, holding the same batches in segments that roll
    elsewhere, takes over under epoch 1: it commits the manifest under its epoch first, then
    uploads from where A's uploads ended, the segment straddling that offset from there on. A,
    deposed but not told, commits nothing more; a commit of the very version B wrote, under A's
    epoch, is refused. The remote log is every batch once, in order."""
    a_log = open_log(tmp_path, clock)
    b_log = UnifiedLog.open(tmp_path / "b" / "topic-0", "topic", 0, replace(TIERED, segment_bytes=7_000),
                            topic_id=TOPIC_ID, cache=FileCache(), clock=clock, remote_storage=True)
    fill(a_log, 30)  # one batch per segment here, three in B's
    old = manager(store, a_log, clock)
    new = RemoteLogManager(store, clock=clock, max_backoff_ms=1_000)
    try:
        old.run_once()
        a_end = store.load_manifest("topic", 0).log_end_offset
        fill(a_log, 10)
        copy_log(a_log, b_log)
        assert any(s.base_offset < a_end < s.next_offset for s in b_log.segments()[:-1])  # B's segment straddles it

        new.on_leadership_change([(b_log, 1)], [])
        new.run_once()
        taken = store.load_manifest("topic", 0)
        assert taken.leader_epoch == 1 and taken.segments[0].base_offset == 0
        assert taken.log_end_offset == b_log.segments()[-1].base_offset  # the straddling tail and the rest
        assert remote_bytes(store) == local_bytes(b_log, taken.log_end_offset)

        for _ in range(3):  # the deposed leader goes on tiering
            old.run_once()
            clock.advance(60_000)
        assert store.load_manifest("topic", 0) == taken
        assert "ManifestFencedError" in old.status("topic", 0).last_error
        with pytest.raises(ManifestFencedError):
            store.commit_manifest(taken.version, taken.with_log_start_offset(5).with_leader_epoch(0))
        assert store.load_manifest("topic", 0) == taken
    finally:
        old.close()
        new.close()
        a_log.close()
        b_log.close()


def test_a_follower_reads_the_manifest_and_retains_locally_only_what_is_uploaded(tmp_path, clock, store):
    """A followed tiered log learns from the manifest what the leader uploaded: local retention
    then deletes its uploaded segments (and only those), and its log start follows the remote one.
    It asks for the manifest only while local retention has segments waiting on it."""
    leader_log = open_log(tmp_path, clock)
    follower_log = UnifiedLog.open(tmp_path / "f" / "topic-0", "topic", 0, TIERED, topic_id=TOPIC_ID, cache=FileCache(),
                                   clock=clock, remote_storage=True)
    fill(leader_log, 30)
    copy_log(leader_log, follower_log)
    leading = manager(store, leader_log, clock)
    following = RemoteLogManager(store, clock=clock)
    following.on_leadership_change([], [follower_log])
    try:
        assert follower_log.delete_old_segments(clock()) == []  # nothing known uploaded: nothing deleted
        leading.run_once()
        following.run_once()
        remote_end = store.load_manifest("topic", 0).log_end_offset
        assert follower_log.highest_offset_in_remote_storage == remote_end - 1
        removed = follower_log.delete_old_segments(clock())
        assert removed and max(s.next_offset for s in removed) <= remote_end
        assert follower_log.local_log_start_offset >= remote_end - 1 and follower_log.log_start_offset == 0
        assert store.load_manifest("topic", 0).leader_epoch == 0  # a follower never commits
        # The manifest is read again only when local retention waits on it.
        assert not follower_log.remote_state_wanted(clock())
        fill(leader_log, 10)
        copy_log(leader_log, follower_log)
        assert follower_log.remote_state_wanted(clock())
    finally:
        leading.close()
        following.close()
        leader_log.close()
        follower_log.close()
