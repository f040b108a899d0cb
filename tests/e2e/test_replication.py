"""Replication on a 3-broker cluster: a leader's unreplicated tail is never visible to consumers,
and a leader that died holding such a tail comes back as a follower, truncates it, catches up,
rejoins the ISR, and then holds the leader's log byte for byte; acks=all below
min.insync.replicas stores nothing; a replica fetch from a broker that is not a replica, or past the
leader's log end, is refused."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from client import Admin, Consumer, Producer
from common.errors import NotEnoughReplicasError
from tests.e2e.checker import History
from tests.helpers.cluster_scenarios import partitions_of, read_all, wait_for, wait_for_full_isr

TOPIC = "replicated"


def send(bootstrap: str, history: History, values: list[bytes], acks: str | int) -> None:
    with Producer(bootstrap, acks=acks, retries=0, linger_ms=2, request_timeout_ms=5_000) as producer:
        for value in values:
            history.sending(value)
            producer.send(TOPIC, value, partition=0,
                          on_delivery=lambda md, err, value=value: history.delivered(value, md.partition, md.offset, err))


def log_bytes(log_dir: Path) -> bytes:
    """Every segment of the partition's log, in offset order."""
    return b"".join(path.read_bytes() for path in sorted((log_dir / f"{TOPIC}-0").glob("*.log")))


def visible(bootstrap: str, expected: int) -> int:
    """How many records a consumer of partition 0 gets: it reads until `expected` arrived (or
    30 s passed), then keeps polling for a second to catch any record past them."""
    consumer = Consumer(bootstrap, auto_offset_reset="earliest", request_timeout_ms=5_000)
    try:
        consumer.assign([(TOPIC, 0)])
        total, deadline = 0, time.monotonic() + 30
        while total < expected and time.monotonic() < deadline:
            total += consumer.poll_arrow(timeout_ms=300).num_rows
        settle = time.monotonic() + 1
        while time.monotonic() < settle:
            total += consumer.poll_arrow(timeout_ms=200).num_rows
        return total
    finally:
        consumer.close()


def test_a_divergent_tail_is_never_read_and_is_truncated_when_its_leader_returns(cluster):
    local = cluster(3)
    history = History()
    with Admin(local.bootstrap) as admin:
        admin.create_topic(TOPIC, 1, replication_factor=3)
        first = wait_for_full_isr(admin, TOPIC)[0]
    old_leader = local.brokers[first.leader]
    followers = [local.brokers[r] for r in first.replicas if r != first.leader]
    send(local.bootstrap, history, [b"a%04d" % i for i in range(1000)], "all")

    for follower in followers:  # the leader's next records reach no follower
        follower.pause()
    try:
        # Five requests: a follower's fetch parked at the leader may still carry the first to its
        # (paused) socket, but no follower asks for the next ones.
        for batch in range(5):
            send(old_leader.bootstrap, history, [b"b%04d" % i for i in range(batch * 100, batch * 100 + 100)], 1)
            time.sleep(0.1)  # spacing, not a wait: five requests apart, each after the followers' last fetch
        assert sum(1 for v in history.acked if v.startswith(b"b")) == 500
        assert visible(old_leader.bootstrap, 1000) == 1000, "records above the high watermark were served"
        old_leader.kill()
    finally:
        for follower in followers:
            follower.resume()

    with Admin(local.bootstrap) as admin:
        state = wait_for(lambda: (lambda p: p if p.leader not in (-1, first.leader) else None)(
            partitions_of(admin, TOPIC)[0]), 30, "a new leader")
        assert state.leader_epoch > first.leader_epoch
        send(local.bootstrap, history, [b"c%04d" % i for i in range(300)], "all")
        old_leader.start()
        wait_for_full_isr(admin, TOPIC)
    logs = [b.log_dir for b in local.brokers]
    wait_for(lambda: len({log_bytes(d) for d in logs}) == 1, 30, "the three logs to be equal byte for byte")
    assert len(log_bytes(logs[0])) > 0

    read_all(local.bootstrap, TOPIC, 1, history, "final")
    report = history.check()
    lost = {value for _, value in report.lost}
    # Only acks=1 records can go (those the followers had not fetched when they were paused);
    # every acks=all record stays, at its offset.
    assert lost and all(value.startswith(b"b") for value in lost), str(report)
    assert not (report.moved or report.duplicated or report.inconsistent or report.gaps or report.unknown), str(report)


