"""Fetch handler: read each partition from its fetch offset, long-polling for `min_bytes`.

A fetch that finds enough at once is answered synchronously; otherwise it becomes a
`DelayedFetch` parked in the replica manager's fetch purgatory, which reads again when one of its
partitions' high watermark moves and answers with whatever there is at its deadline.
The response mirrors the request's entries. Each partition's bytes are a segment range
(`FetchSlice`) the server sends with sendfile; a pass whose ranges will not be sent (not enough
data yet) closes them. The broker bounds the request: waits to MAX_WAIT_MS_LIMIT, sizes to
`fetch.max.bytes`; the first partition with data may exceed the budget by one batch (KIP-74).

Offsets below a tiered log's local start are read from the remote tier
(broker/remote_log/remote_log_reader.py): from its cache at once when it holds the bytes; otherwise a
worker loads them and the fetch waits as a DelayedFetch (even with min_bytes 0: an empty answer
would only bring the same fetch back), woken on the partition when the answer is ready. Their
bytes go out as a buffer, not a file range.
"""
from __future__ import annotations

from collections.abc import Callable

from broker.cluster.broker_identity import BrokerIdentity, Session
from broker.config import BrokerConfig
from broker.log import FetchSlice, UnifiedLog
from broker.log.unified_log import OffsetMovedToTieredStorageError
from broker.purgatory import DelayedOperation
from broker.remote_log.remote_log_reader import RemoteReadPending
from broker.replica_manager import ReplicaManager
from broker.request_metrics import TopicTraffic
from common.errors import InconsistentTopicIdError, PymqError
from protocol import (
    CONSUMER_REPLICA_ID,
    FetchPartition,
    FetchPartitionResponse,
    FetchRequest,
    FetchResponse,
    TopicRequest,
    TopicResponse,
    code_and_message,
    part_size,
)

MAX_WAIT_MS_LIMIT = 300_000
LeaderLog = Callable[[str, int, int], UnifiedLog]


class FetchHandler:
    """Loop-local. `leader_log(topic, partition, current_leader_epoch)` is the dispatcher's seam to
    the logs this broker leads."""

    def __init__(self, config: BrokerConfig, replicas: ReplicaManager, leader_log: LeaderLog,
                 traffic: TopicTraffic, identity: BrokerIdentity) -> None:
        self.config = config
        self.replicas = replicas
        self.leader_log = leader_log
        self.traffic = traffic
        self.identity = identity

    def fetch(self, request: FetchRequest, session: Session) -> FetchResponse | DelayedFetch:
        """A replica fetch (`replica_id` >= 0) is served only on a connection identified as that
        broker: CLUSTER_AUTHORIZATION_FAILED for the whole request otherwise, nothing recorded."""
        self.identity.authorize_replica(session, request.replica_id)
        max_wait_ms = min(max(request.max_wait_ms, 0), MAX_WAIT_MS_LIMIT)
        min_bytes = max(request.min_bytes, 0)
        limit = self.config["fetch.max.bytes"]
        max_bytes = min(max(limit if request.max_bytes is None else request.max_bytes, 1), limit)
        if max_wait_ms <= 0:
            min_bytes = 0  # answer at once (unless a remote read is in progress)
        response, read = self.read(request, max_bytes)
        if read.enough(min_bytes):
            return self.sent(response)
        read.close()
        if read.pending:  # Kafka's remote.fetch.max.wait.ms: a remote read may take longer than max_wait_ms
            max_wait_ms = max(max_wait_ms, self.config["remote.fetch.max.wait.ms"])
        delayed = DelayedFetch(self, request, min_bytes, max_bytes)
        self.replicas.park_fetch(delayed, max_wait_ms / 1000)
        return delayed

    def read_enough(self, request: FetchRequest, min_bytes: int, max_bytes: int) -> FetchResponse | None:
        """One read of every partition: the response if it has `min_bytes` or an error, else None
        (and the ranges it found are closed: they will not be sent)."""
        response, read = self.read(request, max_bytes)
        if read.enough(min_bytes):
            return self.sent(response)
        read.close()
        return None

    def sent(self, response: FetchResponse) -> FetchResponse:
        """`response`, its record bytes counted per topic (it is the one sent)."""
        for topic in response.topics:
            self.traffic.sent(topic.name, sum(part_size(p.records) for p in topic.partitions))
        return response

    def read(self, request: FetchRequest, max_bytes: int) -> tuple[FetchResponse, _Read]:
        """One pass over the requested partitions: the response and what it read."""
        topics = []
        read = _Read()
        for topic in request.topics:
            entries = []
            for p in topic.partitions:
                entry = self._read_partition(topic, p, max_bytes, max_bytes - read.size, read, request.replica_id)
                entries.append(entry)
                read.failed = read.failed or entry.error_code != 0
            topics.append(TopicResponse(topic.name, tuple(entries)))
        return FetchResponse(tuple(topics)), read

    def _read_partition(self, topic: TopicRequest[FetchPartition], p: FetchPartition, max_bytes: int, budget: int,
                        read: _Read, replica_id: int) -> FetchPartitionResponse:
        """One partition's entry; its bytes are added to `read`. A follower's (`replica_id` >= 0)
        reads to the log end and records the follower's progress."""
        malformed = topic.error or p.error
        if malformed is not None:
            return FetchPartitionResponse(p.partition, *code_and_message(malformed))
        high_watermark = log_start_offset = -1
        follower = replica_id != CONSUMER_REPLICA_ID
        try:
            if follower:
                partition_log = self.replicas.replica_log(topic.name, p.partition, p.current_leader_epoch, replica_id,
                                                          p.fetch_offset)
            else:
                partition_log = self.leader_log(topic.name, p.partition, p.current_leader_epoch)
            _check_topic_id(topic, partition_log)
            high_watermark, log_start_offset = partition_log.high_watermark, partition_log.log_start_offset
            limit = min(max(max_bytes if p.max_bytes is None else p.max_bytes, 1), budget)
            if limit <= 0 and read.size:
                return FetchPartitionResponse(p.partition, high_watermark=high_watermark,
                                              log_start_offset=log_start_offset)
            try:
                # A follower reads to the log end: what it replicates is what moves the high watermark.
                records: FetchSlice | bytes = partition_log.read(
                    p.fetch_offset, max(limit, 1), partition_log.log_end_offset if follower else None)
            except OffsetMovedToTieredStorageError:
                if follower:
                    raise  # a follower that far behind starts from the leader's local log (replica_fetcher.py)
                records = self._read_remote(partition_log, p.fetch_offset, max(limit, 1))
        except RemoteReadPending:
            read.pending = True
            return FetchPartitionResponse(p.partition, high_watermark=high_watermark, log_start_offset=log_start_offset)
        except PymqError as err:
            return FetchPartitionResponse(p.partition, *code_and_message(err), high_watermark, log_start_offset)
        size = len(records) if isinstance(records, bytes) else records.size
        if not size:
            if isinstance(records, FetchSlice):
                records.close()
            return FetchPartitionResponse(p.partition, high_watermark=high_watermark, log_start_offset=log_start_offset)
        read.add(records, size)
        return FetchPartitionResponse(p.partition, high_watermark=high_watermark, log_start_offset=log_start_offset,
                                      records=records)

    def _read_remote(self, partition_log: UnifiedLog, offset: int, max_bytes: int) -> FetchSlice | bytes:
        """`offset` (below the local log start) from the remote tier; past the remote log's end
        (a compaction gap up to the local start), the local log from its start."""
        remote = self.replicas.remote_logs
        if remote is None:
            raise OffsetMovedToTieredStorageError(f"{partition_log}: offset {offset} is below the local log start "
                                                  "and this broker does not run tiered storage")
        data = remote.reader.read(partition_log.topic, partition_log.partition,
                                  remote.manifest(partition_log.topic, partition_log.partition), offset, max_bytes)
        return data if data else partition_log.read(partition_log.local_log_start_offset, max_bytes)


