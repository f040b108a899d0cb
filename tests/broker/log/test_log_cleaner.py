"""The log cleaner (broker/log/log_cleaner.py) over real logs in tmp_path: latest value per key at
its original offset, the cleanable range (active segment, high watermark, recovery point, compaction
lags), segment grouping, the cleaner checkpoint and dirty-ratio selection, a bounded offset map
cleaning in rounds, tombstone expiry, compact,delete retention, emptied segments, concurrent
appends and fetches, stop() and a clean given up when the log changes under it."""
from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from broker.config import LogConfig
from segment_format.limits import INT32_MAX
from broker.log import LogCleaner, LogManager, TopicLogSpec, UnifiedLog
from broker.log import log_cleaner
from broker.log.checkpoint import read_offsets
from broker.log.log_cleaner import group_segments, max_keys_for
from broker.log.log_manager import CLEANER_CHECKPOINT
from tests.broker.log.appends import append
from tests.helpers.clocks import FakeClock
from tests.helpers.log_cleaning import DAY_MS, NOW_MS, keyed_batch, latest, produce, read_all
from tests.waiting import wait_until

COMPACT = LogConfig(segment_bytes=4096, max_message_bytes=4096, index_interval_bytes=0, retention_ms=-1,
                    cleanup_policy="compact", min_cleanable_dirty_ratio=0.01)

def updates(count: int, keys: int, tag: bytes = b"v", value_bytes: int = 40) -> list[tuple[bytes, bytes]]:
    """`count` records over `keys` keys, each value naming its round (so the latest is knowable)."""
    return [(b"key-%03d" % (i % keys), tag + b"-%05d-" % i + b"x" * value_bytes) for i in range(count)]


@pytest.fixture
def cleaner_for():
    """cleaner_for(manager, **kwargs) -> a LogCleaner on the fake clock's time; stopped at teardown."""
    made: list[LogCleaner] = []

    def make(manager: LogManager, **kwargs: object) -> LogCleaner:
        cleaner = LogCleaner(manager, clock=lambda: NOW_MS, **{"max_keys": 10_000, **kwargs})
        made.append(cleaner)
        return cleaner

    yield make
    for cleaner in made:
        cleaner.stop()


@pytest.fixture
def compacted(logs, cleaner_for):
    """compacted(**config) -> (log, cleaner): topic-0 compacted, with the log fixtures' small
    segments and COMPACT's dirty ratio (LogConfig fields override), and a cleaner on its manager."""
    def open_compacted(**overrides: object) -> tuple[UnifiedLog, LogCleaner]:
        partition_log = logs.open(**{"cleanup_policy": "compact",
                                     "min_cleanable_dirty_ratio": COMPACT.min_cleanable_dirty_ratio, **overrides})
        return partition_log, cleaner_for(logs.manager)
    return open_compacted


# --- what cleaning keeps -----------------------------------------------------------------------


def test_cleaning_keeps_the_latest_value_of_each_key_at_its_offset(compacted):
    """300 updates of 12 keys over many segments: after one round a consumer from the log start
    sees each key's latest value at its original offset (gaps between), and the active segment
    as it was; the log's start, end and recovery point do not move; it shrank."""
    partition_log, cleaner = compacted()
    written = produce(partition_log, updates(300, 12))
    active_base = partition_log.segments()[-1].base_offset
    before = (partition_log.log_start_offset, partition_log.log_end_offset, partition_log.size_bytes())
    stats = cleaner.clean_once(NOW_MS)
    assert stats is not None and stats.end_offset == active_base
    sealed = [entry for entry in written if entry[0] < active_base]
    assert read_all(partition_log) == latest(sealed) + [entry for entry in written if entry[0] >= active_base]
    assert (partition_log.log_start_offset, partition_log.log_end_offset) == before[:2]
    assert partition_log.recovery_point == partition_log.log_end_offset
    assert partition_log.size_bytes() < before[2] / 3
    assert stats.records_removed == len(sealed) - len(latest(sealed)) and stats.bytes_written < stats.bytes_read