def test_acks_all_below_min_insync_replicas_stores_nothing(cluster):
    """Two of three brokers down: the ISR is the leader alone (its metrics say under-replicated
    and under min ISR), and acks=all with min.insync.replicas=2 gets NOT_ENOUGH_REPLICAS with
    nothing written; acks=1 still works."""
    local = cluster(3)
    with Admin(local.bootstrap) as admin:
        admin.create_topic(TOPIC, 1, replication_factor=3, configs={"min.insync.replicas": 2})
        first = wait_for_full_isr(admin, TOPIC)[0]
        for r in first.replicas:
            if r != first.leader:
                local.brokers[r].stop()
        wait_for(lambda: partitions_of(admin, TOPIC)[0].isr == (first.leader,), 30, "the ISR to shrink to the leader")
        metrics = wait_for(lambda: (lambda m: m if m.get("pymq_active_controller") == 1 else None)(
            local.brokers[first.leader].metrics()), 30, "the last broker to be the controller")
        assert metrics["pymq_under_replicated_partitions"] == 1 and metrics["pymq_under_min_isr_partitions"] == 1
        assert metrics[f'pymq_partition_in_sync_replicas{{partition="0",topic="{TOPIC}"}}'] == 1
        assert metrics["pymq_isr_shrinks_total"] == 0  # the controller, not the leader, dropped the stopped brokers
        with Producer(local.bootstrap, acks="all", retries=0) as producer:
            with pytest.raises(NotEnoughReplicasError):
                producer.send(TOPIC, b"x", partition=0).result(30)
        with Producer(local.bootstrap, acks=1, retries=0) as producer:
            assert producer.send(TOPIC, b"y", partition=0).result(30).offset == 0
        (end, _), = admin.list_offsets({(TOPIC, 0): -1}).values()
        assert end == 1


async def registered_incarnation(local, broker_id: int) -> str:  # type: ignore[no-untyped-def]
    """What broker `broker_id` wrote into its registration: what any process that can read the
    metadata store (and no client of the brokers) can prove an identity with."""
    from broker.cluster.brokers import broker_key
    from broker.cluster.etcd_metadata_store import EtcdMetadataStore

    store = EtcdMetadataStore(local.etcd.endpoint, f"pymq/{local.name}/")
    try:
        found = await store.get(broker_key(broker_id))
        assert found is not None, f"broker {broker_id} is not registered"
        return found.value["incarnation"]
    finally:
        await store.close()


def test_a_replica_fetch_from_a_broker_that_is_not_a_replica_is_refused(cluster):
    """On connections identified as registered brokers (the inter-broker handshake): the leader
    answers a Fetch from a broker that is not a replica REPLICA_NOT_AVAILABLE, one from a replica
    past its log end OFFSET_OUT_OF_RANGE (the follower's real progress is kept: the ISR stays
    whole), one naming an old leader epoch FENCED_LEADER_EPOCH and a newer one UNKNOWN_LEADER_EPOCH."""
    import asyncio

    from client.connection import BrokerConnection
    from protocol import BrokerHandshakeRequest, FetchPartition, FetchRequest, TopicRequest

    local = cluster(3)
    with Admin(local.bootstrap) as admin:
        admin.create_topic(TOPIC, 1, replication_factor=2)
        state = wait_for_full_isr(admin, TOPIC)[0]
    outsider = next(b for b in range(3) if b not in state.replicas)
    follower = next(r for r in state.replicas if r != state.leader)
    leader = local.brokers[state.leader]

    async def fetch(replica_id: int, epoch: int, offset: int = 0) -> int:
        proof = await registered_incarnation(local, replica_id)
        connection = await BrokerConnection.open(leader.host, leader.port)
        try:
            await connection.send(BrokerHandshakeRequest(replica_id, proof))
            request = FetchRequest((TopicRequest(TOPIC, (FetchPartition(0, offset, 1024, epoch),)),), 0, 0, None,
                                   replica_id)
            response = await connection.send(request)
            return response.topics[0].partitions[0].error_code
        finally:
            connection.close()

    def settled_fetch(replica_id: int, epoch: int, offset: int = 0) -> int:
        """The fetch's error code once the leader knows the partition and that it leads it: the
        metadata that named it may come from a broker whose watch saw the change first."""
        return wait_for(lambda: (lambda code: None if code in (3, 6) else code)(
            asyncio.run(fetch(replica_id, epoch, offset))), 30, "the leader serving the partition")

    assert settled_fetch(outsider, state.leader_epoch) == 9  # REPLICA_NOT_AVAILABLE
    assert settled_fetch(follower, state.leader_epoch, 2 ** 62) == 1  # OFFSET_OUT_OF_RANGE
    with Admin(local.bootstrap) as admin:
        assert set(partitions_of(admin, TOPIC)[0].isr) == set(state.replicas)
    leader.stop()  # the other replica leads under epoch + 1
    with Admin(local.bootstrap) as admin:
        moved = wait_for(lambda: (lambda p: p if p.leader not in (-1, state.leader) else None)(
            partitions_of(admin, TOPIC)[0]), 30, "a new leader")
    leader = local.brokers[moved.leader]
    assert settled_fetch(outsider, state.leader_epoch) == 74  # FENCED_LEADER_EPOCH
    assert settled_fetch(outsider, moved.leader_epoch + 1) == 75  # UNKNOWN_LEADER_EPOCH


