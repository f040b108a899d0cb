"""Partition: leadership and leader-epoch checks (Kafka's KIP-320 answers), the high watermark
policy (capped by what the flush policy lets count), and taking over as leader."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from segment_format import batch_body, record
from broker.cluster.partition import NO_EPOCH, LeaderAndIsr, Partition
from broker.config import LogConfig
from common.errors import (
    FencedLeaderEpochError,
    NotLeaderError,
    OffsetOutOfRangeError,
    ReplicaNotAvailableError,
    UnknownLeaderEpochError,
)
from broker.executors import BoundedExecutor
from broker.log import UnifiedLog

ME, OTHER = 0, 1
EPOCH_WRITER = BoundedExecutor("logs", 1, 100)  # where make_leader writes the epoch file


@pytest.fixture
def partition_log(tmp_path: Path):
    opened = UnifiedLog.open(tmp_path / "t-0", "t", 0, LogConfig())
    yield opened
    opened.close()


def led(partition_log: UnifiedLog, epoch: int = 5) -> Partition:
    partition = Partition(partition_log, ME, LeaderAndIsr(ME, epoch, (ME,), (ME,)), EPOCH_WRITER)
    asyncio.run(partition.make_leader(partition.state))
    return partition


def append(partition: Partition, records: int = 2) -> None:
    body = batch_body.make_body([b"v"] * records, timestamps_ms=batch_body.now_ms())
    partition.log.append_as_leader(record.encode_batch(body), partition.leader_epoch)


@pytest.mark.parametrize(
    "requested, error",
    [(NO_EPOCH, None), (5, None), (4, FencedLeaderEpochError), (0, FencedLeaderEpochError), (6, UnknownLeaderEpochError)],
    ids=["unchecked", "current", "one-older", "much-older", "newer"],
)
def test_epoch_check_answers_as_kip_320(partition_log, requested, error):
    """An older epoch is a stale client (FENCED_LEADER_EPOCH); a newer one means this broker's
    metadata is behind (UNKNOWN_LEADER_EPOCH): both refresh and retry."""
    partition = led(partition_log)
    if error is None:
        partition.check_leader(requested)
    else:
        with pytest.raises(error):
            partition.check_leader(requested)


def test_a_follower_answers_not_leader(partition_log):
    partition = Partition(partition_log, ME, LeaderAndIsr(OTHER, 3, (OTHER, ME), (OTHER, ME)), EPOCH_WRITER)
    assert not partition.is_leader
    with pytest.raises(NotLeaderError, match="leader is 1"):
        partition.check_leader()


def test_make_leader_starts_the_epoch_at_the_log_end(partition_log):
    partition = led(partition_log, epoch=2)
    append(partition, 3)
    asyncio.run(partition.make_leader(LeaderAndIsr(ME, 7, (ME,), (ME,))))
    assert partition.leader_epoch == 7
    assert partition_log.leader_epoch_entries == [(2, 0), (7, 3)]
    with pytest.raises(FencedLeaderEpochError):
        partition.check_leader(2)


def test_high_watermark_follows_the_durable_end_of_a_single_replica(tmp_path):
    """With flush.messages=1 an append counts only once flushed: the high watermark, and with it
    what consumers may read, waits for the fsync."""
    partition_log = UnifiedLog.open(tmp_path / "t-0", "t", 0, LogConfig(flush_messages=1))
    try:
        partition = led(partition_log)
        append(partition, 2)
        assert not partition.maybe_increment_high_watermark()
        assert partition_log.high_watermark == 0
        partition_log.flush()
        assert partition.maybe_increment_high_watermark()
        assert partition_log.high_watermark == 2
    finally:
        partition_log.close()


def test_high_watermark_waits_for_every_in_sync_replica(partition_log):
    """The minimum log end offset of the ISR: a follower that has not fetched holds it at 0."""
    partition = Partition(partition_log, ME, LeaderAndIsr(ME, 1, (ME, OTHER), (ME, OTHER)), EPOCH_WRITER)
    asyncio.run(partition.make_leader(partition.state))
    append(partition, 4)
    assert not partition.maybe_increment_high_watermark()
    assert partition_log.high_watermark == 0


def test_a_follower_fetch_moves_the_high_watermark_to_the_isr_minimum(partition_log):
    """The leader learns a follower's log end from its fetch offset; the high watermark is the
    smallest log end of the ISR."""
    partition = Partition(partition_log, ME, LeaderAndIsr(ME, 1, (ME, OTHER, 2), (ME, OTHER, 2)), EPOCH_WRITER)
    asyncio.run(partition.make_leader(partition.state, now_ms=0))
    append(partition, 10)
    assert partition.update_follower_fetch_state(OTHER, 10, now_ms=5) is False  # broker 2 has nothing yet
    assert partition.update_follower_fetch_state(2, 4, now_ms=5) is True
    assert partition_log.high_watermark == 4
    assert partition.update_follower_fetch_state(2, 10, now_ms=6) is True
    assert partition_log.high_watermark == 10


@pytest.mark.parametrize("offset", [11, 2 ** 62], ids=["one-past-the-end", "far-past-the-end"])
def test_a_follower_fetch_past_the_leader_log_end_is_refused_and_records_nothing(partition_log, offset):
    """No follower can hold what the leader never wrote: OFFSET_OUT_OF_RANGE, and the follower
    neither moves the high watermark nor counts as caught up (it still leaves the ISR)."""
    partition = Partition(partition_log, ME, LeaderAndIsr(ME, 1, (ME, OTHER), (ME, OTHER)), EPOCH_WRITER)
    asyncio.run(partition.make_leader(partition.state, now_ms=0))
    append(partition, 10)
    partition.update_follower_fetch_state(OTHER, 4, now_ms=1)
    with pytest.raises(OffsetOutOfRangeError, match="past the leader's log end 10"):
        partition.update_follower_fetch_state(OTHER, offset, now_ms=5_000)
    assert partition.follower_end_offset(OTHER) == 4 and partition_log.high_watermark == 4
    assert partition.isr_to_shrink(now_ms=5_000, max_lag_ms=1_000) == (ME,)


def test_a_fetch_from_a_broker_that_is_not_a_replica_is_refused(partition_log):
    partition = Partition(partition_log, ME, LeaderAndIsr(ME, 1, (ME, OTHER), (ME, OTHER)), EPOCH_WRITER)
    asyncio.run(partition.make_leader(partition.state))
    with pytest.raises(ReplicaNotAvailableError, match="broker 7 is not a replica"):
        partition.update_follower_fetch_state(7, 0, now_ms=1)


def test_a_lagging_follower_leaves_the_isr_and_rejoins_once_caught_up(partition_log):
    """Caught up means the follower reached the leader's log end as it was at this fetch or the
    previous one (Kafka's lastCaughtUpTimeMs); one not caught up for max_lag_ms leaves the ISR,
    and one that reaches the high watermark and the current epoch joins again."""
    partition = Partition(partition_log, ME, LeaderAndIsr(ME, 1, (ME, OTHER), (ME, OTHER)), EPOCH_WRITER)
    asyncio.run(partition.make_leader(partition.state, now_ms=1_000))
    append(partition, 5)
    partition.update_follower_fetch_state(OTHER, 5, now_ms=1_100)  # caught up at 1,100
    append(partition, 5)
    assert partition.isr_to_shrink(now_ms=1_500, max_lag_ms=1_000) is None
    partition.update_follower_fetch_state(OTHER, 7, now_ms=2_000)  # has the end as of its fetch at 1,100 only
    assert partition.isr_to_shrink(now_ms=2_000, max_lag_ms=1_000) is None
    assert partition.isr_to_shrink(now_ms=2_200, max_lag_ms=1_000) == (ME,)
    assert partition.committed_state(partition.with_isr((ME,)))  # the ISR is the leader alone:
    assert partition_log.high_watermark == 10  # the high watermark moves to its end
    assert partition.isr_to_expand(OTHER) is None  # at 7, below the high watermark 10
    partition.update_follower_fetch_state(OTHER, 10, now_ms=3_200)
    assert partition.isr_to_expand(OTHER) == (ME, OTHER)


def test_a_pending_isr_change_counts_its_new_member_for_the_high_watermark(partition_log):
    """While a follower's addition is being written, the high watermark already waits for it
    (Kafka's maximal ISR): acks=all is never given for less than the ISR about to be."""
    partition = Partition(partition_log, ME, LeaderAndIsr(ME, 1, (ME, OTHER), (ME,)), EPOCH_WRITER)
    asyncio.run(partition.make_leader(partition.state))
    append(partition, 4)
    partition.update_follower_fetch_state(OTHER, 4, now_ms=1)
    assert partition_log.high_watermark == 4
    partition.pending_isr = (ME, OTHER)
    append(partition, 4)
    assert not partition.maybe_increment_high_watermark()
    partition.update_follower_fetch_state(OTHER, 8, now_ms=2)
    assert partition_log.high_watermark == 8
