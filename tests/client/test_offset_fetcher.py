"""OffsetFetcher against a real broker: start positions from committed offsets, else
auto_offset_reset; seek_to_* as reset requests; a seek made while a lookup is out wins."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from client.cluster import Cluster
from client.offset_fetcher import OffsetFetcher
from client.subscription_state import SubscriptionState
from common.errors import NoOffsetForPartitionError, NotLeaderError, UnknownTopicOrPartitionError
from common.topic_partition import TopicPartition
from protocol import ListOffsetsRequest
from tests.client.fake_cluster import FakeCluster
from tests.helpers.client_records import produce, values

Committed = Callable[[list[TopicPartition]], Awaitable[dict[TopicPartition, int | None]]]


def run(bootstrap: str, strategy: str, scenario: Callable[[OffsetFetcher, SubscriptionState], Awaitable[None]],
        committed: Committed | None = None) -> SubscriptionState:
    """Run `scenario` with an OffsetFetcher over a real Cluster; the SubscriptionState it left."""
    subs = SubscriptionState(strategy)

    async def main() -> None:
        cluster = Cluster(bootstrap)
        try:
            await scenario(OffsetFetcher(cluster, subs, committed), subs)
        finally:
            await cluster.close()

    asyncio.run(asyncio.wait_for(main(), 30))
    return subs


def committed_offsets(found: dict[TopicPartition, int]) -> Committed:
    async def lookup(tps: list[TopicPartition]) -> dict[TopicPartition, int | None]:
        return {tp: found.get(tp) for tp in tps}
    return lookup


@pytest.mark.parametrize("strategy, expected", [("earliest", {1: 0}), ("latest", {1: 5}), ("none", {})],
                         ids=["earliest", "latest", "none"])
def test_start_positions_are_committed_offsets_else_auto_offset_reset(shared_broker, new_topic, strategy, expected):
    """Partition 0 has a committed offset (3), partition 1 none: 0 starts there whatever the
    strategy, 1 per auto_offset_reset; with "none" it has no position and is missing (poll raises)."""
    topic = new_topic(2)
    for partition in (0, 1):
        produce(shared_broker.bootstrap, topic, values(5), partition=partition)
    p0, p1 = (topic, 0), (topic, 1)

    async def scenario(offsets: OffsetFetcher, subs: SubscriptionState) -> None:
        subs.subscribe([topic], None)
        subs.assign_from_subscribed([p0, p1])
        await offsets.initialize_positions(subs.initializing_partitions())

    subs = run(shared_broker.bootstrap, strategy, scenario, committed_offsets({p0: 3}))
    assert subs.all_consumed() == {p0: 3} | {(topic, p): o for p, o in expected.items()}
    assert subs.initializing_partitions() == [] and subs.partitions_needing_reset() == {}
    assert subs.missing_positions() == ([] if expected else [p1])
    if not expected:
        with pytest.raises(NoOffsetForPartitionError, match="seek first"):
            subs.position(p1)


def test_a_seek_made_while_the_committed_offset_is_looked_up_wins(shared_broker, new_topic):
    """on_assign (or the application) seeks while the OffsetFetch is out: the committed offset
    and the reset do not overwrite it."""
    topic = new_topic(2)
    produce(shared_broker.bootstrap, topic, values(5), partition=1)
    p0, p1 = (topic, 0), (topic, 1)
    subs_box: list[SubscriptionState] = []

    async def committed(tps: list[TopicPartition]) -> dict[TopicPartition, int | None]:
        subs_box[0].seek(p0, 4)
        subs_box[0].seek(p1, 2)
        return {p0: 1, p1: None}

    async def scenario(offsets: OffsetFetcher, subs: SubscriptionState) -> None:
        subs_box.append(subs)
        subs.subscribe([topic], None)
        subs.assign_from_subscribed([p0, p1])
        await offsets.initialize_positions([p0, p1])

    assert run(shared_broker.bootstrap, "latest", scenario, committed).all_consumed() == {p0: 4, p1: 2}


def test_seek_to_beginning_and_end_are_resets_resolved_at_once(shared_broker, new_topic):
    """reset_positions moves the positions (and fetch positions) to the log's start or end and
    leaves no request pending."""
    topic = new_topic(1)
    produce(shared_broker.bootstrap, topic, values(7))
    tp = (topic, 0)
    seen: list[tuple[int, int | None]] = []

    async def scenario(offsets: OffsetFetcher, subs: SubscriptionState) -> None:
        subs.assign_from_user([tp])
        await offsets.reset_positions([tp], "latest")
        seen.append((subs.position(tp), subs.fetch_position(tp)))
        await offsets.reset_positions([tp], "earliest")
        seen.append((subs.position(tp), subs.fetch_position(tp)))

    subs = run(shared_broker.bootstrap, "none", scenario)
    assert seen == [(7, 7), (0, 0)] and subs.partitions_needing_reset() == {}


def test_a_failed_lookup_leaves_the_partitions_as_they_were(shared_broker, new_topic):
    """The committed-offset lookup fails: the partitions stay initializing (the next poll
    retries) with no reset left pending; a failed seek_to_end keeps the position."""
    topic = new_topic(1)
    tp = (topic, 0)

    async def failing(tps: list[TopicPartition]) -> dict[TopicPartition, int | None]:
        raise UnknownTopicOrPartitionError("the coordinator does not know it")

    async def scenario(offsets: OffsetFetcher, subs: SubscriptionState) -> None:
        subs.subscribe([topic], None)
        subs.assign_from_subscribed([tp])
        with pytest.raises(UnknownTopicOrPartitionError):
            await offsets.initialize_positions([tp])
        assert subs.initializing_partitions() == [tp]
        subs.seek(tp, 0)
        subs.assign_from_subscribed([tp, (topic, 5)])  # a partition the topic does not have: ListOffsets fails
        with pytest.raises(UnknownTopicOrPartitionError):
            await offsets.reset_positions([tp, (topic, 5)], "latest")
        assert (subs.position(tp), subs.partitions_needing_reset()) == (0, {})

    run(shared_broker.bootstrap, "earliest", scenario, failing)


def test_a_moved_leader_is_looked_up_again_and_other_partitions_start_meanwhile():
    """Group-assigned partitions awaiting their auto_offset_reset: partition 0's leader moved
    after the consumer's metadata was read (its old leader answers NOT_LEADER), partition 1's did
    not. The first lookup positions partition 1 (it is fetched meanwhile) and refreshes metadata,
    so the next one finds partition 0's new leader; with stale metadata every later attempt asked
    the old leader again, and a group member never started reading (a rolling restart)."""

    async def main() -> None:
        fake = await FakeCluster(nodes=2).start()
        fake.add_topic("t", 2, leader=0)
        cluster = Cluster(fake.bootstrap)
        subs = SubscriptionState("earliest")
        try:
            offsets = OffsetFetcher(cluster, subs, committed_offsets({}))
            await cluster.refresh()
            fake.move_leader("t", 0, 1)
            subs.subscribe(["t"], None)
            subs.assign_from_subscribed([("t", 0), ("t", 1)])
            with pytest.raises(NotLeaderError):
                await offsets.initialize_positions(subs.initializing_partitions())
            assert subs.all_consumed() == {("t", 1): 0} and subs.initializing_partitions() == [("t", 0)]
            await offsets.initialize_positions(subs.initializing_partitions())
            assert subs.all_consumed() == {("t", 0): 0, ("t", 1): 0} and subs.initializing_partitions() == []
            assert [node for node, r in fake.requests if isinstance(r, ListOffsetsRequest)] == [0, 1]
        finally:
            await cluster.close()
            await fake.close()

    asyncio.run(asyncio.wait_for(main(), 30))
