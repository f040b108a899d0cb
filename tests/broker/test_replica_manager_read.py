"""The read path of the ReplicaManager (Kafka's readFromLog / fetchOffsetForTimestamp), driven with
the real log, log writer, remote log manager and a file:// remote store: which tier a read comes
from (local log, remote tier), what a read below the log start or of a partition not led here
answers, and that a replica manager built for a cluster is complete (its ISR writer is used)."""
from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from broker.cluster.partition import LeaderAndIsr, Partition
from broker.cluster.replica_fetcher import FetchSettings
from broker.cluster.session_fence import SessionFence
from broker.config import LogConfig
from broker.log import FetchSlice, LogManager, TopicLogSpec
from broker.log.unified_log import OffsetMovedToTieredStorageError
from broker.log_writer import LogWriter
from broker.purgatory import DelayedOperationPurgatory
from broker.remote_log.remote_log_manager import RemoteLogManager
from broker.replica_manager import ClusterReplication, ReplicaManager
from common.errors import (
    InconsistentTopicIdError,
    NotLeaderError,
    OffsetOutOfRangeError,
    UnknownTopicOrPartitionError,
)
from protocol import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP
from segment_format import batch_body, record
from tests.waiting import wait_until
from tiered_storage import RemoteSegmentStore

TOPIC_ID = "0123456789abcdef0123456789abcdef"
SMALL = LogConfig(segment_bytes=4096, max_message_bytes=4096, index_interval_bytes=0, retention_ms=-1)
TIERED = replace(SMALL, remote_storage_enable=True, local_retention_bytes=0)
LED_HERE = LeaderAndIsr(0, 0, (0,), (0,))


def _batch(timestamp_ms: int) -> memoryview:
    body = batch_body.make_body([b"v" * 100] * 10, timestamps_ms=timestamp_ms)
    return memoryview(record.encode_batch(body))


async def _replica_manager(tmp_path: Path, state: LeaderAndIsr = LED_HERE, config: LogConfig = SMALL,
                           remote_logs: RemoteLogManager | None = None,
                           cluster: ClusterReplication | None = None) -> ReplicaManager:
    """A replica manager hosting t-0 in `state`; appends run inline (on the loop thread)."""
    logs = LogManager(tmp_path / "data", remote_storage=remote_logs is not None)
    replicas = ReplicaManager(0, logs, LogWriter(offload_bytes=1 << 20, max_queued_bytes=1 << 20),
                              DelayedOperationPurgatory(), remote_logs=remote_logs, cluster=cluster)
    await replicas.create_partitions("t", TopicLogSpec(TOPIC_ID, config, 1), [0], {("t", 0): state})
    return replicas


def _fill(replicas: ReplicaManager, batches: int, timestamp_ms: int = 1_000_000) -> int:
    """Append `batches` of 10 records (acknowledged at once, acks=1); the log end offset."""
    for _ in range(batches):
        info = replicas.append("t", 0, _batch(timestamp_ms), acks=1, timeout_ms=1000)
        assert not isinstance(info, Awaitable)
    return replicas.leader_log("t", 0).log_end_offset


def _first_base_offset(records: FetchSlice | bytes) -> int:
    data = records.read_bytes() if isinstance(records, FetchSlice) else records
    return struct.unpack_from("<q", data)[0]


def test_a_consumer_reads_the_local_log_to_the_high_watermark_and_a_follower_to_its_end(tmp_path: Path):
    """With follower 1 in the ISR the high watermark waits for it: a consumer reads nothing, the
    follower reads the records (a segment range) and, fetching again from the log end, moves the
    high watermark, after which the consumer reads them too."""
    async def scenario() -> None:
        replicas = await _replica_manager(tmp_path, LeaderAndIsr(0, 0, (0, 1), (0, 1)))
        end = _fill(replicas, 3)
        consumer = replicas.read("t", 0, 0, 1 << 20)
        assert (consumer.error, consumer.size, consumer.high_watermark, consumer.log_start_offset) == (None, 0, 0, 0)
        follower = replicas.read("t", 0, 0, 1 << 20, replica=1)
        assert follower.error is None and isinstance(follower.records, FetchSlice) and follower.size > 0
        follower.close()
        caught_up = replicas.read("t", 0, end, 1 << 20, replica=1)
        assert (caught_up.error, caught_up.size, caught_up.high_watermark) == (None, 0, end)
        consumer = replicas.read("t", 0, 0, 1 << 20, topic_id=TOPIC_ID)
        assert consumer.error is None and isinstance(consumer.records, FetchSlice)
        assert _first_base_offset(consumer.records) == 0
        consumer.close()
        # Out of budget after another partition's bytes (not min_one): nothing read, offsets given.
        spent = replicas.read("t", 0, 0, 0, min_one=False)
        assert (spent.error, spent.size, spent.high_watermark) == (None, 0, end)
        replicas.logs.close()

    asyncio.run(scenario())


