"""Hostile clients against `auto.create.topics.enable` (issue 35, item 5), on real broker processes:
a Metadata request that allows creation creates no invalid or internal topic, at most
auto.create.topics.max.per.request topics, and never past max.partitions however many requests
ask; with the setting off a flood of names creates nothing; another client still gets answers
within PROBE_BOUND_S (the one timing assert: generous, for a loaded machine).
"""
from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from client import Admin, Producer
from client.cluster import Cluster
from common.errors import InvalidTopicError, PolicyViolationError, UnknownTopicOrPartitionError
from broker.process import BrokerProcess
from protocol import MetadataRequest, MetadataResponse
from tests.hostile.probe import Probe

PARTITIONS = 3
PER_REQUEST = 4
FLOOD_MAX_PARTITIONS = 60
PROBE_BOUND_S = 10.0


@pytest.fixture(scope="module")
def enabled(module_broker_factory) -> BrokerProcess:
    return module_broker_factory("hostile-auto-create-on", **{
        "auto.create.topics.enable": True, "num.partitions": PARTITIONS,
        "auto.create.topics.max.per.request": PER_REQUEST}).start()


@pytest.fixture(scope="module")
def disabled(module_broker_factory) -> BrokerProcess:
    return module_broker_factory("hostile-auto-create-off").start()


def topics_of(broker: BrokerProcess) -> set[str]:
    with Admin(broker.bootstrap) as admin:
        return set(admin.list_topics())


async def _ask(cluster: Cluster, names: list[str], allow: bool) -> MetadataResponse:
    return await cluster.send(None, MetadataRequest(tuple(names), allow))


def metadata(broker: BrokerProcess, names: list[str], allow: bool) -> MetadataResponse:
    async def ask() -> MetadataResponse:
        cluster = Cluster(broker.bootstrap)
        try:
            return await _ask(cluster, names, allow)
        finally:
            await cluster.close()

    return asyncio.run(ask())


def test_request_creates_only_valid_topics_up_to_the_bound(enabled):
    """Invalid and internal names get INVALID_TOPIC_EXCEPTION; past max.per.request unknown topics, POLICY_VIOLATION."""
    names = ["h-0", "bad name!", "__consumer_offsets", "h-1", "h-0", "h-2", "h-3"]
    before = topics_of(enabled)
    reply = metadata(enabled, names, allow=True)
    answers = {topic.name: topic for topic in reply.topics}
    assert [topic.name for topic in reply.topics] == names
    assert answers["h-0"].error() is None and len(answers["h-0"].partitions) == PARTITIONS
    assert answers["h-1"].error() is None
    assert isinstance(answers["bad name!"].error(), InvalidTopicError)
    if "__consumer_offsets" not in before:  # created by the broker only, for groups
        assert isinstance(answers["__consumer_offsets"].error(), InvalidTopicError)
    for refused in ("h-2", "h-3"):
        assert isinstance(answers[refused].error(), PolicyViolationError)
        assert "auto.create.topics.max.per.request" in answers[refused].error_message
    assert topics_of(enabled) - before == {"h-0", "h-1"}


def test_disabled_broker_ignores_a_flood_of_names(disabled):
    """A request allowing creation of many names on a broker with it off creates none and answers each."""
    names = [f"flood-{i}" for i in range(500)]
    reply = metadata(disabled, names, allow=True)
    assert all(isinstance(topic.error(), UnknownTopicOrPartitionError) for topic in reply.topics)
    assert not {name for name in topics_of(disabled) if name.startswith("flood-")}


@pytest.fixture
def capped(broker_factory) -> Iterator[BrokerProcess]:
    yield broker_factory("hostile-auto-create-capped", **{
        "auto.create.topics.enable": True, "num.partitions": 1, "max.partitions": FLOOD_MAX_PARTITIONS,
        "auto.create.topics.max.per.request": 10}).start()


def test_flood_of_creating_requests_stops_at_max_partitions(capped):
    """Many pipelined requests, each naming 50 new topics, create exactly max.partitions topics; another client is answered meanwhile."""
    with Producer(capped.bootstrap, linger_ms=0) as producer:
        producer.send("probe-topic", b"v").result(timeout=30)  # itself auto-created: 1 of the partitions

    async def flood() -> list[MetadataResponse]:
        cluster = Cluster(capped.bootstrap)
        try:
            return await asyncio.gather(*(_ask(cluster, [f"flood-{r}-{i}" for i in range(50)], allow=True)
                                          for r in range(30)))
        finally:
            await cluster.close()

    with Probe(capped.port, "probe-topic") as probe:
        replies = asyncio.run(flood())
    assert probe.error is None and probe.answers > 0
    assert probe.worst_s < PROBE_BOUND_S, f"another client waited {probe.worst_s:.1f} s"
    created = {name for name in topics_of(capped) if name.startswith("flood-")}
    assert len(created) == FLOOD_MAX_PARTITIONS - 1
    answered = [topic for reply in replies for topic in reply.topics]
    assert {topic.name for topic in answered if topic.error() is None} == created
    refused = [topic.error() for topic in answered if topic.error() is not None]
    assert refused and all(isinstance(error, PolicyViolationError) for error in refused)


def test_producer_send_past_max_partitions_is_refused(capped):
    """Auto-created topics count against max.partitions: past it, a producer's send is refused POLICY_VIOLATION."""
    with Admin(capped.bootstrap) as admin:
        admin.create_topic("filler", partitions=FLOOD_MAX_PARTITIONS)
    with Producer(capped.bootstrap) as producer:
        with pytest.raises(PolicyViolationError, match="max.partitions"):
            producer.send("one-too-many", b"v")
    assert "one-too-many" not in topics_of(capped)