def test_null_keys_survive_and_offsets_stay_readable_from_any_position(compacted):
    """Records without a key are not compactable: kept in place. A fetch from any offset, gaps
    included, starts at the next survivor."""
    partition_log, cleaner = compacted()
    records = [(None if i % 7 == 0 else b"k%d" % (i % 5), b"value-%03d-" % i + b"y" * 60) for i in range(200)]
    written = produce(partition_log, records)
    active_base = partition_log.segments()[-1].base_offset
    assert cleaner.clean_once(NOW_MS) is not None
    expected = latest([e for e in written if e[0] < active_base]) + [e for e in written if e[0] >= active_base]
    assert all(e in expected for e in written if e[1] is None)
    for start in range(0, active_base, 7):
        assert read_all(partition_log, start) == [e for e in expected if e[0] >= start]


def test_reopening_a_cleaned_log_finds_the_same_records(compacted, logs):
    """A clean close and a crash both reopen the cleaned segments with the same records and offsets."""
    partition_log, cleaner = compacted()
    produce(partition_log, updates(200, 8))
    cleaner.clean_once(NOW_MS)
    expected, end = read_all(partition_log), partition_log.log_end_offset
    logs.close()
    reopened = logs.open(cleanup_policy="compact")
    assert (read_all(reopened), reopened.log_end_offset) == (expected, end)
    logs.crash()
    reopened = logs.open(cleanup_policy="compact")
    assert (read_all(reopened), reopened.log_end_offset) == (expected, end)


# --- the cleanable range -------------------------------------------------------------------------


def test_nothing_above_the_high_watermark_or_recovery_point_is_cleaned(compacted):
    """Sealed segments holding offsets at or past the high watermark, or past the recovery point
    (a record that supersedes older ones must survive a crash), are left dirty."""
    partition_log, cleaner = compacted()
    produce(partition_log, updates(150, 5))
    segments = partition_log.segments()
    hw = segments[3].base_offset + 1
    partition_log.update_high_watermark(hw)
    cleaner.clean_once(NOW_MS)
    untouched = segments[3:]  # the segment holding hw - 1 and every later one
    assert partition_log.segments()[-len(untouched):] == untouched
    assert read_offsets(logs_dir(partition_log) / CLEANER_CHECKPOINT)[("topic", 0)] == segments[3].base_offset

    partition_log.update_high_watermark(partition_log.log_end_offset)
    produce_unflushed = append(partition_log, keyed_batch(updates(60, 5, b"w")[:5]))
    assert partition_log.recovery_point <= produce_unflushed.first_offset
    view = partition_log.cleanable_segments()
    assert view.end_offset == min(partition_log.recovery_point, partition_log.segments()[-1].base_offset)
    assert all(segment.next_offset <= view.end_offset for segment in view.segments)


def logs_dir(partition_log: UnifiedLog) -> Path:
    return partition_log.directory.parent


def test_min_compaction_lag_keeps_young_segments_dirty(compacted):
    """Segments whose newest record is younger than min.compaction.lag.ms are not cleaned yet."""
    partition_log, cleaner = compacted(min_compaction_lag_ms=60_000)
    produce(partition_log, updates(60, 4), timestamp_ms=NOW_MS - 120_000)
    produce(partition_log, updates(60, 4, b"young"), timestamp_ms=NOW_MS - 1_000)
    first_young = next(s for s in partition_log.segments() if s.max_timestamp > NOW_MS - 60_000)
    stats = cleaner.clean_once(NOW_MS)
    assert stats is not None and 0 < stats.end_offset == first_young.base_offset <= 60
    assert cleaner.clean_once(NOW_MS) is None  # the rest is too young
    assert cleaner.clean_once(NOW_MS + 60_000) is not None


