"""LogSegments: the ordered segments of one partition log (Kafka's LogSegments).

A sorted list of segments with their base offsets kept beside them for bisect. The last segment
is the active one. Pure bookkeeping: no I/O, no locking (LocalLog holds the lock).
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterator

from broker.log.segment import Segment
from common.errors import LogInvariantError


class LogSegments:
    def __init__(self) -> None:
        self._segments: list[Segment] = []
        self._bases: list[int] = []

    def __len__(self) -> int:
        return len(self._segments)

    def __iter__(self) -> Iterator[Segment]:
        return iter(self._segments)

    def __getitem__(self, i: int) -> Segment:
        return self._segments[i]

    @property
    def active(self) -> Segment:
        return self._segments[-1]

    @property
    def first(self) -> Segment:
        return self._segments[0]

    def add(self, segment: Segment) -> None:
        """Append a segment after every other one."""
        if self._bases and segment.base_offset < self._segments[-1].next_offset:
            raise LogInvariantError(f"{segment.log_path.name}: segment at offset {segment.base_offset} does not "
                                    f"follow {self._segments[-1].log_path.name}, which ends at {self._segments[-1].next_offset}")
        self._segments.append(segment)
        self._bases.append(segment.base_offset)

    def floor_index(self, offset: int) -> int:
        """Index of the segment that would hold `offset` (the last with base <= offset), or -1."""
        return bisect_right(self._bases, offset) - 1

    def holding(self, start: int, end: int | None = None) -> list[Segment]:
        """Segments that may hold offsets in [start, end) (to the last segment without `end`)."""
        first = max(0, self.floor_index(start))
        last = len(self._segments) if end is None else max(first + 1, bisect_left(self._bases, end))
        return self._segments[first:last]

    def remove_first(self, count: int) -> list[Segment]:
        """Drop the `count` oldest segments (never the active one) and return them."""
        if not 0 <= count < len(self._segments):
            raise LogInvariantError(f"cannot remove the {count} oldest of {len(self._segments)} segments "
                                    f"(the active one, from offset {self.active.base_offset}, stays)")
        removed = self._segments[:count]
        del self._segments[:count]
        del self._bases[:count]
        return removed

    def restore_first(self, segments: list[Segment]) -> None:
        """Put back `segments`, the oldest ones `remove_first` returned (a retention that failed)."""
        self._segments[:0] = segments
        self._bases[:0] = [segment.base_offset for segment in segments]

    def remove_from(self, index: int) -> list[Segment]:
        """Drop the segments from `index` on (truncation) and return them."""
        removed = self._segments[index:]
        del self._segments[index:]
        del self._bases[index:]
        return removed

    def index_of_run(self, run: list[Segment]) -> int | None:
        """Where `run` (these very segments, consecutive) starts in the log, or None if it is not
        there as a whole (retention or truncation took some of it)."""
        if not run:
            return None
        i = self.floor_index(run[0].base_offset)
        if i < 0 or self._segments[i:i + len(run)] != run:
            return None
        return i

    def replace(self, old: list[Segment], new: Segment) -> None:
        """Put `new` where the consecutive sealed segments `old` are (the log cleaner's swap):
        `new` starts where `old` did and ends before the segment after them."""
        i = self.index_of_run(old)
        where = f"{new.log_path.name} (offsets {new.base_offset}..{new.next_offset})"
        if i is None or i + len(old) >= len(self._segments):
            raise LogInvariantError(f"{where}: the segments it replaces, {old}, are not a sealed run of the log")
        if new.base_offset != old[0].base_offset or new.next_offset > self._segments[i + len(old)].base_offset:
            raise LogInvariantError(f"{where}: does not fit where {old} were, before "
                                    f"{self._segments[i + len(old)].base_offset}")
        self._segments[i:i + len(old)] = [new]
        self._bases[i:i + len(old)] = [new.base_offset]

    def clear(self) -> list[Segment]:
        return self.remove_from(0)

    def size_bytes(self) -> int:
        return sum(segment.size for segment in self._segments)

    def snapshot(self) -> list[Segment]:
        return list(self._segments)
