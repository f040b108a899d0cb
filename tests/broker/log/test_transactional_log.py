"""UnifiedLog's transactional layer: markers end transactions, the last stable offset waits for
them, ABORT markers index their transactions per segment; followers, recovery and truncation
rebuild the same state."""
from __future__ import annotations

import os

import pytest

from broker.log import UnifiedLog
from common.errors import (
    InvalidProducerEpochError,
    InvalidRecordError,
    InvalidTxnStateError,
    TransactionCoordinatorFencedError,
)
from segment_format import control_batch, record, txn_index
from segment_format.layout import TXN_INDEX_SUFFIX
from tests.broker.log.appends import append
from tests.helpers.logs import SMALL, idempotent_batch

R = 3


def txn(producer_id: int, sequence: int, epoch: int = 0) -> bytearray:
    return idempotent_batch(producer_id, epoch, sequence, attributes=record.TRANSACTIONAL_BIT)


def mark(partition_log: UnifiedLog, producer_id: int, commit: bool, epoch: int = 0, coordinator_epoch: int = 0):
    info = partition_log.append_transaction_marker(producer_id, epoch, commit, coordinator_epoch, 0)
    partition_log.maybe_increment_high_watermark(partition_log.log_end_offset)
    return info


def txn_index_files(partition_log: UnifiedLog) -> dict[int, list[txn_index.AbortedTxn]]:
    out = {}
    for name in sorted(os.listdir(partition_log.directory)):
        if name.endswith(TXN_INDEX_SUFFIX):
            base = int(name[:20])
            out[base] = txn_index.parse((partition_log.directory / name).read_bytes(), name, base)
    return out


def test_the_lso_is_held_by_an_open_transaction_and_released_by_its_marker(unified_log):
    """Plain data moves the HW; an open transaction keeps the LSO at its first offset until COMMIT."""
    partition_log = unified_log(segment_bytes=1 << 20)
    append(partition_log, idempotent_batch(1, 0, 0))
    append(partition_log, txn(7, 0))
    append(partition_log, idempotent_batch(1, 0, R))
    assert (partition_log.high_watermark, partition_log.last_stable_offset) == (3 * R, R)
    info = mark(partition_log, 7, commit=True)
    assert info.first_offset == 3 * R and partition_log.last_stable_offset == 3 * R + 1
    assert partition_log.collect_aborted_transactions(0, partition_log.last_stable_offset) == []


def test_an_abort_marker_indexes_the_transaction_in_the_segment_holding_it(unified_log):
    """Two transactions interleaved, one aborted: its (producer, first offset) is collected."""
    partition_log = unified_log(segment_bytes=1 << 20)
    append(partition_log, txn(7, 0))
    append(partition_log, txn(8, 0))
    append(partition_log, txn(7, R))
    mark(partition_log, 7, commit=False)
    assert partition_log.last_stable_offset == R  # producer 8's transaction is still open
    mark(partition_log, 8, commit=True)
    assert partition_log.last_stable_offset == partition_log.log_end_offset
    assert partition_log.collect_aborted_transactions(0, partition_log.log_end_offset) == [(7, 0)]
    assert partition_log.collect_aborted_transactions(3 * R + 1, partition_log.log_end_offset) == []
    assert txn_index_files(partition_log) == {0: [txn_index.AbortedTxn(7, 0, 3 * R, R)]}


def test_markers_are_fenced_by_producer_and_coordinator_epochs(unified_log):
    """An older producer epoch or coordinator epoch than the last seen: refused, nothing written."""
    partition_log = unified_log(segment_bytes=1 << 20)
    append(partition_log, txn(7, 0, epoch=2))
    mark(partition_log, 7, commit=True, epoch=2, coordinator_epoch=5)
    end = partition_log.log_end_offset
    with pytest.raises(InvalidProducerEpochError):
        mark(partition_log, 7, commit=False, epoch=1, coordinator_epoch=5)
    with pytest.raises(TransactionCoordinatorFencedError):
        mark(partition_log, 7, commit=False, epoch=2, coordinator_epoch=4)
    assert partition_log.log_end_offset == end
    mark(partition_log, 9, commit=False)  # no transaction here: written all the same (Kafka does)
    assert partition_log.log_end_offset == end + 1