def test_max_compaction_lag_cleans_a_log_below_its_dirty_ratio(compacted):
    """A log below min.cleanable.dirty.ratio is cleaned anyway once its oldest dirty batch is
    older than max.compaction.lag.ms."""
    partition_log, cleaner = compacted(min_cleanable_dirty_ratio=1.0, max_compaction_lag_ms=3_600_000)
    produce(partition_log, updates(50, 50))  # distinct keys: nothing to remove
    assert cleaner.clean_once(NOW_MS) is not None  # wholly dirty: the ratio is 1.0
    produce(partition_log, updates(60, 3, b"late"))
    ltc = cleaner.log_to_clean(partition_log, NOW_MS + 3_600_000)
    assert ltc is not None and ltc.dirty_ratio < 1.0 and not ltc.due
    ltc = cleaner.log_to_clean(partition_log, NOW_MS + 3_600_001)
    assert ltc is not None and ltc.max_lag_exceeded and ltc.due
    assert cleaner.clean_once(NOW_MS + 3_600_001) is not None


# --- grouping ------------------------------------------------------------------------------------


@dataclass
class FakeSegment:
    base_offset: int
    next_offset: int
    size: int


@pytest.mark.parametrize(
    "sizes, max_bytes, expected",
    [([100, 100, 100], 250, [[0, 1], [2]]),
     ([100, 100, 100], 300, [[0, 1, 2]]),
     ([500, 10, 10], 100, [[0], [1, 2]]),
     ([0, 0, 100, 0], 100, [[0, 1, 2, 3]]),
     ([60, 50, 50, 60], 100, [[0], [1, 2], [3]])],
    ids=["fill_then_start_again", "exactly_full", "oversize_segment_alone", "empty_segments_join", "greedy_in_order"],
)
def test_groups_fit_segment_bytes(sizes, max_bytes, expected):
    """Consecutive segments join a group while their bytes fit segment.bytes; one larger than that
    is a group alone."""
    segments = [FakeSegment(i * 10, i * 10 + 10, size) for i, size in enumerate(sizes)]
    groups = group_segments(segments, max_bytes)  # type: ignore[arg-type]
    assert [[segments.index(s) for s in group] for group in groups] == expected


def test_groups_keep_offsets_within_the_index_relative_offsets():
    """A group never spans more than 2^31-1 offsets from its base: the cleaned segment's offset
    index stores int32 relative offsets."""
    segments = [FakeSegment(0, 10, 10), FakeSegment(10, INT32_MAX, 10), FakeSegment(INT32_MAX, INT32_MAX + 5, 10)]
    groups = group_segments(segments, 1 << 20)  # type: ignore[arg-type]
    assert groups == [segments[:2], segments[2:]]


def test_cleaned_segments_stay_within_segment_bytes(compacted):
    """Segments that cleaning made small are merged by the next round (groups go by the bytes
    read), never past segment.bytes."""
    partition_log, cleaner = compacted()
    produce(partition_log, [(b"k%03d" % i, b"v" * 300) for i in range(120)])  # one batch a segment
    produce(partition_log, [(b"k%03d" % i, b"w" * 300) for i in range(120) if i % 5])  # 4 of each 5 again
    assert cleaner.clean_once(NOW_MS) is not None
    shrunk = [segment for segment in partition_log.segments()[:-1] if segment.next_offset <= 100]
    assert all(segment.size < COMPACT.segment_bytes / 2 for segment in shrunk)
    produce(partition_log, updates(20, 2))  # something dirty: the next round
    assert cleaner.clean_once(NOW_MS) is not None
    merged = [segment for segment in partition_log.segments()[:-1] if segment.next_offset <= 100]
    assert len(merged) <= (len(shrunk) + 1) // 2
    assert all(segment.size <= COMPACT.segment_bytes for segment in partition_log.segments())


# --- the checkpoint and the choice of log ----------------------------------------------------------


