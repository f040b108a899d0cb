"""Fetch handler: read each partition from its fetch offset, long-polling for `min_bytes`.

A fetch that finds enough at once is answered synchronously; otherwise it becomes a
`DelayedFetch` parked in the replica manager's fetch purgatory, which reads again when one of its
partitions' high watermark moves and answers with whatever there is at its deadline.
The response mirrors the request's entries. Each partition's bytes are a segment range
(`FetchSlice`) the server sends with sendfile; a pass whose ranges will not be sent (not enough
data yet) closes them. The broker bounds the request: waits to MAX_WAIT_MS_LIMIT, sizes to
`fetch.max.bytes`; the first partition with data may exceed the budget by one batch (KIP-74).
"""
from __future__ import annotations

from collections.abc import Callable

from broker.config import BrokerConfig
from broker.errors import PymqError
from broker.log import FetchSlice, UnifiedLog
from broker.protocol import (
    FetchPartition,
    FetchPartitionResponse,
    FetchRequest,
    FetchResponse,
    FetchTopic,
    FetchTopicResponse,
    code_and_message,
)
from broker.purgatory import DelayedOperation
from broker.replica_manager import ReplicaManager

MAX_WAIT_MS_LIMIT = 300_000
LeaderLog = Callable[[str, int, int], UnifiedLog]


class FetchHandler:
    """Loop-local. `leader_log(topic, partition, current_leader_epoch)` is the dispatcher's seam to
    the logs this broker leads."""

    def __init__(self, config: BrokerConfig, replicas: ReplicaManager, leader_log: LeaderLog) -> None:
        self.config = config
        self.replicas = replicas
        self.leader_log = leader_log

    def fetch(self, request: FetchRequest) -> FetchResponse | DelayedFetch:
        max_wait_ms = min(max(request.max_wait_ms, 0), MAX_WAIT_MS_LIMIT)
        min_bytes = max(request.min_bytes, 0)
        limit = self.config["fetch.max.bytes"]
        max_bytes = min(max(limit if request.max_bytes is None else request.max_bytes, 1), limit)
        if max_wait_ms <= 0:
            return self.read(request, max_bytes)[0]
        response = self.read_enough(request, min_bytes, max_bytes)
        if response is not None:
            return response
        delayed = DelayedFetch(self, request, min_bytes, max_bytes)
        self.replicas.park_fetch(delayed, max_wait_ms / 1000)
        return delayed

    def read_enough(self, request: FetchRequest, min_bytes: int, max_bytes: int) -> FetchResponse | None:
        """One read of every partition: the response if it has `min_bytes` or an error, else None
        (and the ranges it found are closed: they will not be sent)."""
        response, pieces, failed = self.read(request, max_bytes)
        if failed or sum(piece.size for piece in pieces) >= min_bytes:
            return response
        for piece in pieces:
            piece.close()
        return None

    def read(self, request: FetchRequest, max_bytes: int) -> tuple[FetchResponse, list[FetchSlice], bool]:
        """One pass over the requested partitions: the response, its ranges, and whether any failed."""
        topics = []
        pieces: list[FetchSlice] = []
        total = 0
        failed = False
        for topic in request.topics:
            entries = []
            for p in topic.partitions:
                entry, piece = self._read_partition(topic, p, max_bytes, max_bytes - total, total == 0)
                entries.append(entry)
                failed = failed or entry.error_code != 0
                if piece is not None:
                    pieces.append(piece)
                    total += piece.size
            topics.append(FetchTopicResponse(topic.name, tuple(entries)))
        return FetchResponse(tuple(topics)), pieces, failed

    def _read_partition(self, topic: FetchTopic, p: FetchPartition, max_bytes: int, budget: int,
                        first: bool) -> tuple[FetchPartitionResponse, FetchSlice | None]:
        """One partition's entry and its range (None when it has no bytes to send)."""
        malformed = topic.error or p.error
        if malformed is not None:
            return FetchPartitionResponse(p.partition, *code_and_message(malformed)), None
        high_watermark = log_start_offset = -1
        try:
            partition_log = self.leader_log(topic.name, p.partition, p.current_leader_epoch)
            high_watermark, log_start_offset = partition_log.high_watermark, partition_log.log_start_offset
            limit = min(max(max_bytes if p.max_bytes is None else p.max_bytes, 1), budget)
            if limit <= 0 and not first:
                return FetchPartitionResponse(p.partition, high_watermark=high_watermark,
                                              log_start_offset=log_start_offset), None
            piece = partition_log.read(p.fetch_offset, max(limit, 1))
        except PymqError as err:
            return FetchPartitionResponse(p.partition, *code_and_message(err), high_watermark, log_start_offset), None
        if not piece.size:
            piece.close()
            return FetchPartitionResponse(p.partition, high_watermark=high_watermark, log_start_offset=log_start_offset), None
        return FetchPartitionResponse(p.partition, high_watermark=high_watermark, log_start_offset=log_start_offset,
                                      records=piece), piece


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
        self.complete(self.handler.read(self.request, self.max_bytes)[0])
