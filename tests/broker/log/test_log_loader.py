"""Recovery on open after a crash (LogLoader): it never truncates below the recovery point, and its
work is bounded by the unflushed tail.

Changed on purpose from the old PartitionLog: damage in a segment below the recovery point (data
that was fsynced and checkpointed) is kept and reported instead of cutting the log there and
deleting every later segment; only a torn or corrupt batch at or past the recovery point (an
unflushed tail) is truncated.
"""
from __future__ import annotations

import struct

import pytest

from segment_format import record
from common.errors import CorruptMessageError
from broker.log import Segment

from tests.broker.log.appends import append

R = 3  # records per test batch; three batches fill a 4 KiB segment
SPARSE = {"index_interval_bytes": 4096}  # one index entry per segment: loading frames every batch


def fill(partition_log, batch, count: int) -> None:
    for _ in range(count):
        append(partition_log, batch(R))


def crashed_with_recovery_point(open_log, logs, crash_log, batch, flushed: int, unflushed: int, **overrides):
    """A log of `flushed` batches, flushed and checkpointed, then `unflushed` more, then a crash.
    Returns the crashed log (its files stay on disk)."""
    partition_log = open_log(**overrides)
    fill(partition_log, batch, flushed)
    partition_log.flush()
    logs.manager.checkpoint()
    fill(partition_log, batch, unflushed)
    crash_log(partition_log)
    return partition_log


def break_length(path, position: int) -> None:
    """batch_length of the batch at `position` now runs far past the file."""
    with open(path, "r+b") as f:
        f.seek(position + 8)
        f.write(struct.pack("<i", 1 << 30))


def flip_magic(path, position: int) -> None:
    with open(path, "r+b") as f:
        f.seek(position + 16)
        f.write(b"\x7f")


@pytest.mark.parametrize("tamper", [break_length, flip_magic], ids=["broken-length", "flipped-magic-byte"])
def test_damage_below_the_recovery_point_is_kept_and_reported(open_log, logs, crash_log, batch, tamper):
    """Flushed segments 0 and 9 and the unflushed tail all survive damage to segment 0's second
    batch: nothing is truncated, the damage is recorded and counted, and reads that reach it get
    CORRUPT_MESSAGE while the batch before it and every later segment read as before."""
    size = len(batch(R))
    crashed = crashed_with_recovery_point(open_log, logs, crash_log, batch, 7, 2, **SPARSE)
    victim = crashed.segments()[0].log_path
    tamper(victim, size)
    damaged_bytes = victim.read_bytes()
    reopened = open_log(**SPARSE)
    assert [(s.base_offset, s.next_offset) for s in reopened.segments()] == [(0, 9), (9, 18), (18, 27)]
    assert reopened.last_recovery_truncated_bytes == 0
    assert reopened.damaged_segments == 1
    segments = reopened.segments()
    assert segments[0].damage is not None and "byte %d" % size in segments[0].damage
    assert [s.damage for s in segments[1:]] == [None, None]
    assert victim.read_bytes() == damaged_bytes
    assert reopened.high_watermark == 21  # the checkpointed one: the tail was not yet committed
    reopened.update_high_watermark(reopened.log_end_offset)
    assert reopened.read(0, 1).first_offset == 0
    for offset in (3, 6, 8):
        with pytest.raises(CorruptMessageError):
            reopened.read(offset, 1)
    for offset in range(9, 27):
        assert reopened.read(offset, 1).first_offset == offset // R * R
    assert append(reopened, batch(R)).first_offset == 27


def test_damage_below_the_recovery_point_in_the_active_segment_starts_a_new_segment(open_log, logs, crash_log, batch):
    """A last segment whose end cannot be framed takes no appends: new data goes to a new segment."""
    size = len(batch(R))
    crashed = crashed_with_recovery_point(open_log, logs, crash_log, batch, 2, 0, **SPARSE)
    break_length(crashed.segments()[-1].log_path, size)
    reopened = open_log(**SPARSE)
    assert reopened.damaged_segments == 1 and reopened.log_end_offset == 2 * R
    assert append(reopened, batch(R)).first_offset == 2 * R
    assert [s.base_offset for s in reopened.segments()] == [0, 2 * R]
    assert reopened.read(2 * R, 1).first_offset == 2 * R


def test_the_same_damage_after_the_recovery_point_is_an_unflushed_tail_and_truncated(open_log, logs, crash_log, batch):
    """Only past the recovery point does a bad batch end the log (every later segment deleted)."""
    size = len(batch(R))
    crashed = crashed_with_recovery_point(open_log, logs, crash_log, batch, 3, 4, **SPARSE)
    assert [s.base_offset for s in crashed.segments()] == [0, 9, 18]
    break_length(crashed.segments()[1].log_path, size)
    reopened = open_log(**SPARSE)
    assert reopened.damaged_segments == 0
    assert [(s.base_offset, s.next_offset) for s in reopened.segments()] == [(0, 9), (9, 12)]
    assert reopened.last_recovery_truncated_bytes == 2 * size + size
    assert not (reopened.directory / f"{18:020d}.log").exists()
    assert reopened.log_end_offset == reopened.recovery_point == 12


