"""`groupIdForLag` (spark_datasource/lag_group.py): a streaming query commits the end of each
finished micro-batch to a consumer group, so that the group's lag is the pipeline's.

The option is checked (streaming only, a non-empty group id); `LagGroup` alone against a real
broker: changed offsets committed once with metadata naming the run, a group with an active
member or a broker that does not answer costs one WARNING and a bounded wait, never an error;
and through Spark: Trigger.AvailableNow runs leave lag 0, records produced between runs show as
lag (also in `pymq group describe`), a running query's lag is 0 after processAllAvailable(), and
a query whose group has an active member still reads everything.
"""
from __future__ import annotations

import functools
import itertools
import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner

from cli import cli
from client import Admin, Producer
from broker.process import BrokerProcess
from spark_datasource.lag_group import METADATA_MAX_BYTES, RETRY_AFTER_FAILURE_S, LagGroup, commit_metadata
from spark_datasource.options import InvalidOptionError, SourceOptions
from tests.helpers.streaming import run_to_end

_groups = itertools.count()
_queries = itertools.count()


@pytest.fixture(scope="module")
def source_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """The module's broker; no initial rebalance delay, so a member joining an empty group gets
    its generation at once."""
    process = BrokerProcess(tmp_path_factory.mktemp("lag-broker"), {"group.initial.rebalance.delay.ms": 0}).start()
    yield process
    process.kill()


@pytest.fixture
def bootstrap(source_broker: BrokerProcess) -> str:
    return source_broker.bootstrap


@pytest.fixture
def group_id(topic_name: str) -> str:
    return f"lag-{topic_name}-{next(_groups)}"


@pytest.fixture
def admin(bootstrap: str) -> Iterator[Admin]:
    with Admin(bootstrap) as client:
        yield client


@pytest.fixture
def active_member(raw_group_members, bootstrap):
    """active_member(group_id, topic, partitions): a consumer-protocol member owning
    `partitions` of `topic` (a Stable group), joined with raw JoinGroup/SyncGroup; it leaves at
    teardown."""
    return functools.partial(raw_group_members, bootstrap)


def produce(bootstrap: str, topic: str, counts: dict[int, int]) -> None:
    """`counts[p]` records into partition p, acknowledged before it returns."""
    results = []
    with Producer(bootstrap, linger_ms=0, acks="all") as producer:
        for partition, n in counts.items():
            values = [f"{topic}-{partition}-{i}".encode() for i in range(n)]
            results += producer.send_batch(topic, pa.table({"value": values}), partition=partition)
        producer.flush()
    assert all(r.completed and r.error is None for r in results)


def new_topic(bootstrap: str, topic: str, partitions: int) -> str:
    with Admin(bootstrap) as admin:
        admin.create_topic(topic, partitions=partitions)
    return topic


def lag(admin: Admin, group: str) -> dict[tuple[str, int], int | None]:
    return {(row.topic, row.partition): row.lag for row in admin.group_lag(group)}


def committed(admin: Admin, group: str) -> dict[tuple[str, int], int]:
    return {tp: o.offset for tp, o in admin.list_group_offsets(group).items()}


def stream(spark, bootstrap: str, **options: object):
    reader = spark.readStream.format("pymq").option("kafka.bootstrap.servers", bootstrap)
    for name, value in options.items():
        reader = reader.option(name, str(value))
    return reader.load()


def run_available_now(df, out: Path) -> None:
    """One Trigger.AvailableNow run into Parquet under `out` (checkpoint kept for the next run)."""
    run_to_end(df.writeStream.format("parquet").option("path", str(out / "data"))
               .option("checkpointLocation", str(out / "checkpoint")).trigger(availableNow=True).start())


def rows_read(spark, out: Path) -> int:
    return spark.read.parquet(str(out / "data")).count()


