"""read_committed reads through the ReplicaManager (Kafka's readFromLog with isolation level),
with the real log, log writer, remote log manager and a file:// remote store: a consumer stops at
the last stable offset and gets the aborted transactions of what it read, from the local and the
remote tier; ListOffsets latest is the LSO; a follower ignores isolation. The wire fields round-trip."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import replace
from pathlib import Path

import pytest

from broker.cluster.partition import LeaderAndIsr
from broker.config import LogConfig
from broker.log import LogManager, TopicLogSpec
from broker.log_writer import LogWriter
from broker.purgatory import DelayedOperationPurgatory
from broker.remote_log.remote_log_manager import RemoteLogManager
from broker.replica_manager import ReplicaManager
from common.errors import InvalidRequestError
from protocol import (
    LATEST_TIMESTAMP,
    READ_COMMITTED,
    AbortedTransaction,
    FetchPartitionResponse,
    FetchRequest,
    ListOffsetsRequest,
)
from segment_format import batch_body, record
from tests.waiting import wait_until
from tiered_storage import RemoteSegmentStore

TOPIC_ID = "0123456789abcdef0123456789abcdef"
SMALL = LogConfig(segment_bytes=4096, max_message_bytes=4096, index_interval_bytes=0, retention_ms=-1)
TIERED = replace(SMALL, remote_storage_enable=True, local_retention_bytes=0)
LED_HERE = LeaderAndIsr(0, 0, (0, 1), (0,))  # broker 1 a replica out of the ISR: it may fetch
RECORDS = 10


def _batch(producer_id: int, sequence: int, transactional: bool = True) -> memoryview:
    body = batch_body.make_body([b"v" * 100] * RECORDS, timestamps_ms=batch_body.now_ms())
    return memoryview(record.encode_batch(body, producer_id=producer_id, producer_epoch=0, base_sequence=sequence,
                                          attributes=record.TRANSACTIONAL_BIT if transactional else 0))


async def _replica_manager(tmp_path: Path, config: LogConfig = SMALL,
                           remote_logs: RemoteLogManager | None = None) -> ReplicaManager:
    logs = LogManager(tmp_path / "data", remote_storage=remote_logs is not None)
    replicas = ReplicaManager(0, logs, LogWriter(offload_bytes=1 << 20, max_queued_bytes=1 << 20),
                              DelayedOperationPurgatory(), remote_logs=remote_logs)
    await replicas.create_partitions("t", TopicLogSpec(TOPIC_ID, config, 1), [0], {("t", 0): LED_HERE})
    return replicas


def _append(replicas: ReplicaManager, producer_id: int, sequence: int, transactional: bool = True) -> int:
    info = replicas.append("t", 0, _batch(producer_id, sequence, transactional), acks=1, timeout_ms=1000)
    assert not isinstance(info, Awaitable)
    return info.first_offset


def _marker(replicas: ReplicaManager, producer_id: int, commit: bool) -> int:
    partition_log = replicas.leader_log("t", 0)
    info = partition_log.append_transaction_marker(producer_id, 0, commit, 0, 0)
    partition_log.maybe_increment_high_watermark(partition_log.log_end_offset)
    return info.first_offset


def _offsets(records) -> list[int]:
    data = records if isinstance(records, bytes) else records.read_bytes()
    return [header.base_offset for _, header in record.iter_batches(data)]


def test_read_committed_stops_at_the_lso_and_names_the_aborted_transactions(tmp_path: Path):
    """Producer 7 aborts, producer 8 is still open: read_committed sees up to 8's first offset,
    with 7's transaction named; read_uncommitted sees everything; a follower ignores isolation."""
    async def scenario() -> None:
        replicas = await _replica_manager(tmp_path, replace(SMALL, segment_bytes=1 << 20))  # one read: one segment
        try:
            _append(replicas, 7, 0)
            _append(replicas, 7, RECORDS)
            _marker(replicas, 7, commit=False)
            _append(replicas, 1, 0, transactional=False)
            open_at = _append(replicas, 8, 0)
            _append(replicas, 1, RECORDS, transactional=False)
            partition_log = replicas.leader_log("t", 0)
            end = partition_log.log_end_offset
            committed = replicas.read("t", 0, 0, 1 << 20, isolation_level=READ_COMMITTED)
            assert (committed.error, committed.last_stable_offset, committed.high_watermark) == (None, open_at, end)
            assert committed.aborted_transactions == [(7, 0)]
            assert max(_offsets(committed.records)) < open_at
            uncommitted = replicas.read("t", 0, 0, 1 << 20)
            assert uncommitted.aborted_transactions == [] and max(_offsets(uncommitted.records)) == end - RECORDS
            follower = replicas.read("t", 0, 0, 1 << 20, replica=1, isolation_level=READ_COMMITTED)
            assert max(_offsets(follower.records)) == end - RECORDS
            assert replicas.offset_for_timestamp("t", 0, LATEST_TIMESTAMP, isolation_level=READ_COMMITTED) == (open_at, -1)
            assert replicas.offset_for_timestamp("t", 0, LATEST_TIMESTAMP) == (end, -1)
            _marker(replicas, 8, commit=True)
            released = replicas.read("t", 0, open_at, 1 << 20, isolation_level=READ_COMMITTED)
            assert released.last_stable_offset == partition_log.log_end_offset
            assert released.aborted_transactions == [] and min(_offsets(released.records)) == open_at
        finally:
            replicas.logs.close()

    asyncio.run(scenario())


