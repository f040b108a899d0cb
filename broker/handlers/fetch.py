"""Fetch handler: read each partition from its fetch offset, long-polling for `min_bytes`.

The response mirrors the request's entries. Each partition's bytes are a segment range
(`FetchSlice`) the server sends with sendfile; a pass whose ranges will not be sent (not enough
data yet) closes them. The broker bounds the request: waits to MAX_WAIT_MS_LIMIT, sizes to
`fetch.max.bytes`; the first partition with data may exceed the budget by one batch (KIP-74).
"""
from __future__ import annotations

import asyncio
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

    async def fetch(self, request: FetchRequest) -> FetchResponse:
        max_wait_ms = min(max(request.max_wait_ms, 0), MAX_WAIT_MS_LIMIT)
        min_bytes = max(request.min_bytes, 0)
        limit = self.config["fetch.max.bytes"]
        max_bytes = min(max(limit if request.max_bytes is None else request.max_bytes, 1), limit)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max_wait_ms / 1000
        while True:
            response, pieces, failed = self._read(request, max_bytes)
            remaining = deadline - loop.time()
            if sum(piece.size for piece in pieces) >= min_bytes or failed or remaining <= 0:
                return response
            for piece in pieces:  # not enough yet: this pass's ranges will not be sent
                piece.close()
            wanted = [(t.name, p.partition) for t in request.topics for p in t.partitions]
            await self.replicas.wait_for_data(wanted, remaining)

    def _read(self, request: FetchRequest, max_bytes: int) -> tuple[FetchResponse, list[FetchSlice], bool]:
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
