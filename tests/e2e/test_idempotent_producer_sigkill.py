"""The idempotent producer through a leader's SIGKILL on the 3-broker cluster: a `Producer`
(acks=all, idempotent by default) sends numbered records to 3 partitions (replication factor 3,
min.insync.replicas 2), keeping every future; the broker leading most partitions is SIGKILLed
while it sends, and it keeps sending through the failover. Its retries of batches the dead leader
may have written and replicated must not be stored twice: per partition, read from the beginning,
no value appears twice, every acknowledged value is at the offset its future reports, and values
are in send order. A send whose future failed may be absent (it may or may not have been written).
(The at-least-once producer, enable_idempotence=False, stores retried batches twice here.)"""
from __future__ import annotations

import time
from collections import Counter

from client import Admin, Producer
from tests.helpers.cluster_scenarios import wait_for_full_isr
from tests.helpers.numbered_sends import NumberedSends, check_exactly_once, read_partitions

TOPIC = "idempotent-sigkill"
PARTITIONS = 3
ACKED_BEFORE = 500  # acknowledged sends per partition before the kill
ACKED_AFTER = 500  # acknowledged sends per partition made after the kill
MAX_SENDS = 100_000  # a bound, far beyond what a run needs
ROUND = 5  # records per partition between pauses: several batches in flight when the leader dies
PACING_S = 0.01  # between rounds: a steady producer (at most 1,500 records/s), not a flood


def _send_until(producer: Producer, sends: NumberedSends, done, what: str) -> None:
    """Rounds of records to every partition until `done()`; the failover spans a few seconds of them."""
    while not done():
        assert len(sends.futures) < MAX_SENDS, f"{what}: not after {MAX_SENDS} sends"
        for _ in range(ROUND):
            for partition in range(PARTITIONS):
                sends.send(producer, partition)
        time.sleep(PACING_S)  # pacing, not a wait: the condition above is what the test waits for


def test_a_leader_sigkilled_under_idempotent_acks_all_produce_leaves_no_duplicate_and_no_gap(cluster):
    """SIGKILL the broker leading most partitions mid-produce; after failover and retries each
    partition holds every acknowledged value once, in send order, at its acknowledged offset."""
    local = cluster(3)
    with Admin(local.bootstrap) as admin:
        admin.create_topic(TOPIC, PARTITIONS, replication_factor=3, configs={"min.insync.replicas": 2})
        leaders = Counter(p.leader for p in wait_for_full_isr(admin, TOPIC).values())
    victim = local.brokers[leaders.most_common(1)[0][0]]
    sends = NumberedSends(TOPIC)
    with Producer(local.bootstrap, acks="all", linger_ms=5, request_timeout_ms=5_000,
                  delivery_timeout_ms=120_000) as producer:
        _send_until(producer, sends, lambda: sends.acknowledged_since(0, ACKED_BEFORE, PARTITIONS),
                    "acknowledgements before the kill")
        killed_at = len(sends.futures)
        victim.kill()
        _send_until(producer, sends, lambda: sends.acknowledged_since(killed_at, ACKED_AFTER, PARTITIONS),
                    "acknowledgements of sends made after the kill")
        producer.flush()
        retried = producer.metrics()["record-retry-total"]
    failed = sends.failed()
    survivors = ",".join(b.bootstrap for b in local.brokers if b is not victim)
    check_exactly_once(sends, read_partitions(survivors, TOPIC, PARTITIONS))
    print(f"{len(sends.futures)} sends, {killed_at} before the kill of broker {victim.bootstrap} "
          f"(leader of {leaders.most_common(1)[0][1]}); {retried:.0f} records retried; {len(failed)} failed, e.g. {failed[:1]}")
    assert retried > 0, "no batch was retried: the kill caught no request in flight"
