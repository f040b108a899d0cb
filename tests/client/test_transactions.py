"""Transactions through the client against a real broker: commit and abort as read_committed and
read_uncommitted consumers see them, the last stable offset an open transaction holds, fencing
by a new instance, consume-transform-produce with the group's offsets in the transaction, the
two-phase commit an engine's driver completes, the coordinator's timeout, and a producer
SIGKILLed mid-transaction."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest

from client import Admin, Consumer, Producer
from common.errors import InvalidTxnStateError, ProducerFencedError
from tests.helpers.client_records import produce, values
from tests.waiting import wait_until

SETTINGS = {"transaction.state.log.num.partitions": 3, "offsets.topic.num.partitions": 3,
            "group.initial.rebalance.delay.ms": 0}


@pytest.fixture
def txn_broker(broker_factory: Any) -> Any:
    return broker_factory(**SETTINGS).start()


def create(bootstrap: str, *topics: str, partitions: int = 1) -> None:
    with Admin(bootstrap) as admin:
        for topic in topics:
            admin.create_topic(topic, partitions=partitions)


def read_all(bootstrap: str, topic: str, partitions: int, isolation_level: str) -> list[tuple[int, int, bytes]]:
    """Every record a reader with `isolation_level` sees, as (partition, offset, value), read until
    each partition's position reaches its end offset (the LSO for read_committed): no count is
    assumed, so a record that should not be there is found."""
    tps = [(topic, p) for p in range(partitions)]
    with Consumer(bootstrap, auto_offset_reset="earliest", isolation_level=isolation_level,
                  fetch_max_wait_ms=50) as consumer:
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        seen: list[tuple[int, int, bytes]] = []
        deadline = time.monotonic() + 30
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, f"positions {[consumer.position(tp) for tp in tps]} never reached {ends}"
            seen += [(r.partition, r.offset, r.value) for r in consumer.poll(timeout_ms=100)]
    return sorted(seen)


def test_a_committed_transaction_is_seen_once_an_aborted_one_never(txn_broker: Any) -> None:
    """commit, abort, commit over two partitions: read_committed sees the two committed
    transactions' records once each, read_uncommitted sees the aborted ones too, and both step
    over the markers' offsets (one per partition per transaction)."""
    bootstrap = txn_broker.bootstrap
    create(bootstrap, "orders", partitions=2)
    with Producer(bootstrap, transactional_id="tx-orders") as producer:
        assert producer.init_transactions() == (None, None)
        for batch, commit in ((b"c", True), (b"a", False), (b"d", True)):
            producer.begin_transaction()
            for i in range(6):
                producer.send("orders", batch + b"%d" % i, partition=i % 2)
            producer.flush()  # the aborted ones are written too: readers must skip them
            producer.commit_transaction() if commit else producer.abort_transaction()
    committed = read_all(bootstrap, "orders", 2, "read_committed")
    assert sorted(v for _, _, v in committed) == sorted(values(6, b"c") + values(6, b"d"))
    everything = read_all(bootstrap, "orders", 2, "read_uncommitted")
    assert sorted(v for _, _, v in everything) == sorted(values(6, b"c") + values(6, b"a") + values(6, b"d"))
    assert [o for p, o, _ in everything if p == 0] == [0, 1, 2, 4, 5, 6, 8, 9, 10]  # markers at 3, 7, 11


def test_aborts_right_after_sends_leave_nothing_and_the_next_transaction_commits(txn_broker: Any) -> None:
    """abort_transaction() while the transaction's partitions are still joining it and its
    batches are unsent, several times: nothing of those transactions is ever visible, the
    producer is not fenced by its own abort, and its next transaction commits."""
    bootstrap = txn_broker.bootstrap
    create(bootstrap, "quick-abort", partitions=3)
    with Producer(bootstrap, transactional_id="tx-quick-abort", linger_ms=0) as producer:
        producer.init_transactions()
        for round_ in range(5):
            producer.begin_transaction()
            for i in range(30):
                producer.send("quick-abort", b"gone-%d-%d" % (round_, i), partition=i % 3)
            producer.abort_transaction()
        producer.begin_transaction()
        producer.send("quick-abort", b"kept", partition=0)
        producer.commit_transaction()
    assert [v for _, _, v in read_all(bootstrap, "quick-abort", 3, "read_committed")] == [b"kept"]


