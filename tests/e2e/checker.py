"""A history checker in the style of Jepsen's Kafka analysis, for the cluster's fault tests.

A test records every acknowledged send (value, partition, offset) and every record any consumer
read (reader, partition, offset, value), across the whole run, then asks `check()` for anomalies:

- lost: an acknowledged value that no final read of its partition holds;
- moved: an acknowledged value read at another offset than the one acknowledged;
- duplicated: one value at two offsets (a retry stored twice is reported as such, and only
  allowed where the test says so);
- inconsistent: one offset holding two different values, across readers or over time;
- reordered: a reader that saw a partition's offsets go backwards or repeat within one pass;
- gaps: offsets missing inside what a final read covers (topics here are not compacted);
- unknown: a value read that was never sent.

Values must be unique per send. Thread-safe recording: producers' delivery callbacks run on
their I/O threads.
"""
from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable


@dataclass
class Report:
    lost: list[tuple[int, bytes]] = field(default_factory=list)
    moved: list[tuple[int, bytes, int, int]] = field(default_factory=list)  # partition, value, acked, read
    duplicated: list[tuple[int, bytes, list[int]]] = field(default_factory=list)
    inconsistent: list[tuple[int, int, set[bytes]]] = field(default_factory=list)
    reordered: list[tuple[str, int, int, int]] = field(default_factory=list)  # reader, partition, after, offset
    gaps: list[tuple[int, int]] = field(default_factory=list)  # partition, missing offset
    unknown: list[tuple[int, int, bytes]] = field(default_factory=list)
    acknowledged: int = 0
    read: int = 0

    @property
    def ok(self) -> bool:
        return not (self.lost or self.moved or self.duplicated or self.inconsistent or self.reordered or self.gaps
                    or self.unknown)

    def __str__(self) -> str:
        parts = [f"{self.acknowledged} acknowledged, {self.read} reads"]
        for name in ("lost", "moved", "duplicated", "inconsistent", "reordered", "gaps", "unknown"):
            found = getattr(self, name)
            if found:
                parts.append(f"{len(found)} {name}, e.g. {found[:3]}")
        return "; ".join(parts)


class History:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.sent: set[bytes] = set()
        self.acked: dict[bytes, tuple[int, int]] = {}  # value -> (partition, offset)
        self.failed: dict[bytes, str] = {}  # value -> why its send failed (it may still be stored)
        # reader -> partition -> [(offset, value)] in the order read
        self.reads: dict[str, dict[int, list[tuple[int, bytes]]]] = defaultdict(lambda: defaultdict(list))
        self.final_readers: set[str] = set()

    def sending(self, value: bytes) -> None:
        with self._lock:
            self.sent.add(value)

    def delivered(self, value: bytes, partition: int, offset: int, error: BaseException | None) -> None:
        """A producer's delivery callback: the outcome of one send."""
        with self._lock:
            if error is None and offset >= 0:
                self.acked[value] = (partition, offset)
            else:
                self.failed[value] = repr(error)

    def read(self, reader: str, partition: int, offsets: Iterable[int], values: Iterable[bytes], final: bool = False) -> None:
        """Records `reader` read, in order. A final reader read each partition whole, from the
        start to the end, after the faults."""
        with self._lock:
            self.reads[reader][partition].extend(zip(offsets, values))
            if final:
                self.final_readers.add(reader)

    def check(self, allow_duplicates: bool = False) -> Report:
        report = Report(acknowledged=len(self.acked))
        by_offset: dict[tuple[int, int], set[bytes]] = defaultdict(set)
        offsets_of: dict[tuple[int, bytes], set[int]] = defaultdict(set)
        final: dict[int, dict[int, bytes]] = defaultdict(dict)
        for reader, partitions in self.reads.items():
            for partition, records in partitions.items():
                last = -1
                for offset, value in records:
                    report.read += 1
                    if offset <= last:
                        report.reordered.append((reader, partition, last, offset))
                    last = offset
                    by_offset[(partition, offset)].add(value)
                    offsets_of[(partition, value)].add(offset)
                    if value not in self.sent:
                        report.unknown.append((partition, offset, value))
                    if reader in self.final_readers:
                        final[partition][offset] = value
        report.inconsistent = [(p, o, values) for (p, o), values in by_offset.items() if len(values) > 1]
        if not allow_duplicates:
            report.duplicated = [(p, v, sorted(o)) for (p, v), o in offsets_of.items() if len(o) > 1]
        final_values = {(p, v) for p, records in final.items() for v in records.values()}
        for value, (partition, offset) in self.acked.items():
            if (partition, value) not in final_values:
                report.lost.append((partition, value))
            elif offset not in offsets_of[(partition, value)]:
                report.moved.append((partition, value, offset, min(offsets_of[(partition, value)])))
        for partition, records in final.items():
            if records:
                present = set(records)
                report.gaps += [(partition, o) for o in range(min(present), max(present) + 1) if o not in present][:100]
        return report
