"""etcd unreachable (hung with SIGSTOP): the brokers keep serving the partitions they lead with the
ISR they have (acks=all produces and reads go on), a metadata change fails with the named,
retriable METADATA_STORE_UNAVAILABLE, and everything works again once etcd is back. With the
members of a 3-member etcd cluster as their endpoints, brokers lose nothing when the member they
use dies: they go on with the next one."""
from __future__ import annotations

import time

import pytest

from client import Admin, Producer
from broker.cluster.etcd_process import endpoints, start_members
from common.errors import MetadataStoreUnavailableError
from tests.helpers.cluster_scenarios import partitions_of, read_all, wait_for, wait_for_full_isr
from tests.e2e.checker import History

TOPIC = "steady"


def test_brokers_serve_through_an_etcd_outage_and_refuse_metadata_changes(cluster, etcd):
    # A session longer than the outage (even on a loaded machine): etcd must not expire the
    # brokers' leases when it resumes.
    local = cluster(3, **{"broker.session.timeout.ms": 45_000})
    history = History()
    with Admin(local.bootstrap) as admin:
        admin.create_topic(TOPIC, 3, replication_factor=3, configs={"min.insync.replicas": 2})
        wait_for_full_isr(admin, TOPIC)
    # The ISR is full from the topic's creation on. An acks=all record in each partition shows
    # that every replica has its log and follows before etcd stops answering: a replica that had
    # not applied the topic yet (a loaded machine) would hold every acks=all produce to its
    # partitions until the outage ends, since the ISR cannot shrink without etcd.
    with Producer(local.bootstrap, acks="all", request_timeout_ms=10_000, delivery_timeout_ms=60_000) as warm_up:
        for partition in range(3):
            value = b"before-%d" % partition
            history.sending(value)
            warm_up.send(TOPIC, value, partition=partition, on_delivery=lambda md, err, value=value: history.delivered(
                value, md.partition, md.offset, err))
        warm_up.flush()
    assert len(history.acked) == 3, history.failed
    producer = Producer(local.bootstrap, acks="all", retries=0, request_timeout_ms=10_000)
    try:
        etcd.pause()
        outage_started = time.monotonic()
        try:
            for i in range(300):
                value = b"during-%d" % i
                history.sending(value)
                producer.send(TOPIC, value, on_delivery=lambda md, err, value=value: history.delivered(
                    value, md.partition, md.offset, err))
            producer.flush()
            assert len(history.acked) == 3 + 300, history.failed
            with Admin(local.bootstrap) as admin:
                with pytest.raises(MetadataStoreUnavailableError) as refused:
                    admin.create_topic("during-the-outage", 1, replication_factor=3)
                assert refused.value.retriable
            assert time.monotonic() - outage_started < 40, "the outage outlived the brokers' sessions"
        finally:
            etcd.resume()
    finally:
        producer.close()
    with Admin(local.bootstrap) as admin:
        admin.create_topic("after-the-outage", 1, replication_factor=3)
        wait_for_full_isr(admin, "after-the-outage")
        assert set(admin.list_topics()) >= {TOPIC, "after-the-outage"}
    read_all(local.bootstrap, TOPIC, 3, history, "final")
    report = history.check()
    assert report.ok and report.acknowledged == 3 + 300, str(report)


def test_brokers_go_on_with_the_next_etcd_member_when_theirs_dies(cluster, tmp_path):
    """Every broker uses the first member listed; it is killed. Past two session timeouts every
    broker is still registered (its lease kept alive through another member), a topic can be
    created, and a broker's failover still elects a new leader (the controller's writes and the
    brokers' watches moved too)."""
    members = start_members(tmp_path / "etcd", 3)
    try:
        local = cluster(3, **{"etcd.endpoint": endpoints(members)})
        history = History()
        with Admin(local.bootstrap) as admin:
            admin.create_topic(TOPIC, 1, replication_factor=3, configs={"min.insync.replicas": 2})
            first = wait_for_full_isr(admin, TOPIC)[0]
            send(local.bootstrap, history, b"before-", 100)

            members[0].kill()
            time.sleep(2 * 3.0 + 1)  # not a condition, the point: two of the brokers' 3 s sessions pass
            assert [b.node_id for b in admin.describe_cluster().brokers] == [0, 1, 2]
            admin.create_topic("after-the-member-died", 1, replication_factor=3)
            wait_for_full_isr(admin, "after-the-member-died")

            local.brokers[first.leader].kill()
            wait_for(lambda: partitions_of(admin, TOPIC)[0].leader not in (-1, first.leader), 30, "a new leader")
            send(local.bootstrap, history, b"after-", 100)
        assert read_all(local.bootstrap, TOPIC, 1, history, "final") == 200
        report = history.check()
        assert not (report.lost or report.moved or report.duplicated or report.gaps or report.unknown), str(report)
    finally:
        for member in members:
            member.stop()


def send(bootstrap: str, history: History, prefix: bytes, count: int) -> None:
    with Producer(bootstrap, acks="all", request_timeout_ms=5_000, delivery_timeout_ms=60_000) as producer:
        for i in range(count):
            value = prefix + b"%d" % i
            history.sending(value)
            producer.send(TOPIC, value, partition=0, on_delivery=lambda md, err, value=value: history.delivered(
                value, md.partition, md.offset, err))
        producer.flush()
    assert not history.failed, history.failed