def open_manager(directory: Path, topics: dict[str, LogConfig]) -> tuple[LogManager, dict[str, UnifiedLog]]:
    manager = LogManager(directory, FakeClock(NOW_MS))
    opened = manager.load({name: TopicLogSpec(None, config, 1) for name, config in topics.items()})
    return manager, {name: opened[(name, 0)] for name in topics}


def test_the_dirtiest_due_log_is_cleaned_first_and_the_checkpoint_remembers(tmp_path, cleaner_for):
    """Of the compacted logs the one with the highest dirty ratio goes first; one below its
    min.cleanable.dirty.ratio (1.0: only a wholly dirty log) and a delete-policy log are not
    chosen. The first dirty offsets survive a restart, and a cleaned log is not due again until
    new records arrive."""
    topics = {"mild": replace(COMPACT, min_cleanable_dirty_ratio=0.5), "wild": replace(COMPACT, min_cleanable_dirty_ratio=0.5),
              "calm": replace(COMPACT, min_cleanable_dirty_ratio=1.0), "plain": replace(COMPACT, cleanup_policy="delete")}
    manager, opened = open_manager(tmp_path / "data", topics)
    try:
        for name in topics:
            produce(opened[name], updates(200, 10))
        cleaner = cleaner_for(manager)
        cleaner.clean_once(NOW_MS)  # one of them: all three compacted logs are wholly dirty
        cleaner.clean_once(NOW_MS)
        cleaner.clean_once(NOW_MS)
        assert cleaner.clean_once(NOW_MS) is None
        for name in ("mild", "wild", "calm"):
            produce(opened[name], updates({"mild": 100, "wild": 400, "calm": 400}[name], 10, b"again"))
        ratios = {name: cleaner.log_to_clean(opened[name], NOW_MS).dirty_ratio for name in ("mild", "wild", "calm")}
        assert 0.5 <= ratios["mild"] < ratios["wild"] and ratios["calm"] < 1.0
        stats = cleaner.clean_once(NOW_MS)
        assert stats is not None and "wild" in stats.log
        due = {name for name in topics if (ltc := cleaner.log_to_clean(opened[name], NOW_MS)) is not None and ltc.due}
        assert due == {"mild"}
        assert cleaner.log_to_clean(opened["plain"], NOW_MS) is None
        checkpointed = read_offsets(tmp_path / "data" / CLEANER_CHECKPOINT)
        assert set(checkpointed) == {("mild", 0), ("wild", 0), ("calm", 0)}
        assert checkpointed[("wild", 0)] == opened["wild"].segments()[-1].base_offset
    finally:
        manager.close()
    manager, opened = open_manager(tmp_path / "data", topics)
    try:
        assert manager.first_dirty_offset(opened["wild"]) == checkpointed[("wild", 0)]
        assert cleaner_for(manager).log_to_clean(opened["wild"], NOW_MS).dirty_bytes == 0
    finally:
        manager.close()


def test_a_deleted_topic_leaves_the_cleaner_checkpoint(tmp_path, cleaner_for):
    """Deleting a compacted topic drops its first dirty offset: re-created, it starts wholly dirty."""
    manager, opened = open_manager(tmp_path / "data", {"gone": COMPACT})
    try:
        produce(opened["gone"], updates(100, 4))
        assert cleaner_for(manager).clean_once(NOW_MS) is not None
        assert ("gone", 0) in read_offsets(tmp_path / "data" / CLEANER_CHECKPOINT)
        manager.delete_topic("gone")
        assert read_offsets(tmp_path / "data" / CLEANER_CHECKPOINT) == {}
        recreated = manager.create_logs("gone", TopicLogSpec(None, COMPACT, 1), [0])[0]
        assert manager.first_dirty_offset(recreated) is None
    finally:
        manager.close()


# --- the dedupe buffer ---------------------------------------------------------------------------


