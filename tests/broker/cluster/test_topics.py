"""TopicRegistry over the local metadata store: topic creation, growth and deletion are each one
transaction (one revision, all keys or none), and losing to a concurrent writer writes nothing."""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from broker.cluster.local_metadata_store import LocalMetadataStore
from broker.cluster.topics import TopicRegistry
from broker.config import BrokerConfig
from common.errors import PolicyViolationError, TopicAlreadyExistsError, VersionConflictError

TIMEOUT_S = 10
Scenario = Callable[[TopicRegistry, LocalMetadataStore], Awaitable[None]]


@pytest.fixture
def run(tmp_path: Path) -> Callable[[Scenario], None]:
    """run(scenario): a registry over a fresh local store in tmp_path, on a new loop with a timeout."""
    defaults = BrokerConfig.load().log_defaults

    def run_(scenario: Scenario) -> None:
        async def main() -> None:
            store = LocalMetadataStore(tmp_path / "__cluster_metadata.json")
            registry = TopicRegistry(store, 0, defaults)
            await registry.load()
            try:
                await scenario(registry, store)
            finally:
                await store.close()

        asyncio.run(asyncio.wait_for(main(), TIMEOUT_S))

    return run_


def test_create_writes_the_topic_and_every_partition_at_one_revision(run):
    """A 100-partition topic appears in one revision: topic key and 100 partition states, all
    with the same mod revision; a registry loading the store sees the same topic."""

    async def scenario(registry: TopicRegistry, store: LocalMetadataStore) -> None:
        before = await store.revision()
        info = await registry.create("orders", 100, 1, {"retention.ms": 60000})
        assert await store.revision() == before + 1
        keys = await store.list("")
        assert set(keys) == {"topics/orders"} | {f"partitions/orders/{p}" for p in range(100)}
        assert {record.mod_revision for record in keys.values()} == {before + 1}
        assert info.version == keys["topics/orders"].version == 1
        reloaded = TopicRegistry(store, 0, registry.log_defaults)
        await reloaded.load()
        again = reloaded.get("orders")
        assert (again.topic_id, again.partition_count, again.configs, again.partitions) == (
            info.topic_id, 100, {"retention.ms": 60000, "key.partitioner": "murmur2"}, info.partitions)

    run(scenario)


def test_create_losing_to_another_writer_is_topic_already_exists_and_writes_nothing(run):
    """The topic key appeared in the store behind this registry's cache (another broker): creation
    fails with TOPIC_ALREADY_EXISTS and no partition state is written."""

    async def scenario(registry: TopicRegistry, store: LocalMetadataStore) -> None:
        await store.put("topics/orders", {"topic_id": "other", "partitions": 1, "replication_factor": 1, "configs": {}})
        before = await store.revision()
        with pytest.raises(TopicAlreadyExistsError):
            await registry.create("orders", 3, 1, {})
        assert await store.revision() == before
        assert await store.list("partitions/") == {}
        assert "orders" not in registry.topics

    run(scenario)


def test_add_partitions_is_one_transaction_and_a_concurrent_change_writes_nothing(run):
    """Growing 2 -> 5 partitions writes the topic key and 3 states at one revision; growing after
    another writer changed the topic key fails with CONCURRENT_METADATA_UPDATE, nothing written,
    the cache unchanged."""

    async def scenario(registry: TopicRegistry, store: LocalMetadataStore) -> None:
        await registry.create("orders", 2, 1, {})
        before = await store.revision()
        assert await registry.add_partitions("orders", 5) == [2, 3, 4]
        assert await store.revision() == before + 1
        assert (await store.get("topics/orders")).value["partitions"] == 5
        assert {(await store.get(f"partitions/orders/{p}")).mod_revision for p in (2, 3, 4)} == {before + 1}

        current = await store.get("topics/orders")
        await store.put("topics/orders", current.value)  # another writer
        with pytest.raises(VersionConflictError) as raised:
            await registry.add_partitions("orders", 8)
        assert raised.value.name() == "CONCURRENT_METADATA_UPDATE"
        assert set(await store.list("partitions/orders/")) == {f"partitions/orders/{p}" for p in range(5)}
        assert registry.get("orders").partition_count == 5 and sorted(registry.get("orders").partitions) == list(range(5))

    run(scenario)


def test_delete_removes_the_topic_and_all_its_partition_keys_at_one_revision(run):
    """Deletion removes the topic key and every key under its partitions, a stray one left by an
    older broker included, in one revision; a topic whose name extends it is untouched."""

    async def scenario(registry: TopicRegistry, store: LocalMetadataStore) -> None:
        await registry.create("orders", 3, 1, {})
        await registry.create("orders-eu", 1, 1, {})
        await store.put("partitions/orders/7", {"leader": 0, "leader_epoch": 0, "replicas": [0], "isr": [0]})
        before = await store.revision()
        await registry.delete("orders")
        assert await store.revision() == before + 1
        assert set(await store.list("")) == {"topics/orders-eu", "partitions/orders-eu/0"}
        assert set(registry.topics) == {"orders-eu"}

    run(scenario)


