"""Filter pushdown for batch reads: predicates on `partition`, `offset` and `timestamp`.

- `partition` (=, IN, <, <=, >, >=): only matching partitions are planned. Fully handled.
- `offset` (=, IN, <, <=, >, >=): each range is narrowed to [lowest, highest]; the range reader
  trims at exactly those offsets, so `=`, `<`, `<=`, `>`, `>=` are fully handled. `IN` narrows
  to its span and is left for Spark to finish.
- `timestamp` (>, >=, =): each partition starts at the first offset whose record time is at or
  after the bound (ListOffsets by time); with CreateTime a later record may carry an earlier
  time, so Spark still applies the filter. `<`/`<=` narrow no offset range for the same reason, nor
  does a bound before the epoch. With `remoteStorage.url`, both sides (`time_low_ms`,
  `time_high_ms`) also skip whole remote segments whose [min, max] record times miss them
  (`PartitionManifest.prune`); Spark still applies the filter.

- `IS NOT NULL` on a column that is never null (all but key, value, headers): handled.

Everything else goes back to Spark untouched.
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass

from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
)


NEVER_NULL = frozenset({"topic", "partition", "offset", "timestamp", "timestampType"})


@dataclass
class PushedFilters:
    """What the pushed filters leave to read: partitions allowed, offset bounds, a time bound."""

    partition_low: int = 0  # inclusive
    partition_high: int = 1 << 31  # exclusive
    partition_in: frozenset[int] | None = None  # None: no IN list
    offset_low: int = 0  # inclusive
    offset_high: int | None = None  # exclusive
    time_low_ms: int | None = None  # records before this time may be skipped
    time_high_ms: int | None = None  # records after this time may be skipped (inclusive bound)

    def allows_partition(self, partition: int) -> bool:
        return (self.partition_low <= partition < self.partition_high
                and (self.partition_in is None or partition in self.partition_in))

    def narrow(self, start: int, end: int) -> tuple[int, int]:
        """[start, end) cut to the offset bounds (possibly empty: start >= end)."""
        high = end if self.offset_high is None else min(end, self.offset_high)
        return max(start, self.offset_low), high

    def push(self, filters: Iterable[Filter]) -> Iterable[Filter]:
        """Take what can be used; yield what Spark must still evaluate (pyspark's contract)."""
        for f in filters:
            attribute = getattr(f, "attribute", ())  # `Not` has a child filter, no column
            column = attribute[0] if len(attribute) == 1 else None
            if isinstance(f, IsNotNull) and column in NEVER_NULL:
                continue
            if column == "partition" and self._partition(f):
                continue
            if column == "offset" and self._offset(f):
                if isinstance(f, In):
                    yield f
                continue
            if column == "timestamp":
                self._timestamp(f)
            yield f

    def _partition(self, f: Filter) -> bool:
        if isinstance(f, In):
            if not all(_is_int(v) for v in f.value):
                return False
            values = frozenset(f.value)
            self.partition_in = values if self.partition_in is None else self.partition_in & values
            return True
        low, high = _bounds(f)
        if low is None:
            return False
        self.partition_low = max(self.partition_low, low)
        if high is not None:
            self.partition_high = min(self.partition_high, high)
        return True

    def _offset(self, f: Filter) -> bool:
        if isinstance(f, In):
            if not all(_is_int(v) for v in f.value):
                return False
            low, high = (min(f.value), max(f.value) + 1) if f.value else (0, 0)
        else:
            low, high = _bounds(f)
            if low is None:
                return False
        self.offset_low = max(self.offset_low, low)
        if high is not None:
            self.offset_high = high if self.offset_high is None else min(self.offset_high, high)
        return True

    def _timestamp(self, f: Filter) -> None:
        if not isinstance(f.value if hasattr(f, "value") else None, dt.datetime):
            return
        ms = _epoch_ms(f.value)
        if ms < 0:  # ListOffsets takes -1/-2 as latest/earliest and refuses other negatives
            return
        if isinstance(f, (LessThan, LessThanOrEqual, EqualTo)):
            # Milliseconds floored: a record time (whole ms) below a sub-ms bound is at most this.
            self.time_high_ms = ms if self.time_high_ms is None else min(self.time_high_ms, ms)
        if isinstance(f, (GreaterThan, GreaterThanOrEqual, EqualTo)):
            self.time_low_ms = ms if self.time_low_ms is None else max(self.time_low_ms, ms)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _bounds(f: Filter) -> tuple[int | None, int | None]:
    """[low, high) of an integer comparison (high None: unbounded); (None, None) if not one."""
    v = getattr(f, "value", None)
    if not _is_int(v):
        return None, None
    found = {EqualTo: (v, v + 1), GreaterThan: (v + 1, None), GreaterThanOrEqual: (v, None),
             LessThan: (0, v), LessThanOrEqual: (0, v + 1)}.get(type(f))
    return found if found is not None else (None, None)


def _epoch_ms(value: dt.datetime) -> int:
    """Spark hands timestamps over as datetimes; naive ones are UTC (the session time zone is
    applied by Spark before pushdown)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return (value - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)) // dt.timedelta(milliseconds=1)
