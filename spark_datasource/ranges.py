"""Offset ranges and how they become Spark input partitions (Kafka's KafkaOffsetRangeCalculator).

Each topic-partition's [start, end) is one Spark partition, split into pieces of at most
`maxRecordsPerPartition` records (default `DEFAULT_MAX_RECORDS`: a task's memory and its retry
cost stay bounded however far behind a query is), and split further, in proportion to size, until
there are at least `minPartitions` pieces.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition

DEFAULT_MAX_RECORDS = 2_000_000


@dataclass(frozen=True)
class OffsetRange:
    topic: str
    partition: int
    start: int
    end: int  # exclusive

    @property
    def size(self) -> int:
        return max(self.end - self.start, 0)


class RangePartition(InputPartition):
    """One Spark task's work: a range of one topic-partition. Picklable, small."""

    def __init__(self, offset_range: OffsetRange) -> None:
        super().__init__(offset_range)
        self.range = offset_range


def split_ranges(ranges: list[OffsetRange], min_partitions: int | None,
                 max_records: int | None) -> list[OffsetRange]:
    """Non-empty `ranges`, cut into pieces for Spark tasks, in (topic, partition, offset) order."""
    ranges = [r for r in ranges if r.size > 0]
    limit = max_records or DEFAULT_MAX_RECORDS
    pieces = {r: math.ceil(r.size / limit) for r in ranges}
    total = sum(r.size for r in ranges)
    if min_partitions and sum(pieces.values()) < min_partitions and total:
        for r in ranges:
            pieces[r] = max(pieces[r], min(r.size, max(1, round(r.size / total * min_partitions))))
        # Rounding can leave fewer than min_partitions pieces (3 equal ranges, 4 wanted): each
        # missing one goes to the range with the most offsets per piece, while any can be cut.
        missing = min_partitions - sum(pieces.values())
        widest = [(-r.size / pieces[r], i) for i, r in enumerate(ranges) if pieces[r] < r.size]
        heapq.heapify(widest)
        while missing > 0 and widest:
            i = heapq.heappop(widest)[1]
            r = ranges[i]
            pieces[r] += 1
            missing -= 1
            if pieces[r] < r.size:
                heapq.heappush(widest, (-r.size / pieces[r], i))
    out = []
    for r in sorted(ranges, key=lambda r: (r.topic, r.partition, r.start)):
        n = pieces[r]
        bounds = [r.start + r.size * i // n for i in range(n + 1)]
        out.extend(OffsetRange(r.topic, r.partition, lo, hi) for lo, hi in zip(bounds, bounds[1:]) if hi > lo)
    return out