def test_delete_after_a_concurrent_change_is_a_conflict_and_removes_nothing(run):
    """The topic key changed behind the cache: deletion raises VersionConflictError and every key stays."""

    async def scenario(registry: TopicRegistry, store: LocalMetadataStore) -> None:
        await registry.create("orders", 2, 1, {})
        await store.put("topics/orders", (await store.get("topics/orders")).value)
        keys = set(await store.list(""))
        with pytest.raises(VersionConflictError):
            await registry.delete("orders")
        assert set(await store.list("")) == keys and "orders" in registry.topics

    run(scenario)


def test_max_partitions_counts_the_replicas_each_broker_would_host(run):
    """Three live brokers, max.partitions 10: a replication-factor-3 topic of 10 partitions puts
    10 replicas on each; any further partition is refused (POLICY_VIOLATION, nothing written),
    and an internal topic (not `limited`) is created all the same."""

    async def scenario(registry: TopicRegistry, store: LocalMetadataStore) -> None:
        registry.live_brokers = lambda: {0: "", 1: "", 2: ""}
        registry.max_partitions = 10
        await registry.create("full", 10, 3, {})
        before = await store.revision()
        with pytest.raises(PolicyViolationError, match="would put 11 partition replicas on broker"):
            await registry.create("more", 1, 1, {})
        with pytest.raises(PolicyViolationError, match="adding partitions to 'full'"):
            await registry.add_partitions("full", 11)
        with pytest.raises(PolicyViolationError):
            registry.validate_partition_limit(range(1), 1, "creating topic 'more'")
        assert await store.revision() == before and set(registry.topics) == {"full"}
        await registry.create("__internal", 3, 1, {}, limited=False)

    run(scenario)


def test_max_partitions_refuses_a_reassignment_onto_a_broker_at_the_limit(run):
    """max.partitions 20 over three live brokers, 20 + 20 + 19 replicas: a move onto the broker
    with 19 is accepted (a move keeps its old replicas until done, so the source still counts);
    the next onto it, or onto a full one, is refused POLICY_VIOLATION with nothing written; a
    move among the brokers a partition already has (a leadership swap) adds nothing and passes."""

    async def scenario(registry: TopicRegistry, store: LocalMetadataStore) -> None:
        registry.live_brokers = lambda: {0: "", 1: "", 2: ""}
        registry.max_partitions = 20
        info = await registry.create("full", 59, 1, {})
        on = {b: [p for p, s in info.partitions.items() if s.replicas == (b,)] for b in range(3)}
        roomy = next(b for b in range(3) if len(on[b]) == 19)
        full = [b for b in range(3) if b != roomy]
        hosted = registry.replica_counts()
        await registry.reassign("full", on[full[0]][0], (roomy,), hosted)
        assert hosted[roomy] == 20
        before = await store.revision()
        with pytest.raises(PolicyViolationError, match=f"would put 21 partition replicas on broker {roomy}"):
            await registry.reassign("full", on[full[1]][0], (roomy,), hosted)
        with pytest.raises(PolicyViolationError, match=f"reassigning full-{on[roomy][0]} to \\[{full[0]}\\]"):
            await registry.reassign("full", on[roomy][0], (full[0],))
        assert await store.revision() == before
        await registry.reassign("full", on[full[0]][0], None)  # a cancel adds no replica
        await registry.create("pair", 1, 2, {}, limited=False)
        pair = registry.get("pair").partitions[0].replicas
        await registry.reassign("pair", 0, tuple(reversed(pair)))

    run(scenario)


def test_a_state_written_here_does_not_overwrite_a_newer_one_the_watch_brought_meanwhile(run):
    """A broker writes a partition state (a leader its ISR, the controller a decision); before
    the store's answer reaches it, its watch brings another writer's newer state of the key. The
    cache keeps the newer one: it was set back to the state written here, the newer change never
    came again, and the controller (deciding from the cache) left a reassignment uncompleted for
    good (the `partition reassign` of test_cluster_cli waited until the test timed out)."""
    from dataclasses import replace

    from broker.cluster.metadata_store import Put, WatchEvent
    from broker.cluster.topics import partition_key

    async def scenario(registry: TopicRegistry, store: LocalMetadataStore) -> None:
        info = await registry.create("orders", 1, 1, {})
        key, first = partition_key("orders", 0), info.partitions[0]
        written, newer = replace(first, leader_epoch=first.leader_epoch + 1), replace(first, leader_epoch=first.leader_epoch + 2)
        real_txn = store.txn

        async def txn_then_a_newer_write_watched(compares, on_success, on_failure=()):  # type: ignore[no-untyped-def]
            result = await real_txn(compares, on_success, on_failure)
            store.txn = real_txn  # type: ignore[method-assign]
            other = await real_txn([], [Put(key, newer.to_json())])  # another broker's write, seen by the watch
            registry.apply_event(WatchEvent("put", key, newer.to_json(), 3, other.revision))
            return result

        store.txn = txn_then_a_newer_write_watched  # type: ignore[method-assign]
        assert await registry.alter_partition_state("orders", 0, written)
        assert registry.get("orders").partitions[0] == newer
        assert registry.get("orders").revisions[0] == await store.revision()

    run(scenario)
