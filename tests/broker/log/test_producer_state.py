"""ProducerStateManager as pure logic: the leader's checks (duplicates, sequences, epochs), the
unchecked replay of followers and recovery, expiry, and the snapshot format."""
from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.log.producer_state import (
    BATCHES_KEPT,
    INT32_MAX,
    BatchMetadata,
    CorruptSnapshotError,
    ProducerStateManager,
    decode_snapshot,
    encode_snapshot,
    last_sequence,
)
from common.errors import InvalidProducerEpochError, OutOfOrderSequenceError
from segment_format.record import BatchHeader


def header(producer_id: int, epoch: int, base_sequence: int, records: int = 1, base_offset: int = 0,
           timestamp: int = 1_000) -> tuple[int, BatchHeader]:
    """(position, header) as the log hands a validated batch to the producer state."""
    return 0, BatchHeader(base_offset, 0, 0, 1, 0, 0, records - 1, timestamp, timestamp, producer_id, epoch,
                       base_sequence, records)


def manager_with(*batches: tuple[int, int, int, int, int]) -> ProducerStateManager:
    """A state holding (producer_id, epoch, base_sequence, records, base_offset) batches."""
    manager = ProducerStateManager(Path("."), "topic-0")
    for producer_id, epoch, sequence, records, offset in batches:
        manager.apply(producer_id, epoch, sequence, records - 1, offset, 1_000)
    return manager


@pytest.mark.parametrize(("base", "delta", "last"), [(0, 0, 0), (5, 4, 9), (INT32_MAX, 0, INT32_MAX),
                                                      (INT32_MAX, 1, 0), (INT32_MAX - 1, 3, 1)],
                         ids=["one", "five", "at-max", "wraps", "wraps-further"])
def test_last_sequence_wraps_at_int32_max_as_kafka(base, delta, last):
    """A batch's last sequence wraps from INT32_MAX to 0."""
    assert last_sequence(base, delta) == last


def test_a_retried_batch_is_a_duplicate_answered_with_its_original_offsets():
    """The same producer, epoch and sequences as a kept batch: a duplicate with its offsets."""
    manager = manager_with((7, 0, 0, 3, 10), (7, 0, 3, 2, 13))
    plan = manager.plan_leader_append([header(7, 0, 0, 3)])
    assert plan.duplicates == [BatchMetadata(0, 2, 10, 12)] and plan.first_new == 1


def test_leading_duplicates_then_new_batches():
    """Duplicates first, then the next sequences: only the new ones are written."""
    manager = manager_with((7, 0, 0, 3, 10), (7, 0, 3, 2, 13))
    plan = manager.plan_leader_append([header(7, 0, 3, 2), header(7, 0, 5, 1), header(7, 0, 6, 4)])
    assert plan.duplicates == [BatchMetadata(3, 4, 13, 14)] and plan.first_new == 1


def test_a_duplicate_after_a_new_batch_is_out_of_order():
    """A new batch, then a repeat of an older one: refused, naming the sequences."""
    manager = manager_with((7, 0, 0, 3, 10))
    with pytest.raises(OutOfOrderSequenceError, match=r"topic-0: producer 7 epoch 0 sent sequences 0\.\.2 after 3"):
        manager.plan_leader_append([header(7, 0, 3, 1), header(7, 0, 0, 3)])


@pytest.mark.parametrize(("sequence", "ok"), [(3, True), (4, False), (2, False), (0, False)],
                         ids=["next", "gap", "overlap", "restart"])
def test_the_same_epoch_must_continue_the_last_sequence(sequence, ok):
    """After sequences 0..2, only 3 may follow (a duplicate of 0..2 would be one, not 0..0)."""
    manager = manager_with((7, 0, 0, 3, 10))
    if ok:
        assert manager.plan_leader_append([header(7, 0, sequence)]).first_new == 0
    else:
        with pytest.raises(OutOfOrderSequenceError):
            manager.plan_leader_append([header(7, 0, sequence)])