def test_an_open_transaction_holds_read_committed_readers_at_its_first_offset(txn_broker: Any) -> None:
    """Plain records, then a transaction's records acknowledged but not committed: a
    read_committed reader's end offset is the transaction's first offset (the LSO) and it sees
    only the plain records; once committed it sees all of them."""
    bootstrap = txn_broker.bootstrap
    create(bootstrap, "lso")
    produce(bootstrap, "lso", values(3, b"plain"), partition=0)
    with Producer(bootstrap, transactional_id="tx-lso") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        futures = [producer.send("lso", v, partition=0) for v in values(4, b"txn")]
        producer.flush()
        assert [f.result().offset for f in futures] == [3, 4, 5, 6]
        with Consumer(bootstrap, isolation_level="read_committed") as reader:
            assert reader.end_offsets([("lso", 0)]) == {("lso", 0): 3}
        assert [v for _, _, v in read_all(bootstrap, "lso", 1, "read_committed")] == values(3, b"plain")
        producer.commit_transaction()
    assert [v for _, _, v in read_all(bootstrap, "lso", 1, "read_committed")] == values(3, b"plain") + values(4, b"txn")


def test_a_new_instance_fences_the_old_one_and_aborts_its_open_transaction(txn_broker: Any) -> None:
    """The old instance's records are never visible to read_committed readers; its commit fails
    with PRODUCER_FENCED and it may send nothing more; the new instance's transaction is seen."""
    bootstrap = txn_broker.bootstrap
    create(bootstrap, "fence")
    old = Producer(bootstrap, transactional_id="tx-fence")
    try:
        old.init_transactions()
        old.begin_transaction()
        for v in values(5, b"zombie"):
            old.send("fence", v, partition=0)
        old.flush()
        with Producer(bootstrap, transactional_id="tx-fence") as new:
            new.init_transactions()  # retried while the old transaction's abort markers are written
            new.begin_transaction()
            new.send("fence", b"fresh", partition=0)
            new.commit_transaction()
        with pytest.raises(ProducerFencedError):
            old.commit_transaction()
        with pytest.raises(ProducerFencedError):
            old.send("fence", b"late", partition=0)
    finally:
        old.close()
    assert [v for _, _, v in read_all(bootstrap, "fence", 1, "read_committed")] == [b"fresh"]


def test_consume_transform_produce_commits_the_group_offsets_with_the_output(txn_broker: Any) -> None:
    """Kafka's exactly-once loop: records read by a group member, transformed and sent in a
    transaction with the member's positions (send_offsets_to_transaction). Committed: the output
    and the offsets are there; aborted: neither moved, so the records are read again."""
    bootstrap = txn_broker.bootstrap
    create(bootstrap, "in", "out")
    produce(bootstrap, "in", values(10), partition=0)
    with Consumer(bootstrap, group_id="upper", auto_offset_reset="earliest", enable_auto_commit=False,
                  isolation_level="read_committed") as consumer, \
            Producer(bootstrap, transactional_id="tx-upper") as producer:
        producer.init_transactions()
        consumer.subscribe(["in"])
        for commit in (False, True):
            records: list[Any] = []
            deadline = time.monotonic() + 30
            while len(records) < 10 and time.monotonic() < deadline:
                records += consumer.poll(timeout_ms=200)
            assert [r.value for r in records] == values(10)
            producer.begin_transaction()
            for r in records:
                producer.send("out", r.value.upper(), partition=0)
            producer.send_offsets_to_transaction({("in", 0): records[-1].offset + 1}, consumer.group_metadata())
            if commit:
                producer.commit_transaction()
            else:
                producer.abort_transaction()
                consumer.seek(("in", 0), consumer.committed([("in", 0)]).get(("in", 0)) or 0)
    assert [v for _, _, v in read_all(bootstrap, "out", 1, "read_committed")] == [v.upper() for v in values(10)]
    with Admin(bootstrap) as admin:
        assert admin.list_group_offsets("upper")[("in", 0)].offset == 10


