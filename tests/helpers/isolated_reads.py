"""Read a topic to its end as a read_committed or read_uncommitted consumer sees it: every record,
no count assumed, so a record that should not be there is found (the exactly-once tests' check)."""
from __future__ import annotations

import time

from client import Consumer


def read_isolated(bootstrap: str, topic: str, partitions: int, isolation_level: str,
                  timeout_s: float = 60) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """(partition, offset, key, value) of every record, read until each partition's position
    reaches its end offset (the last stable offset for read_committed), sorted."""
    tps = [(topic, p) for p in range(partitions)]
    with Consumer(bootstrap, auto_offset_reset="earliest", isolation_level=isolation_level,
                  fetch_max_wait_ms=50) as consumer:
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        seen = []
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, f"positions {[consumer.position(tp) for tp in tps]} never reached {ends}"
            seen += [(r.partition, r.offset, r.key, r.value) for r in consumer.poll(timeout_ms=100)]
    return sorted(seen)