def _check_topic_id(topic: TopicRequest[FetchPartition], partition_log: UnifiedLog) -> None:
    """A fetch naming a topic id reads only that incarnation of the topic: the same name's log
    of a re-created topic holds other records at the same offsets (Kafka's Fetch v13). A log
    without an id (written before topics had ids) is not checked."""
    if topic.topic_id is None or partition_log.topic_id is None or topic.topic_id == partition_log.topic_id:
        return
    raise InconsistentTopicIdError(f"{topic.name}-{partition_log.partition} is topic id {partition_log.topic_id}, "
                                   f"not {topic.topic_id}: the topic was deleted and re-created")


class _Read:
    """What one pass over a fetch's partitions read: its size, the file ranges to close if it is
    not sent, whether a partition failed and whether one waits for a remote read."""

    __slots__ = ("size", "slices", "failed", "pending")

    def __init__(self) -> None:
        self.size = 0
        self.slices: list[FetchSlice] = []
        self.failed = False
        self.pending = False

    def add(self, records: FetchSlice | bytes, size: int) -> None:
        self.size += size
        if isinstance(records, FetchSlice):
            self.slices.append(records)

    def enough(self, min_bytes: int) -> bool:
        """Whether to answer now: a partition failed, or there are `min_bytes`, and at least
        one byte while a remote read is in progress (an empty answer would only bring the same
        fetch back: even a fetch that would not wait waits for it)."""
        return self.failed or self.size >= max(min_bytes, 1 if self.pending else 0)

    def close(self) -> None:
        for piece in self.slices:
            piece.close()


class DelayedFetch(DelayedOperation):
    """A fetch waiting for `min_bytes` across its partitions (Kafka's DelayedFetch). Each attempt
    reads every partition again: the offsets may have become invalid meanwhile (retention,
    truncation, leadership), and the answer must say so."""

    def __init__(self, handler: FetchHandler, request: FetchRequest, min_bytes: int, max_bytes: int) -> None:
        super().__init__([(t.name, p.partition) for t in request.topics for p in t.partitions])
        self.handler = handler
        self.request = request
        self.min_bytes = min_bytes
        self.max_bytes = max_bytes

    def try_complete(self) -> bool:
        response = self.handler.read_enough(self.request, self.min_bytes, self.max_bytes)
        if response is None:
            return False
        self.complete(response)
        return True

    def on_expiration(self) -> None:
        self.complete(self.handler.sent(self.handler.read(self.request, self.max_bytes)[0]))