def test_sequences_continue_across_the_wrap():
    """After a batch ending at INT32_MAX the next starts at 0."""
    manager = manager_with((7, 0, INT32_MAX - 1, 2, 10))
    assert manager.plan_leader_append([header(7, 0, 0)]).first_new == 0


def test_batches_of_one_producer_in_one_record_set_must_be_consecutive():
    """The second batch is checked against the first, staged."""
    manager = manager_with()
    assert manager.plan_leader_append([header(7, 0, 0, 2), header(7, 0, 2)]).first_new == 0
    with pytest.raises(OutOfOrderSequenceError):
        manager.plan_leader_append([header(7, 0, 0, 2), header(7, 0, 3)])


def test_an_older_epoch_is_fenced_and_a_newer_one_starts_at_zero():
    """Epoch 1 known: epoch 0 is a zombie; epoch 2 must start at sequence 0."""
    manager = manager_with((7, 1, 0, 1, 10))
    with pytest.raises(InvalidProducerEpochError, match="epoch 0 is older than the current epoch 1"):
        manager.plan_leader_append([header(7, 0, 1)])
    with pytest.raises(OutOfOrderSequenceError, match="starts epoch 2 at sequence 5"):
        manager.plan_leader_append([header(7, 2, 5)])
    assert manager.plan_leader_append([header(7, 2, 0)]).first_new == 0


def test_an_unknown_producer_may_start_at_any_sequence():
    """Its state may have expired (Kafka accepts it)."""
    assert manager_with().plan_leader_append([header(9, 3, 1234)]).first_new == 0


def test_a_refused_plan_changes_nothing():
    """The checks stage their changes: the state is as before."""
    manager = manager_with((7, 0, 0, 1, 10))
    before = encode_snapshot(manager.entries.values())
    with pytest.raises(OutOfOrderSequenceError):
        manager.plan_leader_append([header(7, 0, 1), header(7, 0, 5)])
    assert encode_snapshot(manager.entries.values()) == before


def test_only_the_last_five_batches_are_kept_and_a_new_epoch_forgets_them():
    """Kafka's NUM_BATCHES_TO_RETAIN; the sixth-last is no longer a duplicate."""
    manager = manager_with(*[(7, 0, i, 1, 100 + i) for i in range(BATCHES_KEPT + 1)])
    assert [b.first_seq for b in manager.entry(7).batches] == list(range(1, BATCHES_KEPT + 1))
    with pytest.raises(OutOfOrderSequenceError):
        manager.plan_leader_append([header(7, 0, 0)])
    manager.apply(7, 1, 0, 0, 200, 1_000)
    assert list(manager.entry(7).batches) == [BatchMetadata(0, 0, 200, 200)] and manager.entry(7).epoch == 1


def test_expiry_and_log_start_drop_idle_and_removed_producers():
    """remove_expired by last batch time; remove_below by last offset."""
    manager = manager_with((1, 0, 0, 1, 10), (2, 0, 0, 1, 20))
    manager.apply(2, 0, 1, 0, 21, 5_000)
    assert manager.remove_expired(now_ms=5_000, expiration_ms=4_000) == 1 and set(manager.entries) == {2}
    assert manager.remove_below(22) == 1 and not manager.entries


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**62), st.integers(0, 2**15 - 1), st.integers(-1, 2**40),
                          st.lists(st.tuples(st.integers(0, INT32_MAX), st.integers(0, 1000),
                                             st.integers(0, 2**62)), max_size=BATCHES_KEPT)),
                max_size=20, unique_by=lambda t: t[0]))
