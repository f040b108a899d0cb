"""Hostile clients against replication: a client that claims to be a follower (Fetch with
`replica_id` set) is refused CLUSTER_AUTHORIZATION_FAILED and changes nothing, on a single broker
and on a 3-broker cluster whose followers are stopped, where before the fix a forged fetch offset
of 2**62 kept them in the ISR and acks=all records were acknowledged that failover then lost."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from client import Admin, Producer
from client.connection import BrokerConnection
from common.errors import ClusterAuthorizationFailedError, NotEnoughReplicasAfterAppendError, NotEnoughReplicasError
from protocol import (
    BrokerHandshakeRequest,
    FetchPartition,
    FetchRequest,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderPartition,
    TopicRequest,
)
from tests.e2e.checker import History
from tests.helpers.cluster_scenarios import partitions_of, read_all, wait_for_full_isr

TOPIC = "forged"
FORGED_OFFSET = 2 ** 62


def forged_fetch(replica_id: int, offset: int = FORGED_OFFSET) -> FetchRequest:
    return FetchRequest((TopicRequest(TOPIC, (FetchPartition(0, offset, 1024),)),), 0, 0, None, replica_id)


async def send_on_new_connection(host: str, port: int, *requests) -> list:  # type: ignore[no-untyped-def]
    """Each request in turn on one fresh connection: its response, or the PymqError it raised."""
    connection = await BrokerConnection.open(host, port)
    answers = []
    try:
        for request in requests:
            try:
                answers.append(await connection.send(request, timeout_s=10))
            except ClusterAuthorizationFailedError as err:
                answers.append(err)
    finally:
        connection.close()
    return answers


def test_an_anonymous_replica_fetch_is_refused_on_a_single_broker(broker):
    """Fetch and OffsetForLeaderEpoch as broker 0 (the broker's own id) without a handshake, and a
    handshake with a guessed incarnation, all get CLUSTER_AUTHORIZATION_FAILED; the high watermark
    and what consumers read stay as they were."""
    with Admin(broker.bootstrap) as admin:
        admin.create_topic(TOPIC, 1)
    with Producer(broker.bootstrap, acks=1) as producer:
        producer.send(TOPIC, b"only", partition=0).result(30)
    epoch_request = OffsetForLeaderEpochRequest((TopicRequest(TOPIC, (OffsetForLeaderPartition(0, 0),)),), 0)
    answers = asyncio.run(send_on_new_connection(
        broker.host, broker.port, forged_fetch(0), epoch_request,
        BrokerHandshakeRequest(0, "0" * 32), forged_fetch(0, offset=0)))
    assert all(isinstance(a, ClusterAuthorizationFailedError) for a in answers), answers
    assert "anonymous" in str(answers[0]) and "does not match" in str(answers[2])
    with Admin(broker.bootstrap) as admin:
        (end, _), = admin.list_offsets({(TOPIC, 0): -1}).values()
    assert end == 1  # the high watermark: one record, nothing else claimed
    # A consumer's fetch (replica_id -1) on the same kind of connection is served as ever.
    response, = asyncio.run(send_on_new_connection(broker.host, broker.port, forged_fetch(-1, 0)))
    assert response.topics[0].partitions[0].error_code == 0 and response.topics[0].partitions[0].high_watermark == 1


class Forger(threading.Thread):
    """Sends, until stopped, the forged fetch of each of `replicas` to the leader, each on a new
    connection (as an anonymous client would), counting the refusals."""

    def __init__(self, host: str, port: int, replicas: list[int]) -> None:
        super().__init__(daemon=True)
        self.host, self.port, self.replicas = host, port, replicas
        self.stopping = threading.Event()
        self.sent = self.refused = 0

    def run(self) -> None:
        while not self.stopping.is_set():
            for replica in self.replicas:
                answer, = asyncio.run(send_on_new_connection(self.host, self.port,
                                                             forged_fetch(replica)))
                self.sent += 1
                self.refused += isinstance(answer, ClusterAuthorizationFailedError)
            time.sleep(0.05)  # pacing, not a wait: a forger's steady fetches


def test_a_forged_follower_cannot_keep_stopped_followers_in_sync_or_lose_acks_all_records(cluster):
    """Both followers of a partition stopped (SIGSTOP, within their session timeout, so only the
    leader can drop them from the ISR) while an anonymous client sends Fetch as each of them from
    offset 2**62: every forged fetch is refused, the leader drops the followers after
    replica.lag.time.max.ms, and no acks=all record is acknowledged (min.insync.replicas=2). The
    leader stops, the followers resume, the leader returns: nothing acknowledged is lost."""
    local = cluster(3, **{"broker.session.timeout.ms": 60_000, "replica.lag.time.max.ms": 2_000})
    history = History()
    with Admin(local.bootstrap) as admin:
        admin.create_topic(TOPIC, 1, replication_factor=3, configs={"min.insync.replicas": 2})
        first = wait_for_full_isr(admin, TOPIC)[0]
    leader = local.brokers[first.leader]
    followers = [r for r in first.replicas if r != first.leader]
    # Retried as any producer would: on a loaded machine a follower may lag past
    # replica.lag.time.max.ms for a moment, and acks=all waits or retries until it is back.
    with Producer(leader.bootstrap, acks="all", delivery_timeout_ms=60_000) as producer:
        for i in range(20):  # replicated before the followers stop
            history.sending(b"before-%d" % i)
            producer.send(TOPIC, b"before-%d" % i, partition=0,
                          on_delivery=lambda md, err, v=b"before-%d" % i: history.delivered(v, md.partition, md.offset, err))
    assert len(history.acked) == 20, f"before the followers stop: {history.failed}"
    with Admin(local.bootstrap) as admin:
        wait_for_full_isr(admin, TOPIC)  # the followers hold them before they stop

    for r in followers:
        local.brokers[r].pause()
    forger = Forger(leader.host, leader.port, followers)
    forger.start()
    try:
        with Producer(leader.bootstrap, acks="all", retries=0, request_timeout_ms=30_000,
                      delivery_timeout_ms=60_000) as producer:
            for i in range(50):
                value = b"during-%d" % i
                history.sending(value)
                producer.send(TOPIC, value, partition=0,
                              on_delivery=lambda md, err, v=value: history.delivered(v, md.partition, md.offset, err))
        during_acked = [v for v in history.acked if v.startswith(b"during")]
        assert not during_acked, f"{len(during_acked)} of 50 acks=all records acknowledged with both followers stopped"
        with Admin(leader.bootstrap) as admin:
            assert partitions_of(admin, TOPIC)[0].isr == (first.leader,)
        with Producer(leader.bootstrap, acks="all", retries=0) as producer:
            with pytest.raises((NotEnoughReplicasError, NotEnoughReplicasAfterAppendError)):
                producer.send(TOPIC, b"refused", partition=0).result(30)
    finally:
        forger.stopping.set()
        forger.join(30)
    assert forger.sent > 0 and forger.refused == forger.sent, (forger.sent, forger.refused)

    leader.stop()
    for r in followers:
        local.brokers[r].resume()
    leader.start()
    with Admin(local.bootstrap) as admin:
        state = wait_for_full_isr(admin, TOPIC)[0]
    assert state.leader == first.leader  # the only in-sync replica when it stopped
    read_all(local.bootstrap, TOPIC, 1, history, "final")
    # The "before" sends are retried: a retry after NOT_ENOUGH_REPLICAS_AFTER_APPEND stores a record
    # twice (at least once: the producer is not idempotent yet). What this test proves is no loss.
    report = history.check(allow_duplicates=True)
    assert not report.lost and report.ok, str(report)
