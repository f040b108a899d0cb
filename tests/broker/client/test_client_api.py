"""The client's public surface as a Kafka user meets it (issue 7, ergonomics)."""
from __future__ import annotations

import inspect

import pytest

from broker.client import Admin, AsyncAdmin


def test_admin_spells_out_every_async_admin_method_with_its_signature():
    """No attribute forwarding: every AsyncAdmin method exists on Admin with the same parameters
    (so help() and IDEs show them), and a misspelt name fails where it is written."""
    public = [name for name, _ in inspect.getmembers(AsyncAdmin, inspect.iscoroutinefunction) if not name.startswith("_")]
    assert public
    for name in public:
        sync = getattr(Admin, name)
        assert not inspect.iscoroutinefunction(sync), name
        assert list(inspect.signature(sync).parameters) == list(inspect.signature(getattr(AsyncAdmin, name)).parameters), name
    with pytest.raises(AttributeError):
        Admin.create_topik  # noqa: B018 - the access itself must fail


def test_pymq_is_the_package_applications_import():
    import pymq
    from broker import client

    assert (pymq.Producer, pymq.Consumer, pymq.Admin) == (client.Producer, client.Consumer, client.Admin)


def test_clients_take_kafkas_dotted_names_and_config_dicts(broker):
    from pymq import Admin, Consumer, Producer

    with Admin(config={"bootstrap.servers": broker.bootstrap, "request.timeout.ms": 10_000}) as admin:
        admin.create_topic("dotted", partitions=1)
    with Producer(**{"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "acks": "all",
                     "compression.type": "lz4", "max.in.flight.requests.per.connection": 1}) as producer:
        metadata = producer.send("dotted", b"v", key=b"k").result(10)
    assert (metadata.topic, metadata.offset) == ("dotted", 0)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "auto.offset.reset": "earliest",
                         "fetch.max.wait.ms": 100}, check_crcs=True)
    try:
        consumer.assign([("dotted", 0)])
        assert consumer.poll_arrow(timeout_ms=5_000).column("value").to_pylist() == [b"v"]
    finally:
        consumer.close()


@pytest.mark.parametrize("make", ["Producer", "Consumer", "Admin"])
def test_an_unknown_setting_is_named_at_construction(make):
    import pymq

    with pytest.raises(ValueError, match=r"unknown \w+ setting\(s\) enable.idempotence; accepted: .*request.timeout.ms"):
        getattr(pymq, make)({"bootstrap.servers": "127.0.0.1:1", "enable.idempotence": True})
    with pytest.raises(ValueError, match="bootstrap.servers is required"):
        getattr(pymq, make)()


def test_iterating_a_consumer_yields_records_as_they_arrive(broker):
    from pymq import Admin, Consumer, Producer

    with Admin(broker.bootstrap) as admin:
        admin.create_topic("iterated", partitions=2)
    with Producer(broker.bootstrap, linger_ms=0) as producer:
        for i in range(6):
            producer.send("iterated", b"v%d" % i, partition=i % 2)
        producer.flush()
    with Consumer(broker.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([("iterated", 0), ("iterated", 1)])
        seen = []
        for record in consumer:
            seen.append(record.value)
            if len(seen) == 6:
                break
        assert sorted(seen) == [b"v%d" % i for i in range(6)]
        assert list(consumer.records(idle_timeout_ms=300)) == []  # nothing more: stops when idle


def test_a_peer_that_is_not_a_pymq_broker_is_named_as_such():
    """Something else listens on the port (here: an HTTP server's answer to anything)."""
    import socket
    import threading

    from broker.errors import NetworkError
    from pymq import Admin

    server = socket.create_server(("127.0.0.1", 0))

    def answer_http() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(1 << 16)
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
            conn.recv(1 << 16)

    thread = threading.Thread(target=answer_http, daemon=True)
    thread.start()
    try:
        with Admin(f"127.0.0.1:{server.getsockname()[1]}", request_timeout_ms=5_000) as admin:
            with pytest.raises(NetworkError, match=r"127.0.0.1:\d+ is not a pymq broker"):
                admin.list_topics()
    finally:
        server.close()
