"""`auto.create.topics.enable` against real brokers: a Metadata request that allows it (a producer's
lookups; a consumer's only with `allow_auto_create_topics`) creates unknown topics with
num.partitions; off (pymq's default) the producer gets UNKNOWN_TOPIC_OR_PARTITION saying so and
nothing is created. Hostile requests: tests/hostile/test_hostile_auto_create.py.
"""
from __future__ import annotations

import asyncio

import pytest

from client import Admin, Consumer, Producer
from client.cluster import Cluster
from broker.config import BROKER_CONFIGS
from common.errors import UnknownTopicOrPartitionError
from broker.process import BrokerProcess
from protocol import MetadataRequest, MetadataResponse

PARTITIONS = 3


@pytest.fixture(scope="module")
def enabled(module_broker_factory) -> BrokerProcess:
    return module_broker_factory("auto-create-on", **{"auto.create.topics.enable": True, "num.partitions": PARTITIONS}).start()


@pytest.fixture(scope="module")
def disabled(module_broker_factory) -> BrokerProcess:
    return module_broker_factory("auto-create-off").start()


def topics_of(broker: BrokerProcess) -> set[str]:
    with Admin(broker.bootstrap) as admin:
        return set(admin.list_topics())


def metadata(broker: BrokerProcess, names: list[str], allow: bool) -> MetadataResponse:
    async def ask() -> MetadataResponse:
        cluster = Cluster(broker.bootstrap)
        try:
            return await cluster.send(None, MetadataRequest(tuple(names), allow))
        finally:
            await cluster.close()

    return asyncio.run(ask())


def test_off_by_default_unlike_kafka():
    """pymq's default is off (Kafka's is on): a typo or a hostile client creates nothing unless the operator chose so."""
    assert BROKER_CONFIGS["auto.create.topics.enable"].default is False


@pytest.mark.slow
def test_producer_creates_an_unknown_topic_when_enabled(enabled):
    """A producer's first send to an unknown topic creates it with num.partitions; the records land in it."""
    with Producer(enabled.bootstrap, linger_ms=0) as producer:
        futures = [producer.send("auto-orders", f"v{i}".encode(), key=f"k{i}".encode()) for i in range(12)]
        producer.flush()
    assert all(future.result(timeout=30).offset >= 0 for future in futures)
    with Admin(enabled.bootstrap) as admin:
        [description] = admin.describe_topics(["auto-orders"])
    assert len(description.partitions) == PARTITIONS
    with Consumer(enabled.bootstrap) as consumer:
        ends = consumer.end_offsets([("auto-orders", p) for p in range(PARTITIONS)])
    assert sum(ends.values()) == 12


def test_producer_gets_a_clear_error_when_disabled(disabled):
    """With auto-creation off, a send to an unknown topic fails at once naming the setting, and creates nothing."""
    with Producer(disabled.bootstrap) as producer:
        with pytest.raises(UnknownTopicOrPartitionError, match="auto.create.topics.enable is false"):
            producer.send("typo-orders", b"v")
    assert "typo-orders" not in topics_of(disabled)


def test_consumer_creates_only_when_allowed(enabled):
    """A consumer's lookup creates nothing unless allow_auto_create_topics; with it the topic is created."""
    tp = ("auto-reads", 0)
    with Consumer(enabled.bootstrap) as consumer:
        with pytest.raises(UnknownTopicOrPartitionError):
            consumer.end_offsets([tp])
    assert "auto-reads" not in topics_of(enabled)
    with Consumer(enabled.bootstrap, allow_auto_create_topics=True) as consumer:
        assert consumer.end_offsets([tp]) == {tp: 0}
    assert "auto-reads" in topics_of(enabled)


def test_metadata_without_the_flag_creates_nothing(enabled):
    """A Metadata request that does not allow creation answers unknown topics UNKNOWN_TOPIC_OR_PARTITION, creating none."""
    reply = metadata(enabled, ["never-asked"], allow=False)
    assert isinstance(reply.topics[0].error(), UnknownTopicOrPartitionError)
    assert "never-asked" not in topics_of(enabled)
