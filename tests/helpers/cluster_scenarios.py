"""What the multi-process cluster scenarios share: reads, waits and a load generator (the
`cluster` fixture itself is tests/conftest.py's)."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from client import Admin, Consumer, Producer
from tests.e2e.checker import History
from tests.waiting import wait_until

def wait_for(condition: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.2) -> Any:
    """tests/waiting.py's wait_until, tolerating errors from `condition`: in these scenarios a
    broker restarting answers errors meanwhile."""
    return wait_until(condition, timeout_s, what, interval_s, tolerate=(Exception,))


def partitions_of(admin: Admin, topic: str) -> dict[int, Any]:
    return {p.partition: p for p in admin.describe_topics([topic])[0].partitions}


def wait_for_full_isr(admin: Admin, topic: str, timeout_s: float = 60) -> dict[int, Any]:
    """Until every partition of `topic` has a leader and all its replicas in sync."""
    return wait_for(lambda: (lambda ps: ps if all(p.leader >= 0 and set(p.isr) == set(p.replicas) for p in ps.values())
                             else None)(partitions_of(admin, topic)), timeout_s, f"a full ISR on {topic}")


def read_all(bootstrap: str, topic: str, partitions: int, history: History, reader: str, timeout_s: float = 60) -> int:
    """Read every partition from its start to its end offset now (a final read); returns the count."""
    with Admin(bootstrap) as admin:
        ends = {p: end for (_, p), (end, _) in admin.list_offsets({(topic, p): -1 for p in range(partitions)}).items()}
    consumer = Consumer(bootstrap, auto_offset_reset="earliest", request_timeout_ms=10_000)
    count = 0
    try:
        consumer.assign([(topic, p) for p in range(partitions)])
        deadline = time.monotonic() + timeout_s
        done = {p for p, end in ends.items() if end == 0}
        while len(done) < partitions:
            assert time.monotonic() < deadline, f"final read of {topic} incomplete: {ends}"
            table = consumer.poll_arrow(timeout_ms=500)
            for p in range(partitions):
                rows = table.filter(table["partition"].to_numpy() == p) if table.num_rows else table
                if rows.num_rows:
                    offsets = rows["offset"].to_pylist()
                    history.read(reader, p, offsets, rows["value"].to_pylist(), final=True)
                    count += len(offsets)
                    if offsets[-1] + 1 >= ends[p]:
                        done.add(p)
    finally:
        consumer.close()
    return count


class Load(threading.Thread):
    """Sends values until stopped, acks=all with retries, recording every outcome."""

    def __init__(self, bootstrap: str, history: History, topic: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.history, self.topic = bootstrap, history, topic
        self.stopping = threading.Event()
        self.sent = 0

    def run(self) -> None:
        with Producer(self.bootstrap, acks="all", linger_ms=5, request_timeout_ms=5_000,
                      delivery_timeout_ms=60_000) as producer:
            while not self.stopping.is_set():
                for _ in range(200):
                    value = b"r%08d" % self.sent
                    self.sent += 1
                    self.history.sending(value)
                    producer.send(self.topic, value, on_delivery=lambda md, err, value=value: self.history.delivered(
                        value, md.partition, md.offset, err))
                time.sleep(0.02)  # pacing, not a wait: a steady load (at most 10k records/s), not a flood

    def wait_acked(self, count: int, timeout_s: float = 60) -> None:
        """Until `count` more sends than now are acknowledged: the load flows."""
        target = len(self.history.acked) + count
        wait_for(lambda: len(self.history.acked) >= target, timeout_s, f"{count} more acknowledged sends")

    def finish(self, timeout_s: float = 60) -> None:
        """Stop sending and wait until every send has its outcome."""
        self.stopping.set()
        self.join(90)
        assert not self.is_alive()
        wait_for(lambda: len(self.history.acked) + len(self.history.failed) >= self.sent, timeout_s, "every send's outcome")