def test_a_follower_cut_off_from_its_leader_leaves_the_isr_and_rejoins_when_healed(cluster):
    """A connection-dropping proxy in front of broker 0 cuts broker 1's replication from it while
    clients still get through: once broker 1 has not caught up for replica.lag.time.max.ms the
    leader drops it from the ISR (acks=all then needs only the others), and once the cut heals it
    catches up and joins again."""
    from broker.cluster.etcd_process import free_port
    from broker.cluster.local_cluster import broker_host
    from tests.e2e.proxy import CuttingProxy

    port = free_port(broker_host(0))
    with CuttingProxy((broker_host(0), port)) as proxy:
        local = cluster(3, broker_overrides={0: {"port": port, "advertised.host": "127.0.0.1",
                                                 "advertised.port": proxy.port}},
                        **{"replica.lag.time.max.ms": 2000})
        with Admin(local.bootstrap) as admin:
            admin.create_topic(TOPIC, 3, replication_factor=3)
            states = wait_for_full_isr(admin, TOPIC)
            partition = next(p for p, s in states.items() if s.leader == 0)
            proxy.cut(broker_host(1))
            with Producer(local.bootstrap, acks=1) as producer:
                for i in range(200):
                    producer.send(TOPIC, b"%d" % i, partition=partition)
                    if i % 20 == 0:
                        producer.flush()
                        time.sleep(0.1)  # pacing, not a wait: produce spread over the cut follower's lag window
            shrunk = wait_for(lambda: (lambda s: s if 1 not in s.isr else None)(partitions_of(admin, TOPIC)[partition]),
                              60, "broker 1 to leave the ISR")
            assert set(shrunk.isr) == {0, 2} and shrunk.leader == 0
            assert proxy.refused > 0
            with Producer(local.bootstrap, acks="all", retries=0) as producer:
                producer.send(TOPIC, b"after the cut", partition=partition).result(30)
            proxy.heal()
            grown = wait_for(lambda: (lambda s: s if 1 in s.isr else None)(partitions_of(admin, TOPIC)[partition]),
                             60, "broker 1 to rejoin the ISR")
            assert set(grown.isr) == {0, 1, 2} and grown.leader_epoch == shrunk.leader_epoch


def test_a_returning_follower_catches_up_through_fetches_cut_mid_batch(cluster):
    """A follower that was down returns behind many batches larger than its fetch size: every
    fetch response ends mid-batch (KIP-74), the follower appends the whole batches and fetches
    the rest, rejoins the ISR, and holds the leader's log byte for byte."""
    local = cluster(3, **{"replica.fetch.max.bytes": 5000, "replica.fetch.response.max.bytes": 5000})
    with Admin(local.bootstrap) as admin:
        admin.create_topic(TOPIC, 1, replication_factor=3, configs={"min.insync.replicas": 1})
        state = wait_for_full_isr(admin, TOPIC)[0]
        follower = next(r for r in state.replicas if r != state.leader)
        local.brokers[follower].stop()
        with Producer(local.bootstrap, acks=1, linger_ms=0, batch_size=2048) as producer:  # ~2 KB batches
            for i in range(3000):
                producer.send(TOPIC, b"%04d" % i + b"x" * 300, partition=0)
        local.brokers[follower].start()
        wait_for_full_isr(admin, TOPIC, timeout_s=60)
    logs = [local.brokers[r].log_dir for r in state.replicas]
    wait_for(lambda: len({log_bytes(d) for d in logs}) == 1, 30, "the logs to be equal byte for byte")
