"""etcd unreachable (hung with SIGSTOP): the brokers keep serving the partitions they lead with the
ISR they have (acks=all produces and reads go on), a metadata change fails with the named,
retriable METADATA_STORE_UNAVAILABLE, and everything works again once etcd is back."""
from __future__ import annotations

import time

import pytest

from broker.client import Admin, Producer
from broker.errors import MetadataStoreUnavailableError
from tests.e2e.conftest import read_all, wait_for_full_isr
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
            assert len(history.acked) == 300, history.failed
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
    assert report.ok and report.acknowledged == 300, str(report)
