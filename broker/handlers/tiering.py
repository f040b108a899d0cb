"""DescribeTiering (pymq's API key 1000): per partition led here, the local and remote ranges, their
bytes, the upload lag and the tiering failures (`pymq tier status`). ReplaceRemoteSegments (1001):
the compaction job's segment swap, committed by the partition's leader.

Both go through the replica manager (`describe_tiering`, `replace_remote_segments`), which knows
the logs and the remote tier; DescribeTiering is synchronous and cheap (broker/remote_log/tiering_status.py).
"""
from __future__ import annotations

from broker.cluster.topics import TopicRegistry
from broker.replica_manager import ReplicaManager
from common.errors import PymqError
from protocol.messages.base import code_and_message
from protocol.messages.tiering import (
    DescribeTieringRequest,
    DescribeTieringResponse,
    ReplaceRemoteSegmentsRequest,
    ReplaceRemoteSegmentsResponse,
    TieringPartition,
    TieringTopic,
)


class TieringHandler:
    def __init__(self, registry: TopicRegistry, replicas: ReplicaManager) -> None:
        self.registry = registry
        self.replicas = replicas

    def describe_tiering(self, request: DescribeTieringRequest) -> DescribeTieringResponse:
        led = self.replicas.describe_tiering()
        names = sorted(led) if request.topics is None else list(dict.fromkeys(request.topics))
        return DescribeTieringResponse(tuple(self._topic(name, led.get(name, [])) for name in names))

    async def replace_remote_segments(self, request: ReplaceRemoteSegmentsRequest) -> ReplaceRemoteSegmentsResponse:
        try:
            version = await self.replicas.replace_remote_segments(
                request.topic, request.partition, request.topic_id or None, request.expected_manifest_version,
                request.replaced, request.segments)
        except PymqError as err:
            return ReplaceRemoteSegmentsResponse(*code_and_message(err))
        return ReplaceRemoteSegmentsResponse(manifest_version=version)

    def _topic(self, name: str, partitions: list[TieringPartition]) -> TieringTopic:
        try:
            self.registry.get(name)
        except PymqError as err:
            return TieringTopic(name, *code_and_message(err))
        return TieringTopic(name, partitions=tuple(partitions))