def test_a_small_dedupe_buffer_cleans_in_rounds(compacted, cleaner_for, logs):
    """With room for 6 keys and 30 distinct ones, each round maps what fits (two batches) and
    cleans up to there; the checkpoint moves on each time, and the rounds together reach the
    result of one unbounded round: each key's latest record only."""
    partition_log, _ = compacted()
    written = produce(partition_log, updates(240, 30, value_bytes=20), per_batch=3)
    cleaner = cleaner_for(logs.manager, max_keys=6)
    active_base = partition_log.segments()[-1].base_offset
    ends = []
    while (stats := cleaner.clean_once(NOW_MS)) is not None:
        ends.append(stats.end_offset)
        assert stats.map_keys <= 6
    assert len(ends) > 3 and ends == sorted(ends) and ends[-1] == active_base
    sealed = [e for e in read_all(partition_log) if e[0] < active_base]
    assert sealed == latest([e for e in written if e[0] < active_base])
    assert cleaner.uncleanable == []


def test_a_batch_with_more_keys_than_the_buffer_marks_the_log_uncleanable(compacted, cleaner_for, logs, caplog):
    """A dedupe buffer smaller than one batch's distinct keys cannot clean anything: the log is
    logged and skipped (not retried in a loop); the data is untouched."""
    partition_log, _ = compacted()
    produce(partition_log, updates(60, 20), per_batch=10)
    before = read_all(partition_log)
    cleaner = cleaner_for(logs.manager, max_keys=5)
    assert cleaner.clean_once(NOW_MS) is None
    assert cleaner.uncleanable == [partition_log] and "log.cleaner.dedupe.buffer.size" in caplog.text
    assert cleaner.clean_once(NOW_MS) is None and read_all(partition_log) == before


def test_dedupe_buffer_bytes_translate_to_keys():
    """128 bytes a key: the default 128 MiB maps 1M keys."""
    assert max_keys_for(128 << 20) == 1 << 20
    assert max_keys_for(64 << 10) == 512


# --- tombstones ------------------------------------------------------------------------------------


def test_tombstones_expire_after_delete_retention_even_once_clean(compacted):
    """A tombstone removes its key's older values at once and stays for delete.retention.ms; a
    later round (the tombstone now in the clean section) removes it once that has passed."""
    partition_log, cleaner = compacted(delete_retention_ms=DAY_MS)
    produce(partition_log, updates(100, 5), timestamp_ms=NOW_MS)
    deleted = produce(partition_log, [(b"key-001", None), (b"key-003", None)], timestamp_ms=NOW_MS)
    produce(partition_log, [(b"other-%d" % i, b"z" * 200) for i in range(20)])  # pushes them out of the active segment
    assert cleaner.clean_once(NOW_MS) is not None
    keys = {key: value for _, key, value in read_all(partition_log)}
    assert keys[b"key-001"] is None and keys[b"key-003"] is None
    assert [e for e in read_all(partition_log) if e[1] == b"key-001"] == [deleted[0]]
    produce(partition_log, [(b"more-%d" % i, b"z" * 200) for i in range(40)])
    assert cleaner.clean_once(NOW_MS + DAY_MS - 1) is not None
    assert b"key-001" in {key for _, key, _ in read_all(partition_log)}  # not expired yet
    produce(partition_log, [(b"more-%d" % i, b"q" * 200) for i in range(40)])
    stats = cleaner.clean_once(NOW_MS + DAY_MS + 1)
    assert stats is not None and stats.compaction.tombstones_removed == 2
    assert not {b"key-001", b"key-003"} & {key for _, key, _ in read_all(partition_log)}


