"""What a tiered partition holds locally and remotely, as its leader knows it now: DescribeTiering's
answer (`pymq tier status`) and the tiering metrics (broker/metrics.py, from its scrape thread).

Synchronous and cheap: it reads the UnifiedLog's offsets and segment sizes and the manifest the
remote log manager already holds (`RemoteLogManager.status`); it never reads the store.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from broker.log import UnifiedLog
from protocol.messages.tiering import TieringPartition

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