def test_snapshots_round_trip(producers):
    """Every field survives encode and decode."""
    manager = ProducerStateManager(Path("."), "topic-0")
    for producer_id, epoch, timestamp, batches in producers:
        for sequence, delta, offset in batches:
            manager.apply(producer_id, epoch, sequence, delta, offset, timestamp)
    decoded = decode_snapshot(encode_snapshot(manager.entries.values()), "test")
    assert decoded == manager.entries


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_any_flipped_byte_of_a_snapshot_is_detected(data):
    """Magic, version, CRC or payload: a change is a CorruptSnapshotError."""
    encoded = bytearray(encode_snapshot(manager_with((7, 0, 0, 3, 10), (8, 2, 5, 1, 20)).entries.values()))
    at = data.draw(st.integers(0, len(encoded) - 1))
    encoded[at] ^= data.draw(st.integers(1, 255))
    with pytest.raises(CorruptSnapshotError):
        decode_snapshot(bytes(encoded), "test")


def test_a_torn_snapshot_is_detected():
    """Shorter than its header, or cut in its payload."""
    encoded = encode_snapshot(manager_with((7, 0, 0, 3, 10)).entries.values())
    for cut in (0, 5, len(encoded) - 1):
        with pytest.raises(CorruptSnapshotError):
            decode_snapshot(encoded[:cut], "test")


def test_the_snapshot_format_is_pinned():
    """Known bytes: magic, version 1, CRC32C, msgpack entries."""
    encoded = encode_snapshot(manager_with((7, 0, 0, 1, 10)).entries.values())
    magic, version, _ = struct.unpack_from("<4sHI", encoded)
    assert (magic, version) == (b"PYPS", 1)
    assert encoded[10:] == bytes.fromhex("919607" "00" "cd03e8" "ff" "ff" "9194" "00" "00" "0a" "0a")


def test_the_state_is_bounded_and_the_least_recently_active_go_first():
    """At max_producers a new producer evicts down to 90%: the oldest by last batch time, never
    one with an open transaction."""
    manager = ProducerStateManager(Path("."), "topic-0", max_producers=100)
    manager.apply(0, 0, 0, 0, 0, timestamp=1, transactional=True)  # the oldest, but in a transaction
    for pid in range(1, 100):
        manager.apply(pid, 0, 0, 0, pid, timestamp=pid + 1)
    manager.apply(1000, 0, 0, 0, 1000, timestamp=5_000)
    assert len(manager) == 91 and manager.evicted == 10
    assert 0 in manager.entries and 1000 in manager.entries
    assert not any(pid in manager.entries for pid in range(1, 11)) and 11 in manager.entries


def test_a_coordinator_batch_without_a_sequence_is_checked_for_its_epoch_only_and_never_a_duplicate():
    """The group coordinator writes a producer's transactional offsets with its id and epoch and
    no sequence (Kafka's COORDINATOR origin): a second one of the same epoch is a second write,
    not a retry of the first; an older epoch is fenced; a client's batch without one is refused
    by the log's producer checks before it gets here."""
    manager = ProducerStateManager(Path("."), "__consumer_offsets-0")
    assert manager.plan_leader_append([header(7, 2, -1)], coordinator=True).first_new == 0
    manager.apply(7, 2, -1, 0, 10, 1_000, transactional=True)
    plan = manager.plan_leader_append([header(7, 2, -1)], coordinator=True)
    assert plan.duplicates == [] and plan.first_new == 0
    with pytest.raises(InvalidProducerEpochError):
        manager.plan_leader_append([header(7, 1, -1)], coordinator=True)
    assert manager.entry(7).batches == type(manager.entry(7).batches)()  # nothing a retry could match


def test_the_snapshots_of_merged_segments_are_deleted_but_never_the_newest(tmp_path):
    """delete_snapshots_at (the cleaner merged the segments that rolled at those offsets) deletes
    theirs; the newest snapshot stays even if named: recovery starts from it."""
    manager = manager_with((7, 0, 0, 1, 0))
    manager.directory = tmp_path
    for offset in (3, 6, 9):
        manager.take_snapshot(offset)
    manager.delete_snapshots_at([3, 9, 42])
    assert manager.snapshot_offsets() == [6, 9]