def test_segments_cleaned_to_nothing_keep_the_log_start_and_end(compacted, logs):
    """Every record of the sealed segments superseded or an expired tombstone: the cleaned
    segments are empty, yet the log start, the LEO and the active segment stay; fetching from
    the start lands on the first survivor; a restart agrees."""
    partition_log, cleaner = compacted(delete_retention_ms=0)
    produce(partition_log, updates(100, 4), timestamp_ms=NOW_MS - 10)
    produce(partition_log, [(b"key-%03d" % i, None) for i in range(4)], timestamp_ms=NOW_MS - 10)
    tail = produce(partition_log, [(b"tail-%d" % i, b"t" * 300) for i in range(12)])
    active_base = partition_log.segments()[-1].base_offset
    start, end = partition_log.log_start_offset, partition_log.log_end_offset
    assert cleaner.clean_once(NOW_MS) is not None
    assert (partition_log.log_start_offset, partition_log.log_end_offset) == (start, end)
    assert read_all(partition_log) == tail
    assert partition_log.segments()[0].base_offset == start and partition_log.segments()[-1].base_offset == active_base
    logs.crash()
    reopened = logs.open(cleanup_policy="compact")
    assert (reopened.log_start_offset, reopened.log_end_offset) == (start, end)
    assert read_all(reopened) == tail


# --- retention -------------------------------------------------------------------------------------


def test_compact_delete_topics_get_retention_and_compact_ones_do_not(compacted, logs):
    """cleanup.policy=compact,delete: old segments go by retention.ms after cleaning; the same
    log with compact alone keeps them (only segments below the log start go)."""
    partition_log, cleaner = compacted(cleanup_policy="compact", retention_ms=60_000)
    produce(partition_log, updates(120, 30), timestamp_ms=NOW_MS - 120_000)
    new = produce(partition_log, [(b"new-%03d" % i, b"n" * 100) for i in range(40)], timestamp_ms=NOW_MS)
    assert cleaner.clean_once(NOW_MS) is not None
    assert partition_log.delete_old_segments(NOW_MS) == []
    logs.close()
    partition_log = logs.open(cleanup_policy="compact,delete", retention_ms=60_000)
    removed = partition_log.delete_old_segments(NOW_MS)
    assert removed and partition_log.log_start_offset > 0
    assert all(segment.max_timestamp < NOW_MS - 60_000 for segment in removed)
    assert set(new) <= set(read_all(partition_log))


def test_empty_cleaned_segments_do_not_stop_retention(compacted):
    """An emptied segment at the head of a compact,delete log goes with the next expired segment
    instead of holding retention back."""
    partition_log, cleaner = compacted(cleanup_policy="compact,delete", retention_ms=60_000, delete_retention_ms=0)
    produce(partition_log, updates(80, 2), timestamp_ms=NOW_MS - 120_000)
    produce(partition_log, [(b"key-000", None), (b"key-001", None)], timestamp_ms=NOW_MS - 120_000)
    produce(partition_log, [(b"old-%d" % i, b"o" * 300) for i in range(12)], timestamp_ms=NOW_MS - 120_000)
    produce(partition_log, [(b"new-%d" % i, b"n" * 300) for i in range(12)], timestamp_ms=NOW_MS)
    assert cleaner.clean_once(NOW_MS) is not None
    assert partition_log.segments()[0].size == 0
    removed = partition_log.delete_old_segments(NOW_MS)
    assert removed and removed[0].size == 0 and any(segment.size for segment in removed)
    assert {key for _, key, _ in read_all(partition_log)} >= {b"new-%d" % i for i in range(12)}


# --- concurrency -----------------------------------------------------------------------------------


def test_a_fetch_slice_taken_before_a_swap_reads_the_old_bytes(compacted):
    """A fetch response owns a descriptor of the segment it reads: a swap (renames, delayed
    delete) does not change the bytes it sends."""
    partition_log, cleaner = compacted()
    produce(partition_log, updates(200, 6))
    first = partition_log.segments()[0]
    fetched = partition_log.read(0, 1 << 20)
    before = fetched.read_bytes()
    assert cleaner.clean_once(NOW_MS) is not None
    assert partition_log.segments()[0] is not first and first.log_path.name.endswith(".deleted")
    assert fetched.read_bytes() == before
    fetched.close()