def test_a_flipped_body_byte_below_the_recovery_point_is_left_for_readers_crc_check(open_log, logs, crash_log, batch):
    """Trusted segments are framed, not CRC-checked, on open (that is what bounds restart work):
    the bytes are served as stored, and the consumer's CRC check finds the bad batch."""
    size = len(batch(R))
    crashed = crashed_with_recovery_point(open_log, logs, crash_log, batch, 7, 2, **SPARSE)
    victim = crashed.segments()[0].log_path
    with open(victim, "r+b") as f:
        f.seek(size + record.HEADER_SIZE + 40)
        byte = f.read(1)
        f.seek(size + record.HEADER_SIZE + 40)
        f.write(bytes([byte[0] ^ 0xFF]))
    reopened = open_log(**SPARSE)
    assert (reopened.log_end_offset, reopened.damaged_segments, reopened.last_recovery_truncated_bytes) == (27, 0, 0)
    data = reopened.read(R, 1).read_bytes()
    with pytest.raises(CorruptMessageError):
        record.validate_batch(data)
    assert record.validate_batch(reopened.read(2 * R, 1).read_bytes()).base_offset == 2 * R


# --- the recovery point bounds restart work ---------------------------------------------


def test_flush_returns_true_when_it_makes_a_rolled_segment_durable(open_log, batch):
    """The caller checkpoints the recovery point when flush says a sealed segment became durable."""
    partition_log = open_log()
    fill(partition_log, batch, 2)
    assert partition_log.flush() is False  # only the active segment: no checkpoint needed
    assert partition_log.recovery_point == 2 * R
    fill(partition_log, batch, 2)  # fills segment 0 and rolls to 9
    assert [s.base_offset for s in partition_log.segments()] == [0, 9]
    assert partition_log.needs_flush(0) is True  # a sealed segment waits for its fsync
    assert partition_log.flush() is True
    assert partition_log.recovery_point == 4 * R
    assert partition_log.needs_flush(0) is False
    fill(partition_log, batch, 1)
    assert partition_log.flush() is False


def test_flush_up_to_a_rolled_segment_end_reports_it(open_log, batch):
    partition_log = open_log()
    fill(partition_log, batch, 4)
    assert partition_log.flush(up_to=9) is True
    assert partition_log.recovery_point == 9


def test_crash_recovers_only_from_the_segment_holding_the_checkpointed_recovery_point(open_log, logs, crash_log, batch,
                                                                                      monkeypatch):
    """Recovery point 12 lies in segment 9: segment 0 is trusted, 9 and 18 are re-validated, and
    the bytes re-validated are exactly theirs."""
    partition_log = open_log()
    fill(partition_log, batch, 4)
    partition_log.flush()
    logs.manager.checkpoint()
    fill(partition_log, batch, 4)
    sizes = {s.base_offset: s.size for s in partition_log.segments()}
    crash_log(partition_log)
    recovered = []
    real_recover = Segment.recover
    monkeypatch.setattr(Segment, "recover", lambda self, *a: recovered.append(self.base_offset) or real_recover(self, *a))
    reopened = open_log()
    assert recovered == [9, 18]
    assert reopened.recovered_bytes == sizes[9] + sizes[18]
    assert reopened.log_end_offset == reopened.recovery_point == 8 * R


def test_crash_right_after_a_checkpoint_at_the_leo_recovers_nothing(open_log, logs, crash_log, batch, monkeypatch):
    partition_log = open_log()
    fill(partition_log, batch, 5)
    partition_log.flush()
    logs.manager.checkpoint()
    crash_log(partition_log)
    monkeypatch.setattr(Segment, "recover", lambda *a: pytest.fail("a flushed log was recovered"))
    reopened = open_log()
    assert (reopened.log_end_offset, reopened.recovered_bytes) == (5 * R, 0)


def test_epochs_of_the_unflushed_tail_are_replayed_from_its_batches(open_log, logs, crash_log, batch):
    """The epoch checkpoint may be torn by the crash; the recovered batches carry their epochs."""
    partition_log = open_log()
    append(partition_log, batch(R), leader_epoch=1)
    partition_log.flush()
    logs.manager.checkpoint()
    append(partition_log, batch(R), leader_epoch=3)
    crash_log(partition_log)
    (partition_log.directory / "leader-epoch-checkpoint").write_text("1 0\n")
    assert open_log().leader_epoch_entries == [(1, 0), (3, R)]