def test_read_committed_from_the_remote_tier_names_the_aborted_transactions(tmp_path: Path):
    """The aborted transaction's segments are uploaded and deleted locally: a read_committed read
    of offset 0 comes from the tier and still names it (the remote .txnindex)."""
    async def scenario() -> None:
        remote_logs = RemoteLogManager(RemoteSegmentStore.from_url(f"file://{tmp_path}/remote"))
        replicas = await _replica_manager(tmp_path, TIERED, remote_logs)
        try:
            for i in range(4):
                _append(replicas, 7, i * RECORDS)
            _marker(replicas, 7, commit=False)
            for i in range(8):
                _append(replicas, 1, i * RECORDS, transactional=False)
            partition_log = replicas.leader_log("t", 0)
            partition_log.flush()
            remote_logs.on_leadership_change([(partition_log, 0)], [])
            remote_logs.run_once()
            assert partition_log.delete_old_segments(batch_body.now_ms())
            assert partition_log.local_log_start_offset > 4 * RECORDS

            def read():
                result = replicas.read("t", 0, 0, 1 << 20, isolation_level=READ_COMMITTED)
                return result if result.size else None

            result = wait_until(read, 30, "the remote read's answer")
            assert isinstance(result.records, bytes) and _offsets(result.records)[0] == 0
            assert result.aborted_transactions == [(7, 0)]
        finally:
            remote_logs.close()
            replicas.logs.close()

    asyncio.run(scenario())


def test_the_isolation_fields_round_trip_on_the_wire():
    """isolation_level is sent only when read_committed; a bad one is refused; the response's
    last stable offset and aborted transactions decode as sent."""
    request = FetchRequest.from_control({"topics": [], "isolation_level": 1})
    assert request.isolation_level == READ_COMMITTED and request.to_control()["isolation_level"] == 1
    assert "isolation_level" not in FetchRequest.from_control({"topics": []}).to_control()
    assert ListOffsetsRequest.from_control({"topics": [], "isolation_level": 1}).isolation_level == 1
    with pytest.raises(InvalidRequestError, match="isolation_level"):
        FetchRequest.from_control({"topics": [], "isolation_level": 2})
    response = FetchPartitionResponse(0, high_watermark=9, last_stable_offset=5,
                                      aborted_transactions=(AbortedTransaction(7, 0),))
    control = response.to_control()
    assert control["aborted_transactions"] == [{"producer_id": 7, "first_offset": 0}]
    assert FetchPartitionResponse.from_control(control) == response


def test_an_open_transaction_holds_the_lso_over_the_wire_and_across_a_sigkill(broker_factory, raw_client):
    """A real broker: a transactional batch between plain ones holds read_committed fetches and
    ListOffsets at its offset, also after a SIGKILL and restart (the open transaction is rebuilt
    from the log); read_uncommitted reads everything."""
    from common.errors import NONE
    from protocol import ApiKey

    broker = broker_factory().start()
    client = raw_client(broker.port)
    reply, _ = client.request(ApiKey.CREATE_TOPICS, {"topics": [
        {"name": "t", "num_partitions": 1, "replication_factor": 1}]})
    assert reply["topics"][0]["error_code"] == NONE, reply
    offsets = []
    for producer_id, sequence, transactional in [(1, 0, False), (1, RECORDS, False), (7, 0, True), (1, 2 * RECORDS, False)]:
        payload = bytes(_batch(producer_id, sequence, transactional))
        reply, _ = client.request(ApiKey.PRODUCE, {"acks": -1, "topics": [
            {"name": "t", "partitions": [{"partition": 0, "size": len(payload)}]}]}, payload)
        answer = reply["topics"][0]["partitions"][0]
        assert answer["error_code"] == NONE, answer
        offsets.append(answer["base_offset"])
    open_at, end = offsets[2], offsets[3] + RECORDS

    def check(client) -> None:
        fetch = {"max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20,
                 "topics": [{"name": "t", "partitions": [{"partition": 0, "fetch_offset": 0}]}]}
        reply, payload = client.request(ApiKey.FETCH, {**fetch, "isolation_level": READ_COMMITTED})
        entry = reply["topics"][0]["partitions"][0]
        assert (entry["error_code"], entry["last_stable_offset"], entry["high_watermark"]) == (NONE, open_at, end)
        assert [h.base_offset for _, h in record.iter_batches(payload[:entry["size"]])] == offsets[:2]
        reply, payload = client.request(ApiKey.FETCH, fetch)
        entry = reply["topics"][0]["partitions"][0]
        assert "last_stable_offset" not in entry
        reply, _ = client.request(ApiKey.LIST_OFFSETS, {"isolation_level": READ_COMMITTED, "topics": [
            {"name": "t", "partitions": [{"partition": 0, "timestamp": LATEST_TIMESTAMP}]}]})
        assert reply["topics"][0]["partitions"][0]["offset"] == open_at

    check(client)
    broker.kill()
    broker.start()
    check(raw_client(broker.port))