def test_appends_and_fetches_carry_on_while_the_cleaner_runs(compacted, cleaner_for, logs):
    """A producer and a consumer on other threads while the cleaner cleans round after round: every
    fetch decodes, every acknowledged record's key ends with its latest value, offsets only grow."""
    partition_log, _ = compacted()
    written = produce(partition_log, updates(200, 10))
    cleaner = cleaner_for(logs.manager, backoff_ms=1)
    done = threading.Event()
    errors: list[BaseException] = []

    def producer() -> None:
        try:
            for i in range(100):
                written.extend(produce(partition_log, updates(10, 10, b"p%03d" % i), per_batch=5))
                if i == 50:  # half way, the cleaner must have swapped segments under the readers
                    wait_until(lambda: cleaner.logs_cleaned > 0, 30, "the cleaner cleans a log", 0.005)
        except BaseException as err:  # reported by the main thread
            errors.append(err)
        finally:
            done.set()

    def consumer() -> None:
        try:
            while not done.is_set():
                seen = read_all(partition_log)
                offsets = [offset for offset, _, _ in seen]
                assert offsets == sorted(set(offsets))
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=producer), threading.Thread(target=consumer)]
    cleaner.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    cleaner.stop()
    assert not errors, errors
    final = {key: (offset, value) for offset, key, value in read_all(partition_log)}
    assert final == {key: (offset, value) for offset, key, value in latest(written)}


# --- giving up -----------------------------------------------------------------------------------------


def test_stop_gives_up_a_clean_between_batches(compacted, monkeypatch):
    """stop() during a clean: the cleaned file in progress is deleted, the log is as it was, the
    checkpoint did not move, and the log is not marked uncleanable."""
    partition_log, cleaner = compacted()
    produce(partition_log, updates(200, 6))
    before = (read_all(partition_log), partition_log.segments())
    real_compact = log_cleaner.compact_batches

    def stop_then_compact(*args, **kwargs):  # type: ignore[no-untyped-def]
        cleaner._stopping.set()  # as stop() does, from within the first group's clean
        return real_compact(*args, **kwargs)

    monkeypatch.setattr(log_cleaner, "compact_batches", stop_then_compact)
    assert cleaner.clean_once(NOW_MS) is None
    assert (read_all(partition_log), partition_log.segments()) == before
    assert not list(partition_log.directory.glob("*.cleaned")) and cleaner.uncleanable == []
    assert cleaner.logs.first_dirty_offset(partition_log) is None


def test_a_clean_racing_a_truncation_is_given_up(compacted, monkeypatch):
    """A truncation (a follower's) rewrites a sealed segment while it is being cleaned: the swap
    sees the log changed and gives up; nothing cleaned replaces the truncated log."""
    partition_log, cleaner = compacted()
    produce(partition_log, updates(200, 6))
    cut = partition_log.segments()[2].base_offset + 2
    real_write = LogCleaner._write_cleaned

    def write_then_truncate(self, ltc, group, *args):  # type: ignore[no-untyped-def]
        cleaned = real_write(self, ltc, group, *args)
        partition_log.truncate_to(cut)
        return cleaned

    monkeypatch.setattr(LogCleaner, "_write_cleaned", write_then_truncate)
    assert cleaner.clean_once(NOW_MS) is None
    assert partition_log.log_end_offset <= cut
    assert not list(partition_log.directory.glob("*.cleaned")) and not list(partition_log.directory.glob("*.swap"))
    assert cleaner.uncleanable == [] and cleaner.logs.first_dirty_offset(partition_log) is None


def test_the_thread_starts_wakes_and_stops(compacted):
    """start() runs rounds on the cleaner thread, wake() skips the backoff, stop() joins it."""
    partition_log, cleaner = compacted()
    cleaner.backoff_ms = 3_600_000
    cleaner.start()
    produce(partition_log, updates(200, 6))
    cleaner.wake()
    wait_until(lambda: cleaner.logs_cleaned > 0, 30, "the cleaner cleans a log", 0.005)
    cleaner.stop()
    assert cleaner.logs_cleaned == 1 and cleaner._thread is None
