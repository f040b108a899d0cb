"""The client's public surface as a Kafka user meets it (issue 7, ergonomics)."""
from __future__ import annotations

import ast
import inspect
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import client

from client import Admin, AsyncAdmin


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
    import client

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

    with pytest.raises(ValueError, match=r"unknown \w+ setting\(s\) linger.msec; accepted: .*request.timeout.ms"):
        getattr(pymq, make)({"bootstrap.servers": "127.0.0.1:1", "linger.msec": 5})
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


def test_a_peer_that_is_not_a_pymq_broker_is_named_as_such_at_once():
    """Something else listens on the port: a server that answers HTTP to any bytes, and Python's
    http.server (as a metrics port runs it), which reads a request up to a newline and waits for
    more. The client's first frame carries one ("\r\n\r\n" as its correlation id), so both
    answer at once and the client names them, long before its 60 s request timeout."""
    import socket
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from common.errors import NotAPymqBrokerError
    from pymq import Admin

    raw = socket.create_server(("127.0.0.1", 0))

    def answer_http() -> None:
        conn, _ = raw.accept()
        with conn:
            conn.recv(1 << 16)
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
            conn.recv(1 << 16)

    threading.Thread(target=answer_http, daemon=True).start()
    http = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    try:
        for port, first_bytes in ((raw.getsockname()[1], "b'HTTP'"), (http.server_address[1], "b'<!DO'")):
            with Admin(f"127.0.0.1:{port}", request_timeout_ms=60_000) as admin:
                with pytest.raises(NotAPymqBrokerError, match=rf"127.0.0.1:{port} is not a pymq broker .*its first "
                                                              rf"bytes are {re.escape(first_bytes)}"):
                    admin.list_topics()
    finally:
        raw.close()
        http.shutdown()
        http.server_close()


# What the package facade would drag in if it imported its public names eagerly.
CLIENT_CORES = ("client.accumulator", "client.admin", "client.consumer",
                "client.consumer_coordinator", "client.fetcher", "client.group_membership", "client.producer",
                "client.sender")


def _run_python(code: str) -> str:
    """Run `code` in a fresh interpreter (so this process's imports do not count); its stdout."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("module", ["client.decoder", "client.range_reader"])
def test_importing_a_reader_module_loads_neither_consumer_nor_producer(module):
    """The Spark source's executors import the decoder and the range reader: the package's
    __init__ runs first, and must not load the clients."""
    loaded = json.loads(_run_python(f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"))
    assert module in loaded
    assert [name for name in CLIENT_CORES if name in loaded] == []


def test_the_public_names_load_on_first_access_from_their_modules():
    """`from client import ...` and `from pymq import ...` give the defining modules' objects;
    dir() and __all__ list every public name; a wrong name is an AttributeError."""
    code = """
import json, sys
from client import Admin, Consumer, Producer
import client, pymq
from client.admin import Admin as A
from client.consumer import Consumer as C
from client.producer import Producer as P
assert (Admin, Consumer, Producer) == (A, C, P) == (pymq.Admin, pymq.Consumer, pymq.Producer)
assert all(getattr(pymq, name) is getattr(client, name) for name in client.__all__ if hasattr(pymq, name))
try:
    client.Consumr
except AttributeError as err:
    missing = str(err)
print(json.dumps({"all": client.__all__, "dir": dir(client), "missing": missing}))
"""
    found = json.loads(_run_python(code))
    assert {"Admin", "AsyncConsumer", "Consumer", "GroupMetadata", "Producer", "RECORD_SCHEMA"} <= set(found["all"])
    assert set(found["all"]) <= set(found["dir"])
    assert "Consumr" in found["missing"]


def test_no_client_module_imports_through_the_package_facade():
    """Modules of client import a name from the module that defines it, so the lazy facade
    never sits on an import path between them."""
    offenders = []
    for path in sorted(Path(client.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == "client":
                offenders.append(f"{path.name}:{node.lineno}")
            elif isinstance(node, ast.Import) and any(alias.name == "client" for alias in node.names):
                offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []
