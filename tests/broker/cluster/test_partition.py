"""Partition: leadership and leader-epoch checks (Kafka's KIP-320 answers), the high watermark
policy (capped by what the flush policy lets count), and taking over as leader."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from segment_format import batch_body, record
from broker.cluster.partition import NO_EPOCH, LeaderAndIsr, Partition
from broker.config import LogConfig
from broker.errors import FencedLeaderEpochError, NotLeaderError, UnknownLeaderEpochError
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
