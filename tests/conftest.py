"""Shared fixtures: real broker processes on loopback (broker.process.BrokerProcess), stopped by
PID in teardown; raw-socket clients (tests/helpers/raw_client.py) for bad-input tests."""
from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Iterator

import pytest
from hypothesis import HealthCheck, settings

# No per-example deadline and no too_slow health check: both are timing asserts, and the suite must
# pass on a loaded machine (a sticky-assignor example took 311 ms against the default 200 ms beside
# the Spark tests, a manifest round trip over 200 ms under load). Tests set only max_examples.
settings.register_profile("pymq", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("pymq")

# Every JVM the tests start (the run's Spark session, the jobs' and notebooks' own, a standalone
# cluster's daemons and executors, the Connect server) compiles with C1 only and collects with one
# thread: each works on little data for seconds to minutes, where C2's compiler threads cost more
# CPU than they give back (two Spark modules: 215 -> 164 CPU-s, 152 -> 140 s, on 2 busy cores). The
# java launcher reads JDK_JAVA_OPTIONS, so no deployment's configuration needs to know of it.
os.environ.setdefault("JDK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")

from broker.process import BrokerProcess
from tests.helpers.forkserver import launch_forked
from tests.helpers.raw_client import RawClient

# Every broker a test starts (its own, a cluster's, a job's) is forked from a server that imported
# the broker once (tests/helpers/forkserver.py): 0.5 s of CPU less per start, some 350 starts a
# run. The demo and the benchmarks start theirs as a user does, a new interpreter each.
BrokerProcess.launcher = staticmethod(launch_forked)


def _consume_all(bootstrap: str, topic: str, partitions: int, expected: int, timeout_s: float = 60.0):
    """Everything in `topic` from the beginning as one Arrow table; fails unless exactly `expected`
    records arrive (a further poll must come back empty)."""
    import pyarrow as pa

    from client import Consumer

    consumer = Consumer(bootstrap, auto_offset_reset="earliest")
    try:
        consumer.assign([(topic, p) for p in range(partitions)])
        tables, received = [], 0
        deadline = time.monotonic() + timeout_s
        while received < expected and time.monotonic() < deadline:
            table = consumer.poll_arrow(timeout_ms=500)
            tables.append(table)
            received += table.num_rows
        assert received == expected, f"received {received} of {expected} records"
        assert consumer.poll_arrow(timeout_ms=200).num_rows == 0, "more records than produced"
        return pa.concat_tables(tables)
    finally:
        consumer.close()


SPARK_GROUP = "spark"

# Fixtures that start a Spark JVM: the suite's session, and the notebook kernel's own
# (tests/jobs/test_notebooks.py).
SPARK_FIXTURES = {"spark", "executed"}
# Tests that start Spark JVMs themselves (spark-submit, a standalone cluster, a job in a
# subprocess): node id prefixes.
STARTS_SPARK_ITSELF = ("tests/spark_datasource/test_pipelines.py", "tests/spark_datasource/test_spark_cluster.py",
                       "tests/jobs/test_compact.py::test_sigkill_mid_write", "tests/jobs/test_table_sync_kill.py")
# Fixtures of a multi-broker cluster and its etcd.
CLUSTER_FIXTURES = {"cluster", "etcd"}


def pytest_configure(config: pytest.Config) -> None:
    """`--dist loadgroup` hands the groups out in collection order, not largest count first (xdist's
    default, which left the few-test modules that start JVMs for the end of a run, one worker busy
    with them long after the other had finished): see pytest_collection_modifyitems."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


@pytest.hookimpl(tryfirst=True)  # before xdist's hook (it reads the marks into the test ids) and -m's
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Groups for `make test`'s parallel run (pytest-xdist, `--dist loadgroup`): each module runs
    whole on one worker, so its module fixtures (brokers, data) are set up once, and every module
    that uses the `spark` fixture runs on one and the same worker, so a run still starts one
    Spark session. Without xdist the marks do nothing.

    Also the marks `spark` (the test starts a Spark JVM) and `cluster` (a multi-broker cluster or
    etcd), from the fixtures a test uses, so `make test-fast` can leave them out as tests are added.

    The longest groups go first (modules that start Spark JVMs, then those with clusters, then
    those with a `slow` test), so that the many short modules fill in beside them and the
    workers finish at about the same time."""
    spark_modules = {item.nodeid.split("::")[0] for item in items if "spark" in getattr(item, "fixturenames", ())}
    for item in items:
        module = item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(SPARK_GROUP if module in spark_modules else module))
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & SPARK_FIXTURES or item.nodeid.startswith(STARTS_SPARK_ITSELF):
            item.add_marker(pytest.mark.spark)
        if fixtures & CLUSTER_FIXTURES:
            item.add_marker(pytest.mark.cluster)
    rank: dict[str, int] = {}  # per module, so that a module's tests stay together
    for item in items:
        module = item.nodeid.split("::")[0]
        rank[module] = min(rank.get(module, 3), 0 if item.get_closest_marker("spark") else
                           1 if item.get_closest_marker("cluster") else 2 if item.get_closest_marker("slow") else 3)
    items.sort(key=lambda item: rank[item.nodeid.split("::")[0]])  # stable: modules keep their order within a rank


