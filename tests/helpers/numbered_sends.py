"""Ground truth for the idempotent producer's fault tests: numbered sends, each future kept, and a
check of every partition's log against them.

A value is its send's number (b"%08d"), so a value read names the send it came from and the
order sends were made in. `check_exactly_once` reads a topic from the beginning and demands, per
partition: no value twice, every acknowledged value at the offset its RecordMetadata says, values
in send order, offsets without holes. A send whose future failed may be absent (its outcome is
unknown: it may or may not have been written), but if present it obeys the same rules.
"""
from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import partial

from client import Admin, Consumer, Producer
from client.producer_batch import RecordFuture, RecordMetadata


@dataclass
class NumberedSends:
    """Every send of a test, in send order: (partition asked for, future), and per partition the
    numbers acknowledged so far, in the order the producer reported them (on its I/O thread)."""

    topic: str
    futures: list[RecordFuture] = field(default_factory=list)
    partitions: list[int] = field(default_factory=list)
    acknowledged: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))

    def send(self, producer: Producer, partition: int) -> None:
        number = len(self.futures)
        self.partitions.append(partition)
        self.futures.append(producer.send(self.topic, b"%08d" % number, partition=partition,
                                          on_delivery=partial(self._delivered, number)))

    def _delivered(self, number: int, metadata: RecordMetadata, error: BaseException | None) -> None:
        if error is None:
            self.acknowledged[metadata.partition].append(number)

    def acknowledged_since(self, number: int, count: int, partitions: int) -> bool:
        """Whether every partition has its last `count` acknowledgements from sends `number` on."""
        return all(len(acked) >= count and min(acked[-count:]) >= number
                   for acked in (self.acknowledged[p] for p in range(partitions)))

    def failed(self) -> list[tuple[int, BaseException]]:
        return [(n, f.exception()) for n, f in enumerate(self.futures) if f.done() and f.exception() is not None]


def read_partitions(bootstrap: str, topic: str, partitions: int, timeout_s: float = 60) -> dict[int, list[tuple[int, int]]]:
    """Each partition of `topic` from the beginning to its end offset now: [(offset, number)]."""
    with Admin(bootstrap, request_timeout_ms=10_000) as admin:
        ends = {p: end for (_, p), (end, _) in admin.list_offsets({(topic, p): -1 for p in range(partitions)}).items()}
    read: dict[int, list[tuple[int, int]]] = defaultdict(list)
    consumer = Consumer(bootstrap, auto_offset_reset="earliest", request_timeout_ms=10_000)
    try:
        consumer.assign([(topic, p) for p in range(partitions)])
        deadline = time.monotonic() + timeout_s
        while any((read[p][-1][0] + 1 if read[p] else 0) < end for p, end in ends.items()):
            assert time.monotonic() < deadline, f"read of {topic} incomplete after {timeout_s} s: ends {ends}"
            table = consumer.poll_arrow(timeout_ms=500)
            for p, offset, value in zip(*(table[c].to_pylist() for c in ("partition", "offset", "value"))):
                read[p].append((offset, int(value)))
    finally:
        consumer.close()
    return {p: read[p] for p in range(partitions)}


def check_exactly_once(sends: NumberedSends, logs: dict[int, list[tuple[int, int]]]) -> None:
    """AssertionError naming every anomaly of `logs` (read_partitions) against `sends`."""
    problems: list[str] = []
    for partition, records in logs.items():
        numbers = [n for _, n in records]
        twice = sorted(n for n, count in Counter(numbers).items() if count > 1)
        if twice:
            problems.append(f"partition {partition}: {len(twice)} values stored twice, e.g. "
                            f"{[(n, [o for o, m in records if m == n]) for n in twice[:3]]}")
        stray = [n for n in numbers if n >= len(sends.futures) or sends.partitions[n] != partition]
        if stray:
            problems.append(f"partition {partition}: values never sent to it, e.g. {stray[:3]}")
        backwards = [(a, b) for a, b in zip(numbers, numbers[1:]) if b <= a]
        if backwards:
            problems.append(f"partition {partition}: {len(backwards)} values out of send order, e.g. {backwards[:3]}")
        offsets = [o for o, _ in records]
        if offsets and offsets != list(range(offsets[0], offsets[0] + len(offsets))):
            problems.append(f"partition {partition}: offsets with holes between {offsets[0]} and {offsets[-1]}")
    at = {(p, o): n for p, records in logs.items() for o, n in records}
    misplaced = []
    for number, future in enumerate(sends.futures):
        if future.exception() is None:
            metadata = future.result()
            if at.get((metadata.partition, metadata.offset)) != number:
                misplaced.append((number, metadata.partition, metadata.offset, at.get((metadata.partition, metadata.offset))))
    if misplaced:
        problems.append(f"{len(misplaced)} acknowledged sends not at their acknowledged offset "
                        f"(number, partition, offset, found there), e.g. {misplaced[:3]}")
    assert not problems, "; ".join(problems)