def cli_lag(bootstrap: str, group: str, topic: str) -> dict[int, str]:
    """LAG per partition of `topic` in `pymq group describe GROUP`'s table (run in-process, as
    tests/cli/test_cli.py runs the CLI)."""
    result = CliRunner().invoke(cli, ["group", "describe", group, "-b", bootstrap], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    header = next(line.split() for line in lines if line.split()[:1] == ["TOPIC"])
    rows = [dict(zip(header, line.split())) for line in lines if line.split()[:1] == [topic]]
    return {int(row["PARTITION"]): row["LAG"] for row in rows}


# -- the option ----------------------------------------------------------------------------------

SUB = {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t"}
REFUSED = [
    ("batch-read", {**SUB, "groupIdForLag": "pipeline"}, False, "streaming queries only"),
    ("empty", {**SUB, "groupIdForLag": ""}, True, "non-empty"),
    ("blank", {**SUB, "groupidforlag": "   "}, True, "non-empty"),
]


@pytest.mark.parametrize("options, streaming, message", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_group_id_for_lag_refused_on_batch_reads_and_when_empty(options, streaming, message):
    """groupIdForLag means nothing to a batch read, and an empty group id names no group: both
    refused naming it."""
    with pytest.raises(InvalidOptionError, match=message) as raised:
        SourceOptions.parse(options, streaming=streaming)
    assert "groupIdForLag" in str(raised.value)


def test_group_id_for_lag_is_trimmed_and_off_by_default():
    """A streaming read takes the group id trimmed; without the option no group is committed to."""
    assert SourceOptions.parse({**SUB, "groupIdForLag": " pipeline-a "}, streaming=True).group_id_for_lag == "pipeline-a"
    assert SourceOptions.parse(SUB, streaming=True).group_id_for_lag is None


def test_commit_metadata_names_run_and_batch_end_within_bounds():
    """The metadata names the run and every partition's end; with many partitions it is cut to
    the bound."""
    assert commit_metadata("r1", {("b", 1): 7, ("a", 0): 12}) == "pymq-spark run=r1 end=a-0:12,b-1:7"
    many = commit_metadata("r1", {("topic", i): 10 ** 9 for i in range(200)})
    assert len(many.encode()) == METADATA_MAX_BYTES and many.endswith("...")
    assert many.startswith("pymq-spark run=r1 end=topic-0:1000000000,")


# -- LagGroup against a broker ------------------------------------------------------------------


def test_changed_offsets_are_committed_once_with_metadata(bootstrap, admin, topic_name, group_id):
    """New offsets are committed with the run's metadata; the same offsets again are not sent;
    the group shows the lag."""
    topic = new_topic(bootstrap, topic_name, 2)
    produce(bootstrap, topic, {0: 5, 1: 2})
    lag_group = LagGroup(group_id, bootstrap)
    try:
        assert lag_group.commit({(topic, 0): 3, (topic, 1): 2})
        assert not lag_group.commit({(topic, 0): 3, (topic, 1): 2})
        stored = admin.list_group_offsets(group_id)
        assert {tp: o.offset for tp, o in stored.items()} == {(topic, 0): 3, (topic, 1): 2}
        assert stored[(topic, 0)].metadata == f"pymq-spark run={lag_group.run_id} end={topic}-0:3,{topic}-1:2"
        assert lag(admin, group_id) == {(topic, 0): 2, (topic, 1): 0}
        assert lag_group.commit({(topic, 0): 5, (topic, 1): 2})
        assert lag(admin, group_id) == {(topic, 0): 0, (topic, 1): 0}
    finally:
        lag_group.close()
        lag_group.close()


def test_group_with_an_active_member_warns_once_and_keeps_its_offsets(bootstrap, admin, topic_name, group_id,
                                                                      active_member, caplog):
    """A commit into a group with a member fails without raising: one WARNING saying why, a
    retry only after the pause, the group untouched."""
    topic = new_topic(bootstrap, topic_name, 1)
    active_member(group_id, topic, [0])
    now = [1000.0]
    lag_group = LagGroup(group_id, bootstrap, clock=lambda: now[0])
    caplog.set_level(logging.DEBUG, logger="pymq.spark.lag")
    try:
        assert not lag_group.commit({(topic, 0): 0})
        now[0] += RETRY_AFTER_FAILURE_S / 2
        started = time.monotonic()
        assert not lag_group.commit({(topic, 0): 1})  # paused: the broker is not asked
        assert time.monotonic() - started < 0.05
        now[0] += RETRY_AFTER_FAILURE_S
        assert not lag_group.commit({(topic, 0): 1})
    finally:
        lag_group.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert group_id in warnings[0] and "active members" in warnings[0] and "groupIdForLag" in warnings[0]
    assert sum("failed again" in r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG) == 1
    assert committed(admin, group_id) == {}


@pytest.fixture
def silent_server() -> Iterator[str]:
    """host:port of a server that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join(5)
    for conn in accepted:
        conn.close()
    server.close()


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize("where", ["silent", "closed"])
def test_unreachable_broker_costs_a_bounded_wait_and_one_warning(where, silent_server, caplog):
    """A broker that never answers or a closed port: the commit gives up within its timeout,
    logs one WARNING, and does not raise."""
    bootstrap = silent_server if where == "silent" else closed_port()
    lag_group = LagGroup("g", bootstrap, timeout_s=0.5)
    caplog.set_level(logging.WARNING, logger="pymq.spark.lag")
    started = time.monotonic()
    try:
        assert not lag_group.commit({("t", 0): 1})
        assert time.monotonic() - started < 2.0
    finally:
        lag_group.close()
    assert time.monotonic() - started < 4.0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "'g'" in warnings[0] and "query goes on" in warnings[0], warnings


# -- through Spark -------------------------------------------------------------------------------


def test_spark_refuses_group_id_for_lag_on_a_batch_read_and_empty(spark, bootstrap, topic_name):
    """At planning: a batch read with groupIdForLag and a streaming read with an empty one fail
    naming the option."""
    new_topic(bootstrap, topic_name, 1)
    batch = (spark.read.format("pymq").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", topic_name).option("groupIdForLag", "g"))
    with pytest.raises(Exception, match="groupIdForLag.*streaming queries only"):
        batch.load().collect()
    with pytest.raises(Exception, match="groupIdForLag.*non-empty"):
        df = stream(spark, bootstrap, subscribe=topic_name, groupIdForLag=" ")
        query = df.writeStream.format("memory").queryName(f"lag_refused_{next(_queries)}").start()
        try:
            query.awaitTermination(60)
        finally:
            query.stop()


def test_available_now_runs_leave_lag_zero_and_backlog_shows_between(spark, bootstrap, admin, topic_name,
                                                                     group_id, tmp_path):
    """After a Trigger.AvailableNow run the group's offsets are the log ends (lag 0); records produced
    before the next run show as lag, partition by partition; the next run brings it back to 0."""
    topic = new_topic(bootstrap, topic_name, 2)
    produce(bootstrap, topic, {0: 3, 1: 2})
    df = stream(spark, bootstrap, subscribe=topic, startingOffsets="earliest", groupIdForLag=group_id)
    run_available_now(df, tmp_path)
    assert rows_read(spark, tmp_path) == 5
    assert committed(admin, group_id) == {(topic, 0): 3, (topic, 1): 2}
    assert lag(admin, group_id) == {(topic, 0): 0, (topic, 1): 0}
    assert cli_lag(bootstrap, group_id, topic) == {0: "0", 1: "0"}
    assert admin.list_group_offsets(group_id)[(topic, 0)].metadata.startswith("pymq-spark run=")

    produce(bootstrap, topic, {0: 4, 1: 1})
    assert lag(admin, group_id) == {(topic, 0): 4, (topic, 1): 1}
    assert cli_lag(bootstrap, group_id, topic) == {0: "4", 1: "1"}
    run_available_now(df, tmp_path)
    assert rows_read(spark, tmp_path) == 10
    assert committed(admin, group_id) == {(topic, 0): 7, (topic, 1): 3}
    assert lag(admin, group_id) == {(topic, 0): 0, (topic, 1): 0}
    assert cli_lag(bootstrap, group_id, topic) == {0: "0", 1: "0"}


def test_running_query_lag_is_zero_after_process_all_available(spark, bootstrap, admin, topic_name, group_id):
    """A running query commits each finished batch's end: after processAllAvailable() the group's
    offsets are the log end offsets, also for records produced while it runs."""
    topic = new_topic(bootstrap, topic_name, 2)
    produce(bootstrap, topic, {0: 2, 1: 3})
    name = f"pymq_lag_{next(_queries)}"
    df = stream(spark, bootstrap, subscribe=topic, startingOffsets="earliest", groupIdForLag=group_id)
    query = df.writeStream.format("memory").queryName(name).start()
    try:
        query.processAllAvailable()
        assert lag(admin, group_id) == {(topic, 0): 0, (topic, 1): 0}
        produce(bootstrap, topic, {0: 4, 1: 1})
        query.processAllAvailable()
        assert committed(admin, group_id) == {(topic, 0): 6, (topic, 1): 4}
        assert lag(admin, group_id) == {(topic, 0): 0, (topic, 1): 0}
        assert spark.table(name).count() == 10
        assert query.exception() is None
    finally:
        query.stop()


def test_query_whose_group_has_an_active_member_still_reads_everything(spark, bootstrap, admin, topic_name,
                                                                       group_id, active_member, tmp_path):
    """Lag reporting into a group a consumer has joined fails (logged), and the query reads every
    record all the same."""
    topic = new_topic(bootstrap, topic_name, 2)
    produce(bootstrap, topic, {0: 3, 1: 3})
    member = active_member(group_id, topic, [0, 1])
    df = stream(spark, bootstrap, subscribe=topic, startingOffsets="earliest", groupIdForLag=group_id)
    run_available_now(df, tmp_path)
    assert rows_read(spark, tmp_path) == 6
    assert committed(admin, group_id) == {}
    assert [m.member_id for m in admin.describe_groups([group_id])[0].members] == [member]