@pytest.fixture(scope="session")
def consume_all():
    """consume_all(bootstrap, topic, partitions, expected) -> pyarrow.Table of every record."""
    return _consume_all


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """A bucket on a moto server (one per test module): its URL and the store options (s3fs names)."""
    from tests.tiered_storage.backends import REGION, MotoServer, make_bucket

    server = MotoServer(tmp_path_factory.mktemp("moto") / "moto.log").start()
    try:
        bucket = make_bucket(server.endpoint_url)
        yield f"s3://{bucket}/pymq", {"endpoint_url": server.endpoint_url, "key": "testing",
                                      "secret": "testing", "region": REGION}
    finally:
        server.stop()


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """A real etcd (Debian's etcd-server) on free loopback ports, one per test module: an EtcdProcess."""
    from broker.cluster.etcd_process import EtcdProcess

    server = EtcdProcess(tmp_path_factory.mktemp("etcd") / "data").start()
    try:
        yield server
    finally:
        server.stop()


# Failover within seconds: a dead broker's registration lapses after 3 s (etcd's leases count whole
# seconds, and refuse less than 2 with etcd's default election timeout).
FAST_FAILOVER = {"broker.session.timeout.ms": 3000, "replica.fetch.backoff.ms": 100}


@pytest.fixture
def cluster(etcd, tmp_path: Path, request) -> Iterator[Callable[..., Any]]:
    """cluster(brokers=3, **overrides) -> a started LocalCluster (3 broker processes on 127.0.0.1-3,
    in a namespace of the module's etcd), stopped after the test."""
    from broker.cluster.local_cluster import LocalCluster

    started: list[LocalCluster] = []

    def start(brokers: int = 3, broker_overrides: dict[int, dict[str, Any]] | None = None, **overrides: Any) -> Any:
        name = f"{request.node.name[:40]}-{uuid.uuid4().hex[:8]}"  # a namespace of its own in the shared etcd
        local = LocalCluster(tmp_path / f"cluster-{len(started)}", brokers, {**FAST_FAILOVER, **overrides},
                             name=name, etcd=etcd, broker_overrides=broker_overrides)
        started.append(local)
        return local.start()

    yield start
    for local in started:
        local.stop()


@pytest.fixture(scope="session")
def spark() -> Iterator:
    """The one Spark session (local[2], Delta Lake, the pymq source) of the whole test run."""
    from spark_datasource import local_spark

    session = local_spark("pymq-tests", **{"spark.sql.shuffle.partitions": "2"})
    yield session
    session.stop()


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator:
    """Make brokers in tmp_path; every one still running at teardown is killed by PID."""
    started: list[BrokerProcess] = []

    def make(name: str = "broker", **overrides: object) -> BrokerProcess:
        process = BrokerProcess(tmp_path / name, overrides)
        started.append(process)
        return process

    yield make
    for process in started:
        process.kill()


@pytest.fixture
def broker(broker_factory) -> BrokerProcess:
    """One running broker with default settings."""
    return broker_factory().start()


