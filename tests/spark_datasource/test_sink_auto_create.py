"""The pymq sink and `auto.create.topics.enable`: where the brokers allow it, `df.write.format("pymq")`
to a topic that does not exist creates it (as Spark's Kafka sink relies on); where they do not
(pymq's default), the write fails with an error naming the setting, and creates nothing.
"""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from client import Admin
from broker.process import BrokerProcess

PARTITIONS = 2


@pytest.fixture(scope="module")
def brokers(module_broker_factory) -> Iterator[dict[bool, BrokerProcess]]:
    """One broker with auto-creation on, one with the default (off)."""
    yield {True: module_broker_factory("sink-auto-create-on", **{"auto.create.topics.enable": True,
                                                                 "num.partitions": PARTITIONS}).start(),
           False: module_broker_factory("sink-auto-create-off").start()}


def write(spark, bootstrap: str, topic: str, rows: list[tuple[str, str]]) -> None:
    (spark.createDataFrame(rows, "key string, value string").write.format("pymq").mode("append")
     .option("kafka.bootstrap.servers", bootstrap).option("topic", topic).save())


def test_sink_creates_a_new_topic_where_brokers_allow_it(spark, brokers, topic_name):
    """A batch write to a topic that does not exist creates it with num.partitions; every row reads back."""
    bootstrap = brokers[True].bootstrap
    rows = [(f"k{i % 5}", f"v{i}") for i in range(40)]
    write(spark, bootstrap, topic_name, rows)
    with Admin(bootstrap) as admin:
        [description] = admin.describe_topics([topic_name])
    assert len(description.partitions) == PARTITIONS
    read = (spark.read.format("pymq").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic_name)
            .load().selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)").collect())
    assert sorted((row[0], row[1]) for row in read) == sorted(rows)


def test_sink_to_a_missing_topic_fails_clearly_where_brokers_refuse(spark, brokers, topic_name):
    """With auto-creation off, the write fails naming the topic and auto.create.topics.enable; no topic appears."""
    bootstrap = brokers[False].bootstrap
    with pytest.raises(Exception, match="auto.create.topics.enable is false") as failure:
        write(spark, bootstrap, topic_name, [("k", "v")])
    assert topic_name in str(failure.value)
    with Admin(bootstrap) as admin:
        assert topic_name not in admin.list_topics()
