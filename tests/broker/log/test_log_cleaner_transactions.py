"""The log cleaner with transactions (Kafka's rules, simplified): aborted data never supersedes
committed data and is removed, markers stay (with the aborted transaction index of their
segment), nothing at or above an open transaction's first offset is cleaned, and an idempotent
producer's batches are cleaned as any other (its sequences are in the producer state)."""
from __future__ import annotations

import pytest

from broker.log import LogCleaner
from segment_format import batch_body, record
from tests.broker.log.appends import append
from tests.helpers.log_cleaning import NOW_MS, read_all

VALUE = b"x" * 200


def keyed(producer_id: int, sequence: int, key: bytes, value: bytes, transactional: bool = False,
          epoch: int = 0) -> bytearray:
    body = batch_body.make_body([value], keys=[key], timestamps_ms=NOW_MS)
    return record.encode_batch(body, producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence,
                               attributes=record.TRANSACTIONAL_BIT if transactional else 0)


def plain(key: bytes, value: bytes) -> bytearray:
    return record.encode_batch(batch_body.make_body([value], keys=[key], timestamps_ms=NOW_MS))


@pytest.fixture
def compacted(logs):
    made: list[LogCleaner] = []

    def open_compacted():
        partition_log = logs.open(cleanup_policy="compact", min_cleanable_dirty_ratio=0.01)
        cleaner = LogCleaner(logs.manager, clock=lambda: NOW_MS, max_keys=10_000)
        made.append(cleaner)
        return partition_log, cleaner

    yield open_compacted
    for cleaner in made:
        cleaner.stop()


def fill(partition_log, count: int, tag: bytes) -> None:
    for i in range(count):
        append(partition_log, plain(b"filler-%d" % i, tag + VALUE))


def test_aborted_data_is_removed_and_never_supersedes_committed_data(compacted):
    """k=committed, then an aborted transaction writes k=aborted: after cleaning, k is still
    "committed", the aborted batch is gone (producer 7 moved on to a new epoch, so the state no
    longer keeps it), the ABORT marker and its index entry stay."""
    partition_log, cleaner = compacted()
    append(partition_log, plain(b"k", b"committed" + VALUE))
    aborted = append(partition_log, keyed(7, 0, b"k", b"aborted" + VALUE, transactional=True)).first_offset
    marker = partition_log.append_transaction_marker(7, 0, False, 0, 0).first_offset
    append(partition_log, keyed(7, 0, b"other", VALUE, epoch=1))
    fill(partition_log, 12, b"a")
    fill(partition_log, 12, b"b")  # supersedes every filler: plenty to clean
    partition_log.maybe_increment_high_watermark(partition_log.log_end_offset)
    partition_log.flush()
    assert cleaner.clean_once(NOW_MS) is not None
    kept = {offset: (key, value) for offset, key, value in read_all(partition_log)}
    assert kept[0] == (b"k", b"committed" + VALUE) and aborted not in kept
    offsets = [h.base_offset for s in partition_log.segments() for _, h in record.iter_batches(s.log_path.read_bytes())]
    assert marker in offsets  # the marker stays
    assert partition_log.collect_aborted_transactions(0, partition_log.log_end_offset) == [(7, aborted)]


def test_nothing_from_an_open_transactions_first_offset_on_is_cleaned(compacted):
    """An open transaction bounds the cleanable range (Kafka's first unstable offset)."""
    partition_log, cleaner = compacted()
    fill(partition_log, 6, b"a")
    open_at = append(partition_log, keyed(7, 0, b"t", VALUE, transactional=True)).first_offset
    fill(partition_log, 12, b"b")
    partition_log.maybe_increment_high_watermark(partition_log.log_end_offset)
    partition_log.flush()
    assert partition_log.cleanable_segments().end_offset <= open_at
    stats = cleaner.clean_once(NOW_MS)
    assert stats is None or stats.end_offset <= open_at


def test_a_cleaned_away_idempotent_batch_is_still_a_duplicate_for_the_producer_state(compacted, logs):
    """Producer 9's batch is superseded by later keys and cleaned away; its sequences live in the
    producer state and its snapshots, not in the batch: a retry of it is still answered with its
    original offset, before and after the log is reopened (recovery starts from the snapshot the
    roll after it took)."""
    partition_log, cleaner = compacted()
    last = append(partition_log, keyed(9, 0, b"filler-0", b"old" + VALUE)).first_offset
    fill(partition_log, 12, b"a")
    fill(partition_log, 12, b"b")
    partition_log.maybe_increment_high_watermark(partition_log.log_end_offset)
    partition_log.flush()
    assert cleaner.clean_once(NOW_MS) is not None
    assert last not in {offset for offset, _, _ in read_all(partition_log)}
    snapshots = partition_log.producers.snapshot_offsets()  # those of merged segments went with them
    assert set(snapshots[:-1]) <= {segment.base_offset for segment in partition_log.segments()}
    retried = partition_log.append_as_leader(keyed(9, 0, b"filler-0", b"old" + VALUE), 0)
    assert retried.first_offset == last
    cleaner.stop()
    logs.crash()  # no clean close: recovery loads the newest snapshot and replays after it
    reopened = logs.open(cleanup_policy="compact", min_cleanable_dirty_ratio=0.01)
    assert reopened.append_as_leader(keyed(9, 0, b"filler-0", b"old" + VALUE), 0).first_offset == last
