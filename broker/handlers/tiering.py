"""DescribeTiering (pymq's API key 1000): per partition led here, the local and remote ranges, their
bytes, the upload lag and the tiering failures (`pymq tier status`). ReplaceRemoteSegments (1001):
the compaction job's segment swap, committed by the partition's leader (RemoteLogManager.replace_segments)
on a worker thread, since it reads the new objects back from the store.

Synchronous and cheap: it reads the UnifiedLog's offsets and segment sizes and the manifest the
remote log manager already holds (`RemoteLogManager.status`); it never reads the store. The
metrics collector (broker/metrics.py) uses `describe_partition` too, from its scrape thread.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from broker.cluster.topics import TopicRegistry
from broker.log import UnifiedLog
from broker.replica_manager import ReplicaManager
from common.errors import InconsistentTopicIdError, InvalidRequestError, PymqError
from protocol.messages.base import code_and_message
from protocol.messages.tiering import (
    DescribeTieringRequest,
    DescribeTieringResponse,
    ReplaceRemoteSegmentsRequest,
    ReplaceRemoteSegmentsResponse,
    TieringPartition,
    TieringTopic,
)

if TYPE_CHECKING:
    from broker.remote_log.remote_log_manager import RemoteLogManager


def describe_partition(partition_log: UnifiedLog, remote_logs: RemoteLogManager | None) -> TieringPartition:
    """What `partition_log` holds locally and remotely, as its leader knows it now."""
    local = dict(log_start_offset=partition_log.log_start_offset,
                 local_log_start_offset=partition_log.local_log_start_offset,
                 log_end_offset=partition_log.log_end_offset, high_watermark=partition_log.high_watermark,
                 local_bytes=partition_log.size_bytes())
    if not partition_log.tiered or remote_logs is None:
        return TieringPartition(partition_log.partition, tiered=False, **local)
    status = remote_logs.status(partition_log.topic, partition_log.partition)
    tiering = dict(failures=status.failures, last_error=status.last_error)
    manifest = status.manifest
    if manifest is None:  # not read yet (the first run is pending or failed)
        return TieringPartition(partition_log.partition, tiered=True, upload_lag_offsets=-1, upload_lag_bytes=-1,
                                **local, **tiering)
    remote_end = manifest.log_end_offset
    not_uploaded = partition_log.local_segments_above(remote_end)
    lag_start = max(remote_end, local["local_log_start_offset"])
    return TieringPartition(
        partition_log.partition, tiered=True,
        remote_log_start_offset=manifest.log_start_offset, remote_log_end_offset=remote_end,
        remote_bytes=manifest.size_bytes, remote_segments=len(manifest.segments), manifest_version=manifest.version,
        upload_lag_offsets=max(local["log_end_offset"] - lag_start, 0),
        upload_lag_bytes=sum(segment.size for segment in not_uploaded), **local, **tiering)


class TieringHandler:
    def __init__(self, registry: TopicRegistry, replicas: ReplicaManager) -> None:
        self.registry = registry
        self.replicas = replicas

    def describe_tiering(self, request: DescribeTieringRequest) -> DescribeTieringResponse:
        led: dict[str, list[UnifiedLog]] = {}
        for partition_log in self.replicas.leader_logs():
            led.setdefault(partition_log.topic, []).append(partition_log)
        names = sorted(led) if request.topics is None else list(dict.fromkeys(request.topics))
        return DescribeTieringResponse(tuple(self._topic(name, led.get(name, [])) for name in names))

    async def replace_remote_segments(self, request: ReplaceRemoteSegmentsRequest) -> ReplaceRemoteSegmentsResponse:
        remote_logs = self.replicas.remote_logs
        try:
            partition_log = self.replicas.leader_log(request.topic, request.partition)
            if request.topic_id and partition_log.topic_id and request.topic_id != partition_log.topic_id:
                raise InconsistentTopicIdError(f"{partition_log} is topic id {partition_log.topic_id}, "
                                               f"not {request.topic_id}")
            if remote_logs is None or not partition_log.tiered:
                raise InvalidRequestError(f"{partition_log} is not tiered: it has no remote segments to replace")
            manifest = await self.replicas.executors.logs.run(
                remote_logs.replace_segments, partition_log, request.expected_manifest_version, request.replaced,
                request.segments)
        except PymqError as err:
            return ReplaceRemoteSegmentsResponse(*code_and_message(err))
        return ReplaceRemoteSegmentsResponse(manifest_version=manifest.version)

    def _topic(self, name: str, logs: list[UnifiedLog]) -> TieringTopic:
        try:
            self.registry.get(name)
        except PymqError as err:
            return TieringTopic(name, *code_and_message(err))
        remote_logs = self.replicas.remote_logs
        partitions = []
        for partition_log in sorted(logs, key=lambda l: l.partition):
            try:
                partitions.append(describe_partition(partition_log, remote_logs))
            except PymqError as err:  # e.g. the log closed under us (directory offline)
                partitions.append(TieringPartition(partition_log.partition, *code_and_message(err)))
        return TieringTopic(name, partitions=tuple(partitions))