def test_a_producer_may_not_write_a_control_batch_nor_leave_its_transaction_unmarked(unified_log):
    """A forged marker is INVALID_RECORD; plain data inside a transaction is INVALID_TXN_STATE."""
    partition_log = unified_log(segment_bytes=1 << 20)
    forged = control_batch.encode_marker(7, 0, True, 0, 1_000)
    with pytest.raises(InvalidRecordError):
        append(partition_log, forged)
    append(partition_log, txn(7, 0))
    with pytest.raises(InvalidTxnStateError):
        append(partition_log, idempotent_batch(7, 0, R))
    assert partition_log.log_end_offset == R


def test_markers_round_trip():
    """Kafka's marker bytes in the key and value; decode gives them back."""
    batch = control_batch.encode_marker(7, 3, False, 11, 1_000)
    header = record.validate_batch(batch)
    assert header.is_control and header.is_transactional and header.producer_epoch == 3
    assert control_batch.decode_marker(batch) == control_batch.EndTransactionMarker(False, 11)
    body = record.decode_body(batch, header)
    assert body.column("key")[0].as_py() == bytes.fromhex("00000000")
    assert body.column("value")[0].as_py() == bytes.fromhex("00000000000b")


def follower_copy(leader: UnifiedLog, follower: UnifiedLog) -> None:
    for segment in leader.segments():
        data = segment.log_path.read_bytes()
        for position, header in record.iter_batches(data):
            if header.base_offset >= follower.log_end_offset:
                follower.append_as_follower(data[position:position + header.size])
    follower.maybe_increment_high_watermark(leader.high_watermark)


def build_history(partition_log: UnifiedLog) -> None:
    """Across several segments: an aborted, a committed and an open transaction."""
    for sequence in range(0, 3 * R, R):
        append(partition_log, txn(7, sequence))
    append(partition_log, txn(8, 0))
    mark(partition_log, 7, commit=False)
    append(partition_log, txn(8, R))
    mark(partition_log, 8, commit=True)
    append(partition_log, txn(9, 0))
    append(partition_log, txn(7, 3 * R))


def test_a_follower_has_the_leaders_lso_and_transaction_index(unified_log, tmp_path, clock):
    """Replicated batches and markers give the follower the same ongoing transactions and index."""
    leader = unified_log()
    build_history(leader)
    follower = UnifiedLog.open(tmp_path / "follower" / "topic-0", "topic", 0, SMALL, clock=clock)
    try:
        follower_copy(leader, follower)
        assert follower.last_stable_offset == leader.last_stable_offset
        end = leader.log_end_offset
        assert follower.collect_aborted_transactions(0, end) == leader.collect_aborted_transactions(0, end) == [(7, 0)]
        assert txn_index_files(follower) == txn_index_files(leader)
    finally:
        follower.close()


def test_recovery_after_a_crash_rebuilds_the_index_and_the_open_transactions(open_log, crash_log):
    """Crash (no close snapshot), index files deleted: reopen replays markers from the snapshot."""
    partition_log = open_log()
    build_history(partition_log)
    lso, indexes = partition_log.last_stable_offset, txn_index_files(partition_log)
    crash_log(partition_log)
    for name in os.listdir(partition_log.directory):
        if name.endswith((TXN_INDEX_SUFFIX, ".snapshot")):
            os.unlink(partition_log.directory / name)
    reopened = open_log()
    reopened.maybe_increment_high_watermark(reopened.log_end_offset)
    assert reopened.last_stable_offset == lso
    assert txn_index_files(reopened) == indexes


def test_truncation_cuts_the_index_and_reopens_a_transaction_whose_marker_went(unified_log):
    """A follower cut back below a COMMIT marker: the transaction is open again; below an ABORT
    marker: its index entry goes."""
    partition_log = unified_log()
    build_history(partition_log)
    [entries] = txn_index_files(partition_log).values()
    partition_log.truncate_to(entries[0].last_offset)  # the ABORT marker's offset
    partition_log.maybe_increment_high_watermark(partition_log.log_end_offset)
    assert partition_log.collect_aborted_transactions(0, partition_log.log_end_offset) == []
    assert txn_index_files(partition_log) == {}
    assert partition_log.last_stable_offset == 0  # producer 7's transaction is open again
