"""Every record a producer sends through a leader failover gets an outcome (issue 38, item 1).

A producer (acks=all, linger 5 ms, on_delivery callbacks) sends keyed records to a 6-partition,
replication factor 3 topic while the leader of partition 0 is SIGKILLed. Once traffic stops,
every record must be acknowledged or failed within delivery.timeout.ms: none may be left waiting
for a later append to the partition (a produce parked on the broker for a high watermark that is
re-checked only when another record arrives, or a batch the producer never answers).

Before the fix (4 runs of ~13k records/s for 12 s), 50,000-61,000 records waited ~25 s on the
brokers after the last send, and 46-104 were still waiting 26-56 s after it: parked acks=all
produces that only their request timeout answered, and whose retries could be parked the same way.
Here each record must be acknowledged (two replicas stay alive: nothing has a reason to fail)
within ANSWERED_WITHIN_S of the last send, before the request timeout would let the producer
retry what a broker left waiting."""
from __future__ import annotations

import contextlib
import threading
import time

from client import Admin, Producer
from tests.helpers.cluster_scenarios import wait_for, wait_for_full_isr

TOPIC = "outcomes"
PARTITIONS = 6
SEND_S = 8  # how long the producer sends
KILL_AFTER_S = 3  # when the leader of partition 0 is killed
REQUEST_TIMEOUT_MS = 30_000
DELIVERY_TIMEOUT_MS = 45_000
ANSWERED_WITHIN_S = 20  # after the last send: the failover is over by then, however loaded the machine


class Outcomes:
    """Counts each record's outcome from its on_delivery callback (the producer's I/O thread)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acked = 0
        self.failed: dict[str, int] = {}
        self.unanswered: set[int] = set()

    def sending(self, i: int) -> None:
        with self.lock:
            self.unanswered.add(i)

    def delivered(self, i: int, error: BaseException | None) -> None:
        with self.lock:
            assert i in self.unanswered, f"record {i} answered twice"
            self.unanswered.discard(i)
            if error is None:
                self.acked += 1
            else:
                name = type(error).__name__
                self.failed[name] = self.failed.get(name, 0) + 1


def test_every_record_sent_through_a_failover_is_acknowledged_soon_after_the_last_send(cluster):
    local = cluster(3)
    with Admin(local.bootstrap) as admin:
        admin.create_topic(TOPIC, PARTITIONS, replication_factor=3, configs={"min.insync.replicas": 2})
        victim = local.brokers[wait_for_full_isr(admin, TOPIC)[0].leader]
    outcomes = Outcomes()
    producer = Producer(local.bootstrap, acks="all", linger_ms=5, request_timeout_ms=REQUEST_TIMEOUT_MS,
                        delivery_timeout_ms=DELIVERY_TIMEOUT_MS)
    try:
        start = time.monotonic()
        killed = False
        i = 0
        while time.monotonic() - start < SEND_S:
            for _ in range(100):
                outcomes.sending(i)
                producer.send(TOPIC, b"v%08d" % i, key=b"k%d" % (i % 997),
                              on_delivery=lambda md, err, i=i: outcomes.delivered(i, err))
                i += 1
            if not killed and time.monotonic() - start >= KILL_AFTER_S:
                victim.kill()
                killed = True
            time.sleep(0.01)  # pacing, not a wait: a steady load over SEND_S
        stopped = time.monotonic()
        try:
            wait_for(lambda: not outcomes.unanswered, ANSWERED_WITHIN_S, "every record's outcome", interval_s=0.5)
        finally:
            with outcomes.lock:
                print(f"sent {i}, acked {outcomes.acked}, failed {outcomes.failed}, "
                      f"unanswered {len(outcomes.unanswered)} {time.monotonic() - stopped:.1f} s after the last send")
    finally:
        with contextlib.suppress(TimeoutError):  # records left waiting fail the test above, not its cleanup
            producer.close(timeout_s=5)
    assert killed
    assert not outcomes.failed and outcomes.acked == i