def test_a_prepared_transaction_is_completed_by_another_client(txn_broker: Any) -> None:
    """Two-phase commit as an engine uses it: an executor's producer prepares (labelled with the
    batch) and goes away; the driver commits by (transactional id, producer id, epoch), and a
    retried commit is answered too. The next instance learns how the label ended. A prepared
    transaction whose id a newer instance took is aborted: the driver's commit is refused."""
    bootstrap = txn_broker.bootstrap
    create(bootstrap, "twopc")
    with Producer(bootstrap, transactional_id="task-0") as executor:
        executor.init_transactions()
        executor.begin_transaction()
        executor.send("twopc", b"batch-7", partition=0)
        prepared = executor.prepare_transaction(label="7")
        with pytest.raises(InvalidTxnStateError):
            executor.send("twopc", b"more", partition=0)
    assert read_all(bootstrap, "twopc", 1, "read_committed") == []  # prepared: not visible
    with Admin(bootstrap) as driver:
        assert driver.describe_transactions(["task-0"])[0].state == "Prepared"
        driver.complete_transaction(prepared, commit=True)
        driver.complete_transaction(prepared, commit=True)  # a retry
        wait_until(lambda: read_all(bootstrap, "twopc", 1, "read_committed"), 30, "the committed batch")
        with Producer(bootstrap, transactional_id="task-0") as next_executor:
            assert next_executor.init_transactions() == ("7", True)
            next_executor.begin_transaction()
            next_executor.send("twopc", b"batch-8", partition=0)
            stale = next_executor.prepare_transaction(label="8")
        with Producer(bootstrap, transactional_id="task-0") as replacement:
            replacement.init_transactions()  # a retried task: fences and aborts the prepared one
        with pytest.raises(ProducerFencedError):
            driver.complete_transaction(stale, commit=True)
    assert [v for _, _, v in read_all(bootstrap, "twopc", 1, "read_committed")] == [b"batch-7"]


def test_a_transaction_past_its_timeout_is_aborted_and_its_producer_fenced(broker_factory: Any) -> None:
    """transaction_timeout_ms elapses with the transaction open: the coordinator aborts it (the
    LSO moves on, its records are never visible) and the producer's commit is refused."""
    broker = broker_factory(**SETTINGS).start()
    create(broker.bootstrap, "slow")
    with Producer(broker.bootstrap, transactional_id="tx-slow", transaction_timeout_ms=1_000) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("slow", b"late", partition=0)
        producer.flush()
        with Consumer(broker.bootstrap, isolation_level="read_committed") as reader:
            wait_until(lambda: reader.end_offsets([("slow", 0)])[("slow", 0)] == 2, 30,
                       "the abort marker after the timeout")
        with pytest.raises(ProducerFencedError):
            producer.commit_transaction()
    assert read_all(broker.bootstrap, "slow", 1, "read_committed") == []


KILLED_PRODUCER = textwrap.dedent("""
    import os, signal, sys
    from client import Producer
    producer = Producer(sys.argv[1], transactional_id="tx-killed", linger_ms=0)
    producer.init_transactions()
    producer.begin_transaction()
    for i in range(50):
        producer.send("killed", b"doomed-%d" % i, partition=i % 2)
    producer.flush()  # acknowledged, inside the open transaction
    print("sent", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_a_producer_killed_mid_transaction_is_never_seen_and_its_successor_is_seen_once(txn_broker: Any) -> None:
    """A transactional producer SIGKILLed with 50 acknowledged records in its open transaction:
    read_committed readers see none of them (they wait at the LSO meanwhile); the restarted
    producer fences it (its transaction is aborted) and its next transaction is seen once."""
    bootstrap = txn_broker.bootstrap
    create(bootstrap, "killed", partitions=2)
    run = subprocess.run([sys.executable, "-c", KILLED_PRODUCER, bootstrap], capture_output=True, text=True, timeout=120)
    assert run.returncode == -9 and "sent" in run.stdout, run.stderr
    assert read_all(bootstrap, "killed", 2, "read_committed") == []  # held at the LSO: the transaction is open
    with Producer(bootstrap, transactional_id="tx-killed") as restarted:
        restarted.init_transactions()
        restarted.begin_transaction()
        for i in range(10):
            restarted.send("killed", b"kept-%d" % i, partition=i % 2)
        restarted.commit_transaction()
    seen = [v for _, _, v in read_all(bootstrap, "killed", 2, "read_committed")]
    assert sorted(seen) == sorted(b"kept-%d" % i for i in range(10))
    assert len([v for _, _, v in read_all(bootstrap, "killed", 2, "read_uncommitted")]) == 60


def test_an_admin_finds_the_coordinator_of_a_transactional_id_once(txn_broker: Any) -> None:
    """An Admin asked about the same transactional id again and again (a monitor polling its
    state) finds its coordinator once, not once per call."""
    with Producer(txn_broker.bootstrap, transactional_id="tx-found") as producer:
        producer.init_transactions()

    def finds() -> float:
        return txn_broker.metrics().get('pymq_requests_total{api="find_coordinator"}', 0.0)

    with Admin(txn_broker.bootstrap) as admin:
        assert admin.describe_transactions(["tx-found"])[0].state == "Empty"
        before = finds()
        assert before > 0  # the first call found it
        for _ in range(5):
            assert admin.describe_transactions(["tx-found"])[0].state == "Empty"
        assert finds() == before
