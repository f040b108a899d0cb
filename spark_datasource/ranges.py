"""Offset ranges and how they become Spark input partitions (Kafka's KafkaOffsetRangeCalculator).

Each topic-partition's [start, end) is one Spark partition, split into pieces of at most
`maxRecordsPerPartition` records (default `DEFAULT_MAX_RECORDS`: a task's memory and its retry
cost stay bounded however far behind a query is), and split further, in proportion to size, until
there are at least `minPartitions` pieces.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field, replace

from pyspark.sql.datasource import InputPartition

DEFAULT_MAX_RECORDS = 2_000_000


@dataclass(frozen=True)
class OffsetRange:
    """[start, end) of one topic-partition. `topic_id`: the incarnation of the topic the range was
    planned on (KIP-516); a task reads that one only, never a topic of the same name created
    since (None: unknown, e.g. planned from a remote store alone, and not checked). Ranges compare
    by their offsets alone: the id is what the read checks, not where the range is."""

    topic: str
    partition: int
    start: int
    end: int  # exclusive
    topic_id: str | None = field(default=None, compare=False)

    @property
    def size(self) -> int:
        return max(self.end - self.start, 0)

    def within(self, start: int, end: int) -> "OffsetRange":
        """The same partition and incarnation, [start, end): the pieces a range is cut into."""
        return replace(self, start=start, end=end)


class RangePartition(InputPartition):
    """One Spark task's work: a range of one topic-partition. Picklable, small."""

    def __init__(self, offset_range: OffsetRange) -> None:
        super().__init__(offset_range)
        self.range = offset_range


def split_ranges(ranges: list[OffsetRange], min_partitions: int | None,
                 max_records: int | None) -> list[OffsetRange]:
    """Non-empty `ranges`, cut into pieces for Spark tasks, in (topic, partition, offset) order."""
    pieces = [piece for cut in split_each(ranges, min_partitions, max_records) for piece in cut]
    return sorted(pieces, key=lambda r: (r.topic, r.partition, r.start))


def split_each(ranges: list[OffsetRange], min_partitions: int | None,
               max_records: int | None) -> list[list[OffsetRange]]:
    """The pieces of each of `ranges` (same order; an empty range has none): pieces of at most
    `max_records` offsets (default DEFAULT_MAX_RECORDS), and, in proportion to size, at least
    `min_partitions` pieces in all. Pieces tile their range exactly, so readers that stop at
    their piece's end neither skip nor repeat an offset at a cut. The one splitting rule for
    broker ranges and remote segments (`remote_ranges.split_remote`)."""
    counts = _piece_counts([r.size for r in ranges], min_partitions, max_records or DEFAULT_MAX_RECORDS)
    out = []
    for r, n in zip(ranges, counts):
        bounds = [r.start + r.size * i // n for i in range(n + 1)] if n else []
        out.append([r.within(lo, hi) for lo, hi in zip(bounds, bounds[1:]) if hi > lo])
    return out


def _piece_counts(sizes: list[int], min_partitions: int | None, limit: int) -> list[int]:
    """How many pieces each range of `sizes` offsets is cut into (0 for an empty one)."""
    pieces = [math.ceil(size / limit) if size > 0 else 0 for size in sizes]
    total = sum(size for size in sizes if size > 0)
    if min_partitions and sum(pieces) < min_partitions and total:
        for i, size in enumerate(sizes):
            if size > 0:
                pieces[i] = max(pieces[i], min(size, max(1, round(size / total * min_partitions))))
        # Rounding can leave fewer than min_partitions pieces (3 equal ranges, 4 wanted): each
        # missing one goes to the range with the most offsets per piece, while any can be cut.
        missing = min_partitions - sum(pieces)
        widest = [(-size / pieces[i], i) for i, size in enumerate(sizes) if 0 < pieces[i] < size]
        heapq.heapify(widest)
        while missing > 0 and widest:
            i = heapq.heappop(widest)[1]
            pieces[i] += 1
            missing -= 1
            if pieces[i] < sizes[i]:
                heapq.heappush(widest, (-sizes[i] / pieces[i], i))
    return pieces
