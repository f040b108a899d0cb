"""The partition layer's part of an append, for tests of the log alone."""
from __future__ import annotations

from broker.log import AppendInfo, UnifiedLog


def append(partition_log: UnifiedLog, payload: bytearray | bytes, leader_epoch: int = 0) -> AppendInfo:
    """A leader's append on a single broker: the partition layer then moves the high watermark to
    what the flush policy lets count (Partition.maybe_increment_high_watermark)."""
    info = partition_log.append_as_leader(payload, leader_epoch)
    partition_log.maybe_increment_high_watermark(partition_log.durable_end_offset)
    return info


def append_compacted(partition_log: UnifiedLog, payload: bytearray | bytes) -> AppendInfo:
    """Batches as the log cleaner leaves them (compacted bodies, offsets kept): no producer may
    append those, so they come in as a follower's copy of a leader's log, and become readable."""
    info = partition_log.append_as_follower(payload)
    partition_log.maybe_increment_high_watermark(partition_log.log_end_offset)
    return info