# -- raw wire access for bad-input and fuzz tests (RawClient: tests/helpers/raw_client.py) --------


@pytest.fixture
def raw_client() -> Iterator:
    """Factory `raw_client(port, timeout_s=10.0)` -> RawClient; every socket is closed at teardown."""
    clients: list[RawClient] = []

    def make(port: int, timeout_s: float = 10.0) -> RawClient:
        client = RawClient(port, timeout_s=timeout_s)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture(scope="module")
def module_broker_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """`broker_factory` for a whole test module: many small cases share one broker process
    (each case on its own topic), which keeps suites of dozens of cases fast. Killed by PID."""
    started: list[BrokerProcess] = []

    def make(name: str = "broker", **overrides: object) -> BrokerProcess:
        process = BrokerProcess(tmp_path_factory.mktemp(name) / name, overrides)
        started.append(process)
        return process

    yield make
    for process in started:
        process.kill()


# -- an active consumer-group member, joined with raw JoinGroup / SyncGroup -----------------------

RAW_MEMBER_SESSION_MS = 60_000  # a raw member sends no heartbeats: it must outlive the test


async def _join_and_sync(bootstrap: str, group: str, topic: str, partitions: list[int]) -> str:
    """A consumer-protocol member owning `partitions` of `topic` (the group becomes Stable)."""
    from client import AsyncAdmin
    from common.errors import MemberIdRequiredError
    from protocol import JoinGroupProtocol, JoinGroupRequest, SyncGroupAssignment, SyncGroupRequest
    from protocol.consumer_protocol import Assignment, Subscription

    admin = AsyncAdmin(bootstrap)
    try:
        node = (await admin.find_coordinator(group)).node_id
        protocol = JoinGroupProtocol("range", Subscription((topic,)).encode())

        def join(member_id: str) -> JoinGroupRequest:
            return JoinGroupRequest(group, RAW_MEMBER_SESSION_MS, RAW_MEMBER_SESSION_MS, member_id, None, "consumer",
                                    (protocol,), client_id="test-member")

        first = await admin.cluster.send(node, join(""))
        assert isinstance(first.error(), MemberIdRequiredError)
        joined = await admin.cluster.send(node, join(first.member_id))
        assert joined.error() is None and joined.leader == joined.member_id
        assignment = Assignment(tuple((topic, p) for p in partitions)).encode()
        synced = await admin.cluster.send(node, SyncGroupRequest(
            group, joined.generation_id, joined.member_id, None, "consumer", joined.protocol_name,
            (SyncGroupAssignment(joined.member_id, assignment),)))
        assert synced.error() is None
        return joined.member_id
    finally:
        await admin.close()


async def _leave(bootstrap: str, group: str, member_id: str) -> None:
    from client import AsyncAdmin
    from protocol import LeaveGroupRequest, MemberIdentity

    admin = AsyncAdmin(bootstrap)
    try:
        node = (await admin.find_coordinator(group)).node_id
        await admin.cluster.send(node, LeaveGroupRequest(group, (MemberIdentity(member_id),)))
    finally:
        await admin.close()


class RawGroupMembers:
    """`members(bootstrap, group, topic, partitions)` -> the id of a member that owns `partitions`
    of `topic` in a Stable group (it never heartbeats; its session outlives the test);
    `members.leave(...)` makes one leave, and teardown makes the rest leave."""

    def __init__(self) -> None:
        self.joined: list[tuple[str, str, str]] = []

    def __call__(self, bootstrap: str, group: str, topic: str, partitions: list[int]) -> str:
        import asyncio

        member_id = asyncio.run(_join_and_sync(bootstrap, group, topic, partitions))
        self.joined.append((bootstrap, group, member_id))
        return member_id

    def leave(self, bootstrap: str, group: str, member_id: str) -> None:
        import asyncio

        asyncio.run(_leave(bootstrap, group, member_id))
        self.joined.remove((bootstrap, group, member_id))


@pytest.fixture
def raw_group_members() -> Iterator[RawGroupMembers]:
    members = RawGroupMembers()
    yield members
    for joined in list(members.joined):
        members.leave(*joined)
