"""Fetch handler: read each partition from its fetch offset, long-polling for `min_bytes`.

A fetch that finds enough at once is answered synchronously; otherwise it becomes a
`DelayedFetch` parked in the replica manager's fetch purgatory, which reads again when one of its
partitions' high watermark moves and answers with whatever there is at its deadline.
The response mirrors the request's entries. Each partition's bytes are a segment range
(`FetchSlice`) the server sends with sendfile; a pass whose ranges will not be sent (not enough
data yet) closes them. The broker bounds the request: waits to MAX_WAIT_MS_LIMIT, sizes to
`fetch.max.bytes`; the first partition with data may exceed the budget by one batch (KIP-74).

Each partition is read by the replica manager (`ReplicaManager.read`, Kafka's readFromLog), which
checks leadership and chooses the local log or, for an offset below a tiered log's local start,
the remote tier: from its cache at once when it holds the bytes; otherwise a worker loads them and
the fetch waits as a DelayedFetch (even with min_bytes 0: an empty answer would only bring the same
fetch back), woken on the partition when the answer is ready. Their bytes go out as a buffer, not
a file range. This handler turns each typed read result into the partition's response.
"""
from __future__ import annotations

from broker.cluster.broker_identity import BrokerIdentity, Session
from broker.config import BrokerConfig
from broker.purgatory import DelayedOperation
from broker.replica_manager import LogReadResult, ReplicaManager
from broker.request_metrics import TopicTraffic
from protocol import (
    CONSUMER_REPLICA_ID,
    READ_COMMITTED,
    AbortedTransaction,
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


class FetchHandler:
    """Loop-local."""

    def __init__(self, config: BrokerConfig, replicas: ReplicaManager, traffic: TopicTraffic,
                 identity: BrokerIdentity) -> None:
        self.config = config
        self.replicas = replicas
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
                entry = self._read_partition(topic, p, max_bytes, max_bytes - read.size, read, request.replica_id,
                                             request.isolation_level)
                entries.append(entry)
                read.failed = read.failed or entry.error_code != 0
            topics.append(TopicResponse(topic.name, tuple(entries)))
        return FetchResponse(tuple(topics)), read

    def _read_partition(self, topic: TopicRequest[FetchPartition], p: FetchPartition, max_bytes: int, budget: int,
                        read: _Read, replica_id: int, isolation_level: int) -> FetchPartitionResponse:
        """One partition's entry; its bytes are added to `read`. A follower's (`replica_id` >= 0)
        reads to the log end and records the follower's progress; a read_committed consumer's to
        the last stable offset, with the aborted transactions its records may hold."""
        malformed = topic.error or p.error
        if malformed is not None:
            return FetchPartitionResponse(p.partition, *code_and_message(malformed))
        limit = min(max(max_bytes if p.max_bytes is None else p.max_bytes, 1), budget)
        result = self.replicas.read(topic.name, p.partition, p.fetch_offset, limit, min_one=not read.size,
                                    current_leader_epoch=p.current_leader_epoch, topic_id=topic.topic_id,
                                    replica=None if replica_id == CONSUMER_REPLICA_ID else replica_id,
                                    isolation_level=isolation_level)
        # The last stable offset only for read_committed: every other fetch's bytes stay as they were.
        last_stable_offset = result.last_stable_offset if isolation_level == READ_COMMITTED else -1
        if result.error is not None:
            return FetchPartitionResponse(p.partition, *code_and_message(result.error), result.high_watermark,
                                          result.log_start_offset, last_stable_offset=last_stable_offset)
        read.add(result)
        return FetchPartitionResponse(
            p.partition, high_watermark=result.high_watermark, log_start_offset=result.log_start_offset,
            last_stable_offset=last_stable_offset,
            aborted_transactions=tuple(AbortedTransaction(*txn) for txn in result.aborted_transactions),
            records=result.records)


class _Read:
    """What one pass over a fetch's partitions read: its size, the file ranges to close if it is
    not sent, whether a partition failed and whether one waits for a remote read."""

    __slots__ = ("size", "results", "failed", "pending")

    def __init__(self) -> None:
        self.size = 0
        self.results: list[LogReadResult] = []
        self.failed = False
        self.pending = False

    def add(self, result: LogReadResult) -> None:
        self.pending = self.pending or result.remote_pending
        size = result.size
        if size:
            self.size += size
            self.results.append(result)

    def enough(self, min_bytes: int) -> bool:
        """Whether to answer now: a partition failed, or there are `min_bytes`, and at least
        one byte while a remote read is in progress (an empty answer would only bring the same
        fetch back: even a fetch that would not wait waits for it)."""
        return self.failed or self.size >= max(min_bytes, 1 if self.pending else 0)

    def close(self) -> None:
        for result in self.results:
            result.close()


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
