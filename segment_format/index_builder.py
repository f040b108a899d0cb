"""IndexBuilder: which batches of a segment its two sparse indexes name (Kafka's LogSegment.append).

One rule for every writer of segments, the broker's `Segment` and `SegmentWriter` (Spark jobs),
so a segment's index files are the same bytes whoever wrote it:

- an offset-index entry (batch base offset -> position) once more than `index.interval.bytes`
  were written since the last entry (or since the segment's start);
- with it, a time-index entry for the largest timestamp so far and the first batch that reached
  it, kept only if that timestamp exceeds the last entry's (TIME_INDEX's maybe-append);
- at seal, that time-index entry once more, so the last entry is the segment's max timestamp
  (what time-based retention reads after a restart).

Pure: the entries go to the in-memory indexes; where their bytes end up is the caller's business.
"""
from __future__ import annotations

from segment_format.index_file import NO_TIMESTAMP, SparseIndex


class IndexBuilder:
    """The two indexes of one segment and the running max timestamp their entries need."""

    __slots__ = ("offset_index", "time_index", "max_timestamp", "offset_of_max_timestamp")

    def __init__(self, offset_index: SparseIndex, time_index: SparseIndex) -> None:
        self.offset_index = offset_index
        self.time_index = time_index
        self.max_timestamp = NO_TIMESTAMP
        self.offset_of_max_timestamp = offset_index.base_offset

    def observe(self, base_offset: int, max_timestamp: int) -> None:
        """Account a batch's max timestamp without indexing it (a batch already indexed, read
        back after a restart or a truncation)."""
        if max_timestamp > self.max_timestamp:
            self.max_timestamp = max_timestamp
            self.offset_of_max_timestamp = base_offset

    def add(self, base_offset: int, max_timestamp: int, position: int, index_interval_bytes: int) -> None:
        """Account a batch appended at byte `position` and add the index entries the rule asks for."""
        self.observe(base_offset, max_timestamp)
        if position - self.offset_index.last_entry[1] > index_interval_bytes:
            self.offset_index.append(base_offset, position)
            self.time_index.append(self.max_timestamp, self.offset_of_max_timestamp)  # kept if the max grew

    def seal(self) -> None:
        """The last time-index entry: the segment's max timestamp, unless an entry has it already
        (or the segment is empty: there is no timestamp to name, and an entry would point below
        its first offset)."""
        if self.max_timestamp != NO_TIMESTAMP:
            self.time_index.append(self.max_timestamp, self.offset_of_max_timestamp)

    def resume(self) -> None:
        """Take the running max from the time index's last entry (Kafka's loadLargestTimestamp):
        every batch up to it is accounted; the caller observes the batches after it."""
        self.max_timestamp, self.offset_of_max_timestamp = self.time_index.last_entry

    def reset(self) -> None:
        """Drop every entry and the running max (before the indexes are rebuilt)."""
        self.offset_index.reset()
        self.time_index.reset()
        self.max_timestamp = NO_TIMESTAMP
        self.offset_of_max_timestamp = self.offset_index.base_offset
