"""The Spark source and history() over a topic with transactions: committed, aborted and one still
open, spread over tiered segments. read_committed (the source's default) returns exactly the
committed records and plain ones, each once, stepping over the offsets markers and aborted
batches hold, from the brokers and from the remote tier read directly; read_uncommitted returns
every record up to the high watermark. Ground truth is what the producers were told."""
from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from broker.process import BrokerProcess
from client import Admin, Producer
from pymq import history
from tests.helpers.tiering import tiering_broker
from tests.waiting import wait_until
from tiered_storage import RemoteSegmentStore

TOPIC = "txn-history"
TXNS = 12


@pytest.fixture(scope="module")
def topic_with_transactions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Transactions of 20 records: every third aborted, the others committed, with plain records
    between them; then one left open (its producer still alive). Segments of 4 KiB, tiered with
    the local copies kept."""
    root = tmp_path_factory.mktemp("txn-tier")
    broker = tiering_broker(lambda **overrides: BrokerProcess(root / "broker", overrides), root, **{
        "transaction.state.log.num.partitions": 1, "offsets.topic.num.partitions": 1}).start()
    try:
        yield from _write_transactions(broker.bootstrap, root)
    finally:
        broker.kill()


def _write_transactions(bootstrap: str, root: Any) -> Iterator[dict[str, Any]]:
    with Admin(bootstrap) as admin:
        admin.create_topic(TOPIC, partitions=1, configs={"segment.bytes": 4096, "remote.storage.enable": "true",
                                                         "local.retention.bytes": -1, "retention.ms": -1})
    committed, aborted = [], []
    with Producer(bootstrap, transactional_id="history-txns", linger_ms=0) as producer, \
            Producer(bootstrap, linger_ms=0) as plain:
        producer.init_transactions()
        for t in range(TXNS):
            producer.begin_transaction()
            batch = [b"t%02d-%02d" % (t, i) + b"." * 100 for i in range(20)]
            for value in batch:
                producer.send(TOPIC, value, partition=0)
            if t % 3 == 1:
                producer.flush()  # written, then aborted: readers must skip them
                producer.abort_transaction()
                aborted += batch
            else:
                producer.commit_transaction()
                committed += batch
            plain.send(TOPIC, b"plain-%02d" % t, partition=0).result(30)
            committed.append(b"plain-%02d" % t)
        store = RemoteSegmentStore.from_url(f"file://{root}/remote")
        wait_until(lambda: len(store.load_manifest(TOPIC, 0).segments) >= 4, 60, "sealed segments tiered")
        opened = Producer(bootstrap, transactional_id="history-open", linger_ms=0)
        opened.init_transactions()
        opened.begin_transaction()
        left_open = [b"open-%02d" % i for i in range(5)]
        for value in left_open:
            opened.send(TOPIC, value, partition=0)
        opened.flush()
        try:
            yield {"bootstrap": bootstrap, "committed": committed, "aborted": aborted, "open": left_open,
                   "remote": f"file://{root}/remote", "producer": opened}
        finally:
            opened.close()


def read(spark: Any, bootstrap: str, **options: str) -> list[tuple[int, bytes]]:
    rows = (spark.read.format("pymq").option("kafka.bootstrap.servers", bootstrap).option("subscribe", TOPIC)
            .options(**options).load().select("offset", "value").collect())
    return sorted((r.offset, bytes(r.value)) for r in rows)


@pytest.mark.spark
def test_the_source_and_history_return_committed_records_once_and_step_over_the_gaps(spark, topic_with_transactions):
    t = topic_with_transactions
    bootstrap, committed = t["bootstrap"], sorted(t["committed"])
    default = read(spark, bootstrap)
    assert sorted(v for _, v in default) == committed
    offsets = [o for o, _ in default]
    assert offsets == sorted(set(offsets)) and offsets[-1] - offsets[0] + 1 > len(offsets)  # gaps: markers, aborts
    assert sorted(read(spark, bootstrap, **{"remoteStorage.url": t["remote"]})) == default
    rows = history(spark, TOPIC, bootstrap=bootstrap).select("value").collect()
    assert sorted(bytes(r.value) for r in rows) == committed
    everything = read(spark, bootstrap, **{"kafka.isolation.level": "read_uncommitted"})
    assert sorted(v for _, v in everything) == sorted(t["committed"] + t["aborted"] + t["open"])
    ending = json.dumps({TOPIC: {"0": offsets[-1] + 1}})
    assert read(spark, bootstrap, endingOffsets=ending) == default


@pytest.mark.spark
def test_a_committed_open_transaction_becomes_visible(spark, topic_with_transactions):
    """The open transaction held every read_committed read at its first offset; once committed,
    its records are read like the others."""
    t = topic_with_transactions
    t["producer"].commit_transaction()
    wait_until(lambda: len(read(spark, t["bootstrap"])) == len(t["committed"]) + len(t["open"]), 60,
               "the committed transaction's records")
    assert sorted(v for _, v in read(spark, t["bootstrap"])) == sorted(t["committed"] + t["open"])
