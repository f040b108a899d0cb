"""Partition logs on local disk (DESIGN.md section 3): segments, indexes, recovery, retention.

Does file I/O and nothing else: no networking, no asyncio. `PartitionLog.flush` is meant to run in
a worker thread; everything else is cheap enough for the event loop.
"""
from broker.log.log_manager import LogManager
from broker.log.offset_index import OffsetIndex
from broker.log.partition_log import AppendInfo, PartitionLog
from broker.log.segment import FetchSlice, Segment
from broker.log.time_index import TimeIndex

__all__ = ["AppendInfo", "FetchSlice", "LogManager", "OffsetIndex", "PartitionLog", "Segment", "TimeIndex"]
