"""The transaction coordinator's broker SIGKILLed on the 3-broker cluster, `__transaction_state`
replicated three times:

- between prepare and commit (two-phase commit): the prepared transaction survives in the
  replicated state; the driver's commit, sent after the kill, reaches the new coordinator and
  the transaction completes: read_committed readers see all of its records, never a part;
- right after commit_transaction returned (PREPARE_COMMIT stored, markers under way): the new
  coordinator finishes writing the markers: all of the records become visible, once.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

from client import Admin, Consumer, Producer
from client.cluster import Cluster
from protocol import TRANSACTION_KEY_TYPE, FindCoordinatorRequest
from tests.helpers.cluster_scenarios import wait_for_full_isr
from tests.waiting import wait_until

TOPIC = "txn-failover"
PARTITIONS = 3
RECORDS = 30
SETTINGS = {"transaction.state.log.num.partitions": 1, "transaction.state.log.replication.factor": 3,
            "offsets.topic.num.partitions": 1}


def coordinator_of(bootstrap: str, transactional_id: str) -> int:
    async def find() -> int:
        cluster = Cluster(bootstrap)
        try:
            found = await cluster.send(None, FindCoordinatorRequest(transactional_id, TRANSACTION_KEY_TYPE))
            assert found.error() is None, found.error()
            return found.node_id
        finally:
            await cluster.close()
    return asyncio.run(find())


def committed_values(bootstrap: str) -> list[bytes]:
    """Every record a read_committed reader sees, read to each partition's end offset."""
    tps = [(TOPIC, p) for p in range(PARTITIONS)]
    with Consumer(bootstrap, auto_offset_reset="earliest", isolation_level="read_committed",
                  fetch_max_wait_ms=50) as consumer:
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        seen: list[bytes] = []
        deadline = time.monotonic() + 30
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, "positions never reached the end offsets"
            seen += [r.value for r in consumer.poll(timeout_ms=100)]
    return sorted(seen)


def all_or_nothing(bootstrap: str, values: list[bytes]) -> bool:
    """True once every value is visible; fails the test if a part of them is."""
    seen = [v for v in committed_values(bootstrap) if v in set(values)]
    assert len(seen) in (0, len(values)), f"{len(seen)} of {len(values)} records of one transaction visible"
    assert len(seen) == len(set(seen)), "a record visible twice"
    return len(seen) == len(values)


def test_transactions_complete_across_a_sigkill_of_their_coordinator(cluster: Any) -> None:
    local = cluster(3, **SETTINGS)
    with Admin(local.bootstrap) as admin:
        admin.create_topic(TOPIC, PARTITIONS, replication_factor=3, configs={"min.insync.replicas": 2})
        wait_for_full_isr(admin, TOPIC)
    prepared_values = [b"prepared-%02d" % i for i in range(RECORDS)]
    with Producer(local.bootstrap, transactional_id="failover-2pc", request_timeout_ms=5_000) as executor:
        executor.init_transactions()
        with Admin(local.bootstrap) as admin:
            wait_for_full_isr(admin, "__transaction_state")
        executor.begin_transaction()
        for i, value in enumerate(prepared_values):
            executor.send(TOPIC, value, partition=i % PARTITIONS)
        prepared = executor.prepare_transaction(label="batch-1")
    victim = local.brokers[coordinator_of(local.bootstrap, "failover-2pc")]
    victim.kill()
    survivors = ",".join(b.bootstrap for b in local.brokers if b is not victim)
    assert all_or_nothing(survivors, prepared_values) is False  # prepared: nothing visible yet
    with Admin(survivors, request_timeout_ms=60_000) as driver:
        driver.complete_transaction(prepared, commit=True)
    wait_until(lambda: all_or_nothing(survivors, prepared_values), 60, "the prepared transaction's records")

    victim.start()
    with Admin(local.bootstrap) as admin:
        wait_for_full_isr(admin, "__transaction_state")
    committed = [b"committed-%02d" % i for i in range(RECORDS)]
    with Producer(local.bootstrap, transactional_id="failover-commit", request_timeout_ms=5_000) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        for i, value in enumerate(committed):
            producer.send(TOPIC, value, partition=i % PARTITIONS)
        producer.commit_transaction()  # the decision is stored; the markers may still be on their way
        victim = local.brokers[coordinator_of(local.bootstrap, "failover-commit")]
        victim.kill()
    survivors = ",".join(b.bootstrap for b in local.brokers if b is not victim)
    wait_until(lambda: all_or_nothing(survivors, committed), 60, "the committed transaction's records")
    assert committed_values(survivors) == sorted(prepared_values + committed)