def test_an_offset_below_the_local_log_start_is_read_from_the_remote_tier(tmp_path: Path):
    """Once its first segments are uploaded and deleted locally, offset 0 is read through the
    remote log manager's reader: first a pending read (a worker loads it), then its bytes. A
    follower that far behind is told OFFSET_OUT_OF_RANGE (it restarts from the local log start).
    ListOffsets answers the earliest offset from the remote log and a time lookup from its segments."""
    async def scenario() -> None:
        remote_logs = RemoteLogManager(RemoteSegmentStore.from_url(f"file://{tmp_path}/remote"))
        replicas = await _replica_manager(tmp_path, LeaderAndIsr(0, 0, (0, 1), (0,)), TIERED, remote_logs)
        try:
            _fill(replicas, 20)
            partition_log = replicas.leader_log("t", 0)
            partition_log.flush()
            remote_logs.run_once()
            assert partition_log.delete_old_segments(batch_body.now_ms())
            assert partition_log.local_log_start_offset > 0 and partition_log.log_start_offset == 0

            first = replicas.read("t", 0, 0, 1 << 20)
            assert first.error is None
            if first.remote_pending:
                wait_until(lambda: replicas.read("t", 0, 0, 1 << 20).size > 0, 30, "the remote read's answer")
            remote = replicas.read("t", 0, 0, 1 << 20)
            assert remote.error is None and isinstance(remote.records, bytes)
            assert _first_base_offset(remote.records) == 0

            follower = replicas.read("t", 0, 0, 1 << 20, replica=1)
            assert isinstance(follower.error, OffsetMovedToTieredStorageError)

            assert replicas.offset_for_timestamp("t", 0, EARLIEST_TIMESTAMP) == (0, -1)
            assert replicas.offset_for_timestamp("t", 0, LATEST_TIMESTAMP) == (partition_log.high_watermark, -1)
            lookup = replicas.offset_for_timestamp("t", 0, 0)
            assert isinstance(lookup, Future)  # below the local log start: answered by the remote tier
            assert lookup.result(timeout=30) == (0, 1_000_000)
        finally:
            remote_logs.close()
            replicas.logs.close()

    asyncio.run(scenario())


def test_an_offset_below_the_log_start_is_offset_out_of_range(tmp_path: Path):
    """Retention moved the log start past offset 0 (no remote tier): the read answers
    OFFSET_OUT_OF_RANGE with the log start, which the consumer resets to."""
    async def scenario() -> None:
        replicas = await _replica_manager(tmp_path, config=replace(SMALL, retention_bytes=4096))
        _fill(replicas, 20)
        assert await replicas.run_retention(delete_delay_ms=60_000)
        log_start = replicas.leader_log("t", 0).log_start_offset
        assert log_start > 0
        result = replicas.read("t", 0, 0, 1 << 20)
        assert isinstance(result.error, OffsetOutOfRangeError) and result.size == 0
        assert result.log_start_offset == log_start
        result = replicas.read("t", 0, log_start, 1 << 20)
        assert result.error is None and _first_base_offset(result.records) == log_start
        result.close()
        replicas.logs.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("read, error", [
    (dict(topic="t", partition=1), UnknownTopicOrPartitionError),
    (dict(topic="t", partition=0, topic_id="f" * 32), InconsistentTopicIdError),
], ids=["unknown partition", "another incarnation of the topic"])
def test_a_read_of_a_partition_not_hosted_as_named_is_its_named_error(tmp_path: Path, read: dict[str, Any],
                                                                       error: type[Exception]):
    async def scenario() -> None:
        replicas = await _replica_manager(tmp_path)
        _fill(replicas, 1)
        topic_id = read.pop("topic_id", None)
        result = replicas.read(read["topic"], read["partition"], 0, 1 << 20, topic_id=topic_id)
        assert isinstance(result.error, error) and result.size == 0
        assert (result.high_watermark, result.log_start_offset) == (-1, -1)
        replicas.logs.close()

    asyncio.run(scenario())


def test_a_partition_followed_here_is_not_read_and_has_no_offsets_to_list(tmp_path: Path):
    """Broker 1 leads t-0, this broker follows it: consumers and followers are told NOT_LEADER,
    and so is a ListOffsets."""
    async def scenario() -> None:
        replicas = await _replica_manager(tmp_path, LeaderAndIsr(1, 3, (0, 1), (0, 1)))
        for replica in (None, 2):
            result = replicas.read("t", 0, 0, 1 << 20, replica=replica)
            assert isinstance(result.error, NotLeaderError) and result.size == 0
        with pytest.raises(NotLeaderError):
            replicas.offset_for_timestamp("t", 0, LATEST_TIMESTAMP)
        replicas.logs.close()

    asyncio.run(scenario())


def test_a_replica_manager_built_for_a_cluster_stores_an_isr_expansion_through_its_isr_writer(tmp_path: Path):
    """Built with a ClusterReplication it has its replica fetchers and ISR writer at once: a
    follower that caught up joins the ISR once the writer stored the change."""
    stored: list[LeaderAndIsr] = []

    async def isr_writer(partition: Partition, state: LeaderAndIsr) -> bool:
        stored.append(state)
        return True

    async def scenario() -> None:
        cluster = ClusterReplication(FetchSettings(0), lambda broker: None, isr_writer,
                                     SessionFence(0, lambda: 0), replica_lag_time_max_ms=10_000)
        replicas = await _replica_manager(tmp_path, LeaderAndIsr(0, 0, (0, 1), (0,)), cluster=cluster)
        assert replicas.followers is not None and replicas.replica_lag_time_max_ms == 10_000
        assert replicas.read("t", 0, 0, 1 << 20, replica=1).error is None  # caught up: the log is empty
        await _until(lambda: replicas.partition("t", 0).state.isr == (0, 1))
        assert stored == [LeaderAndIsr(0, 0, (0, 1), (0, 1))] and replicas.isr_expands == 1
        await replicas.stop_following()
        replicas.logs.close()

    asyncio.run(scenario())


async def _until(condition: Callable[[], bool], timeout_s: float = 10) -> None:
    """Until `condition` holds on the event loop (the ISR write is a task on it)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met"
        await asyncio.sleep(0.01)
