"""Batch reads with `remoteStorage.url`: tiered segments planned from the manifests and read by
executors straight from the object store, the untiered tail from the broker.

The remote tier is built without the broker's tiering loop: a real broker writes `tiered` (2
partitions, small segments), is stopped cleanly, its sealed segments are uploaded with
RemoteSegmentStore to a `file://` root and committed to each partition's manifest, and the broker
starts again with its local log whole. Record n of partition p has offset n and create time
`BASE_MS + 10 * n`.
"""
from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterator

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from client import Admin, Producer
from segment_format.layout import SegmentFiles
from broker.process import BrokerProcess
from spark_datasource.batch_reader import PymqBatchReader
from spark_datasource.options import InvalidOptionError, SourceOptions
from spark_datasource.ranges import RangePartition
from spark_datasource.remote_ranges import RemoteRangePartition
from spark_datasource.schema import arrow_schema
from tiered_storage import RemoteSegmentStore
from segment_format.manifest import PartitionManifest

TOPIC = "tiered"
PARTITIONS = 2
BATCHES = 30
PER_BATCH = 20
PER_PARTITION = BATCHES * PER_BATCH
BASE_MS = 1_700_000_000_000
STEP_MS = 10


def value_of(partition: int, n: int) -> bytes:
    return f"p{partition}-{n:06d}".encode().ljust(60, b".")


@pytest.fixture(scope="module")
def tiered(source_broker: BrokerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[int, PartitionManifest]]:
    """`tiered` written, its sealed segments uploaded and committed; the manifests by partition."""
    bootstrap = source_broker.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topic(TOPIC, partitions=PARTITIONS, configs={"segment.bytes": 4096, "retention.ms": -1})
    with Producer(bootstrap, linger_ms=0) as producer:
        for b in range(BATCHES):
            for p in range(PARTITIONS):
                ns = range(b * PER_BATCH, (b + 1) * PER_BATCH)
                producer.send_batch(TOPIC, pa.table({
                    "key": [f"k{n % 7}".encode() for n in ns],
                    "value": [value_of(p, n) for n in ns],
                    "timestamp": pa.array([BASE_MS + STEP_MS * n for n in ns], pa.int64()),
                }), partition=p)
            producer.flush()
    source_broker.stop()
    store = RemoteSegmentStore.from_url(remote_url(tmp_path_factory))
    manifests = {}
    try:
        for p in range(PARTITIONS):
            [directory] = source_broker.log_dir.glob(f"**/{TOPIC}-{p}")
            bases = sorted(int(path.stem) for path in directory.glob("*.log"))
            assert len(bases) >= 5, bases
            manifest = store.load_manifest(TOPIC, p)
            for base in bases[:-1]:  # every segment but the active one
                segment = store.upload_segment(TOPIC, p, SegmentFiles(directory, base))
                manifest = store.commit_manifest(manifest.version, manifest.with_segment(segment))
            manifests[p] = manifest
            assert 0 < manifest.log_end_offset < PER_PARTITION
    finally:
        source_broker.start()
    yield manifests


_ROOT: list[str] = []


def remote_url(tmp_path_factory: pytest.TempPathFactory | None = None) -> str:
    if not _ROOT:
        assert tmp_path_factory is not None
        _ROOT.append(f"file://{tmp_path_factory.mktemp('remote')}")
    return _ROOT[0]


def options(bootstrap: str, **extra: str) -> dict[str, str]:
    return {"kafka.bootstrap.servers": bootstrap, "subscribe": TOPIC, "includeHeaders": "true", **extra}


def reader(bootstrap: str, **extra: str) -> PymqBatchReader:
    return PymqBatchReader(SourceOptions.parse(options(bootstrap, **{"remoteStorage.url": remote_url()}, **extra), False))


def remote_parts(r: PymqBatchReader) -> list[RemoteRangePartition]:
    return [p for p in r.partitions() if isinstance(p, RemoteRangePartition)]


def segments_opened(parts: list[RemoteRangePartition]) -> list[tuple[int, int]]:
    """(partition, base offset) of every remote segment the planned tasks will open."""
    return [(p.range.partition, s.base_offset) for p in parts for s in p.segments]


def every_segment(tiered) -> list[tuple[int, int]]:
    return [(p, s.base_offset) for p, m in tiered.items() for s in m.segments]


def utc(ms: int) -> dt.datetime:
    return dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(milliseconds=ms)


def test_remote_read_returns_every_record_once_as_the_broker_read_does(spark, source_broker, tiered):
    """Every record of both tiers exactly once, all columns equal to a broker-only read."""
    bootstrap = source_broker.bootstrap
    planned = reader(bootstrap).partitions()
    remote = [p for p in planned if isinstance(p, RemoteRangePartition)]
    # One task per partition's remote history (the default maxRecordsPerPartition is far above it),
    # as the Kafka source plans a partition: each opens every segment of its partition.
    assert len(remote) == len(tiered)
    assert segments_opened(remote) == every_segment(tiered)
    assert {p.range.partition for p in planned if isinstance(p, RangePartition)} == set(range(PARTITIONS))

    from_remote = spark.read.format("pymq").options(**options(bootstrap, **{"remoteStorage.url": remote_url()})).load()
    from_broker = spark.read.format("pymq").options(**options(bootstrap)).load()
    got = from_remote.orderBy("partition", "offset").collect()
    assert got == from_broker.orderBy("partition", "offset").collect()
    assert [(r.partition, r.offset) for r in got] == [(p, n) for p in range(PARTITIONS) for n in range(PER_PARTITION)]
    assert [r.value for r in got] == [value_of(p, n) for p in range(PARTITIONS) for n in range(PER_PARTITION)]
    assert from_remote.count() == PARTITIONS * PER_PARTITION


def test_remote_segments_are_read_with_the_broker_stopped(source_broker, tiered):
    """Executors read the remote partitions from the object store alone: the broker is down."""
    r = reader(source_broker.bootstrap)
    remote = remote_parts(r)
    source_broker.stop()
    try:
        rows = pa.Table.from_batches([b for part in remote for b in r.read(part)])
    finally:
        source_broker.start()
    for p, manifest in tiered.items():
        mine = rows.filter(pa.compute.equal(rows["partition"], p))
        assert mine["offset"].to_pylist() == list(range(manifest.log_end_offset))
        assert mine["value"].to_pylist() == [value_of(p, n) for n in range(manifest.log_end_offset)]
        assert mine["timestamp"].cast(pa.int64()).to_pylist() == [(BASE_MS + STEP_MS * n) * 1000
                                                                    for n in range(manifest.log_end_offset)]


def test_offset_and_timestamp_filters_on_a_remote_read_return_exactly_the_matching_rows(spark, source_broker, tiered):
    """Filters on offset and timestamp, over remote segments and the broker's tail, and the same
    DataFrame unfiltered after them: exactly the matching rows each time (Spark filters them)."""
    cut = 150
    df = spark.read.format("pymq").options(**options(source_broker.bootstrap, **{"remoteStorage.url": remote_url()})).load()
    got = df.where((F.col("offset") >= 200) & (F.col("offset") < 300)).select("partition", "offset").collect()
    assert sorted((r.partition, r.offset) for r in got) == [(p, n) for p in range(PARTITIONS) for n in range(200, 300)]
    got = df.where(F.col("timestamp") < utc(BASE_MS + STEP_MS * cut)).select("partition", "offset").collect()
    assert sorted((r.partition, r.offset) for r in got) == [(p, n) for p in range(PARTITIONS) for n in range(cut)]
    assert df.count() == PARTITIONS * PER_PARTITION


@pytest.mark.parametrize("given, streaming, message", [
    ({"remoteStorage.url": "file:///x"}, True, "batch queries only"),
    ({"remoteStorage.s3.region": "eu-west-1"}, False, "needs 'remoteStorage.url'"),
    ({"remoteStorage.url": "file:///x", "remoteStorage.s3.accessKey": "a"}, False, "for an s3:// store"),
    ({"remoteStorage.url": " "}, False, "not an empty string"),
], ids=["streaming", "s3-without-url", "s3-option-on-file-url", "empty-url"])
def test_remote_storage_options_are_checked(given, streaming, message):
    """Misused remoteStorage options fail at parse time, naming the option."""
    with pytest.raises(InvalidOptionError, match=message):
        SourceOptions.parse({"kafka.bootstrap.servers": "h:1", "subscribe": "t", **given}, streaming)


def test_s3_settings_reach_the_store_options_and_stay_out_of_repr():
    """remoteStorage.s3.* become from_url's s3 options; the secret is not printed."""
    opts = SourceOptions.parse({"kafka.bootstrap.servers": "h:1", "subscribe": "t", "remoteStorage.url": "s3://b/p",
                                "remoteStorage.s3.endpointUrl": "http://127.0.0.1:9", "remoteStorage.s3.accessKey": "AK",
                                "remoteStorage.s3.secretKey": "SECRET", "remoteStorage.s3.region": "eu-west-1"}, False)
    assert opts.remote_storage_options == {"endpoint_url": "http://127.0.0.1:9", "key": "AK", "secret": "SECRET",
                                           "region": "eu-west-1"}
    assert "SECRET" not in repr(opts)


@pytest.fixture(scope="module")
def s3_url(tiered, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """The file:// tier copied object by object to a bucket of a moto S3 server (same layout and
    names); its URL and the remoteStorage.s3.* options that reach it."""
    from tests.tiered_storage.backends import REGION, MotoServer, make_bucket

    server = MotoServer(tmp_path_factory.mktemp("moto") / "moto.log").start()
    try:
        bucket = make_bucket(server.endpoint_url)
        source = RemoteSegmentStore.from_url(remote_url())
        target = RemoteSegmentStore.from_url(f"s3://{bucket}/pymq", {
            "endpoint_url": server.endpoint_url, "key": "testing", "secret": "testing", "region": REGION})
        for path in source.fs.find(source.topic_path(TOPIC)):
            target.fs.pipe_file(target.root + path.removeprefix(source.root), source.fs.cat_file(path))
        yield f"s3://{bucket}/pymq", {"remoteStorage.s3.endpointUrl": server.endpoint_url,
                                      "remoteStorage.s3.accessKey": "testing",
                                      "remoteStorage.s3.secretKey": "testing", "remoteStorage.s3.region": REGION}
    finally:
        server.stop()


def test_remote_read_from_s3_equals_the_broker_read(spark, source_broker, tiered, s3_url):
    """The same read against an S3 store (moto, through s3fs on the executors): every record once."""
    url, s3 = s3_url
    bootstrap = source_broker.bootstrap
    r = PymqBatchReader(SourceOptions.parse(options(bootstrap, **{"remoteStorage.url": url}, **s3), False))
    assert segments_opened(remote_parts(r)) == every_segment(tiered)
    from_s3 = spark.read.format("pymq").options(**options(bootstrap, **{"remoteStorage.url": url}, **s3)).load()
    from_broker = spark.read.format("pymq").options(**options(bootstrap)).load()
    assert from_s3.orderBy("partition", "offset").collect() == from_broker.orderBy("partition", "offset").collect()


def test_split_at_remote_end_cuts_at_segment_bounds_and_leaves_deleted_offsets_to_the_brokers(tiered):
    """The remote part is [start, remote end) over the segments holding it; a range starting
    below the remote log start (deleted remotely) goes to the brokers whole, which answer or
    report the loss."""
    from spark_datasource.ranges import OffsetRange
    from spark_datasource.remote_ranges import split_at_remote_end

    manifest = tiered[0]
    parts, tail = split_at_remote_end(OffsetRange(TOPIC, 0, 5, PER_PARTITION), manifest)
    assert [(p.range.start, p.range.end, p.segments) for p in parts] == [
        (5, manifest.log_end_offset, manifest.segments)]
    assert (tail.start, tail.end) == (manifest.log_end_offset, PER_PARTITION)
    trimmed = manifest.with_log_start_offset(manifest.segments[1].base_offset)
    parts, tail = split_at_remote_end(OffsetRange(TOPIC, 0, 0, PER_PARTITION), trimmed)
    assert parts == [] and (tail.start, tail.end) == (0, PER_PARTITION)


# --- large remote segments split like broker ranges --------------------------------------------------

def test_large_remote_ranges_split_at_max_records_and_each_task_reads_exactly_its_records(spark, source_broker,
                                                                                         tiered):
    """maxRecordsPerPartition=7 (cuts inside record batches): each partition's remote range
    becomes tasks of at most 7 offsets tiling it, each naming exactly the segments it overlaps;
    each task returns exactly its offsets, and their union is the broker's read of the tiered
    offsets; a Spark read cut inside batches returns what the broker does."""
    limit = 7
    r = reader(source_broker.bootstrap, maxRecordsPerPartition=str(limit))
    parts = remote_parts(r)
    assert all(p.range.size <= limit for p in parts)
    for p, manifest in tiered.items():
        mine = sorted((q for q in parts if q.range.partition == p), key=lambda q: q.range.start)
        assert len(mine) == -(-manifest.log_end_offset // limit)
        assert [q.range.start for q in mine[1:]] == [q.range.end for q in mine[:-1]]
        assert (mine[0].range.start, mine[-1].range.end) == (0, manifest.log_end_offset)
        for q in mine:
            assert q.segments == tuple(s for s in manifest.segments
                                       if s.base_offset < q.range.end and s.next_offset > q.range.start)
    seen = []
    for part in parts:
        rows = pa.Table.from_batches(list(r.read(part)), schema=arrow_schema(True))
        assert rows["offset"].to_pylist() == list(range(part.range.start, part.range.end))
        assert set(rows["partition"].to_pylist()) == {part.range.partition}
        seen.extend(zip(rows["partition"].to_pylist(), rows["offset"].to_pylist(), rows["value"].to_pylist()))
    assert sorted(seen) == [(p, n, value_of(p, n)) for p, m in tiered.items() for n in range(m.log_end_offset)]

    # Through Spark with a wider cut (still inside batches of 20): tasks of 7 records would be
    # ~150 Python tasks of ~0.1 s each, and the tiling was checked above.
    df = spark.read.format("pymq").options(**options(
        source_broker.bootstrap, **{"remoteStorage.url": remote_url(), "maxRecordsPerPartition": "61"})).load()
    broker = spark.read.format("pymq").options(**options(source_broker.bootstrap)).load()
    assert df.rdd.getNumPartitions() >= sum(-(-m.log_end_offset // 61) for m in tiered.values())
    assert df.orderBy("partition", "offset").collect() == broker.orderBy("partition", "offset").collect()


def test_min_partitions_counts_remote_segment_tasks_too(source_broker, tiered):
    """minPartitions splits remote ranges (with the broker tail) until there are that many tasks."""
    segments = sum(len(m.segments) for m in tiered.values())
    wanted = 3 * segments
    planned = reader(source_broker.bootstrap, minPartitions=str(wanted)).partitions()
    assert len(planned) >= wanted
    remote = [p for p in planned if isinstance(p, RemoteRangePartition)]
    assert len(remote) > segments
    for p, manifest in tiered.items():
        covered = sorted((q.range.start, q.range.end) for q in remote if q.range.partition == p)
        assert covered[0][0] == 0 and covered[-1][1] == manifest.log_end_offset
        assert all(a[1] == b[0] for a, b in zip(covered, covered[1:]))


# --- remoteStorage.only: the tiered history from the store alone --------------------------------------

def only_options(**extra: str) -> dict[str, str]:
    """remoteStorage.only, no bootstrap option."""
    return {"subscribe": TOPIC, "includeHeaders": "true", "remoteStorage.url": remote_url(),
            "remoteStorage.only": "true", **extra}


def only_reader(**extra: str) -> PymqBatchReader:
    return PymqBatchReader(SourceOptions.parse(only_options(**extra), False))


@pytest.fixture
def broker_stopped(source_broker):
    """The module's broker down for the whole test (planning included), up again afterwards."""
    source_broker.stop()
    try:
        yield
    finally:
        source_broker.start()


@pytest.fixture(scope="module")
def broker_rows(spark, source_broker, tiered):
    """A broker read (broker up) of the tiered offsets: offset < each manifest's log end."""
    df = spark.read.format("pymq").options(**options(source_broker.bootstrap)).load()
    ends = F.lit(False)
    for p, m in tiered.items():
        ends = ends | ((F.col("partition") == p) & (F.col("offset") < m.log_end_offset))
    return df.where(ends).orderBy("partition", "offset").collect()


def test_remote_only_reads_exactly_the_tiered_records_with_the_broker_stopped(spark, tiered, broker_rows,
                                                                              broker_stopped):
    """No bootstrap option and no broker: planning and reading from the store give exactly the
    records a broker read gives below each manifest's log end, split by maxRecordsPerPartition."""
    df = spark.read.format("pymq").options(**only_options(maxRecordsPerPartition="50")).load()
    assert df.orderBy("partition", "offset").collect() == broker_rows
    assert len(broker_rows) == sum(m.log_end_offset for m in tiered.values())
    pattern = {k: v for k, v in only_options(subscribePattern="tier.*").items() if k != "subscribe"}
    assert spark.read.format("pymq").options(**pattern).load().count() == len(broker_rows)


def test_remote_only_offsets_are_the_manifests_and_json_offsets_are_checked(source_broker, tiered,
                                                                             broker_stopped):
    """earliest/latest are the manifest's start and end (a bootstrap to a dead broker is never
    tried); -2/-1 and explicit JSON offsets resolve against them; an end past the remote log end
    is refused; a start below the remote log start is data loss (failOnDataLoss)."""
    ends = {p: m.log_end_offset for p, m in tiered.items()}
    parts = remote_parts(only_reader(**{"kafka.bootstrap.servers": source_broker.bootstrap}))
    assert {p: (min(q.range.start for q in parts if q.range.partition == p),
                max(q.range.end for q in parts if q.range.partition == p)) for p in ends} == {
        p: (0, e) for p, e in ends.items()}

    json_opts = {"startingOffsets": json.dumps({TOPIC: {"0": 5, "1": -2}}),
                 "endingOffsets": json.dumps({TOPIC: {"0": -1, "1": 30}})}
    parts = remote_parts(only_reader(**json_opts))
    covered = {p: sorted((q.range.start, q.range.end) for q in parts if q.range.partition == p) for p in ends}
    assert (covered[0][0][0], covered[0][-1][1]) == (5, ends[0])
    assert (covered[1][0][0], covered[1][-1][1]) == (0, 30)

    with pytest.raises(InvalidOptionError, match="remote log end"):
        only_reader(endingOffsets=json.dumps({TOPIC: {"0": ends[0] + 1, "1": -1}})).partitions()
    with pytest.raises(InvalidOptionError, match="leaves out"):
        only_reader(startingOffsets=json.dumps({TOPIC: {"0": 0}})).partitions()


def copy_of_the_store(tmp_path, ids: dict[int, str]) -> str:
    """A copy of the module's store whose partitions' manifests name `ids` as their topic ids."""
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(remote_url().removeprefix("file://"), root)
    store = RemoteSegmentStore.from_url(f"file://{root}")
    for partition, topic_id in ids.items():
        manifest = store.load_manifest(TOPIC, partition)
        store.commit_manifest(manifest.version, manifest.with_topic_id(topic_id))
    return f"file://{root}"


def test_a_manifest_of_another_incarnation_of_the_topic_is_not_read(source_broker, tiered, tmp_path):
    """Partition 0's remote data belongs to an older topic of the same name (another topic id than
    the brokers'): its whole range is planned for the brokers; partition 1's tier is read."""
    url = copy_of_the_store(tmp_path, {0: "0" * 32})
    planned = PymqBatchReader(SourceOptions.parse(options(source_broker.bootstrap, **{"remoteStorage.url": url}),
                                                  False)).partitions()
    assert [(p.range.start, p.range.end) for p in planned if p.range.partition == 0] == [(0, PER_PARTITION)]
    assert all(isinstance(p, RangePartition) for p in planned if p.range.partition == 0)
    assert segments_opened([p for p in planned if isinstance(p, RemoteRangePartition)]) == [
        (1, s.base_offset) for s in tiered[1].segments]


def test_remote_only_refuses_a_store_holding_two_incarnations_of_the_topic(tiered, broker_stopped, tmp_path):
    """With no broker to say which topic id is current, partitions of two ids are an error naming
    both; reading the partitions of one with `assign` works."""
    from tiered_storage import RemoteTopicIdMismatchError

    url = copy_of_the_store(tmp_path, {0: "a" * 32, 1: "b" * 32})
    with pytest.raises(RemoteTopicIdMismatchError, match=f"two incarnations of '{TOPIC}'") as raised:
        PymqBatchReader(SourceOptions.parse(only_options(**{"remoteStorage.url": url}), False)).partitions()
    assert "a" * 32 in str(raised.value) and "b" * 32 in str(raised.value)
    assigned = {**{k: v for k, v in only_options(**{"remoteStorage.url": url}).items() if k != "subscribe"},
                "assign": json.dumps({TOPIC: [1]})}
    parts = remote_parts(PymqBatchReader(SourceOptions.parse(assigned, False)))
    assert segments_opened(parts) == [(1, s.base_offset) for s in tiered[1].segments]


def test_remote_only_start_below_the_remote_log_start_is_data_loss(tiered, broker_stopped, tmp_path):
    """A copy of the store whose partition 0 lost its first segment to retention: earliest is the
    new start; an explicit start below it fails (failOnDataLoss=true) or starts there (false)."""
    import shutil

    from common.errors import DataLossError

    root = tmp_path / "trimmed"
    shutil.copytree(remote_url().removeprefix("file://"), root)
    store = RemoteSegmentStore.from_url(f"file://{root}")
    manifest = store.load_manifest(TOPIC, 0)
    start = manifest.segments[1].base_offset
    store.commit_manifest(manifest.version, manifest.with_log_start_offset(start))

    def plan(**extra: str) -> list:
        opts = SourceOptions.parse(only_options(**{"remoteStorage.url": f"file://{root}", **extra}), False)
        return [p for p in PymqBatchReader(opts).partitions() if p.range.partition == 0]

    assert min(p.range.start for p in plan()) == start
    explicit = {"startingOffsets": json.dumps({TOPIC: {"0": 3, "1": -2}})}
    with pytest.raises(DataLossError, match=f"offsets 3..{start - 1} were deleted"):
        plan(**explicit)
    assert min(p.range.start for p in plan(**explicit, failOnDataLoss="false")) == start


def test_remote_only_unknown_topic_is_a_clear_error(tiered, broker_stopped):
    with pytest.raises(InvalidOptionError, match="unknown topic.*absent.*remote store"):
        PymqBatchReader(SourceOptions.parse(only_options(subscribe="absent"), False)).partitions()
    with pytest.raises(InvalidOptionError, match="partition tiered-7 is not in the remote store"):
        PymqBatchReader(SourceOptions.parse({**{k: v for k, v in only_options().items() if k != "subscribe"},
                                             "assign": json.dumps({TOPIC: [0, 7]})}, False)).partitions()


def test_remote_only_filters_return_exactly_the_matching_rows(spark, tiered, broker_stopped):
    """Filters on timestamp and offset over the store alone: exactly the matching rows."""
    cut = 150
    df = spark.read.format("pymq").options(**only_options()).load()
    got = df.where((F.col("timestamp") >= utc(BASE_MS + STEP_MS * cut)) & (F.col("offset") < 200)).select(
        "partition", "offset").collect()
    assert sorted((r.partition, r.offset) for r in got) == [(p, n) for p in range(PARTITIONS) for n in range(cut, 200)]


def test_remote_only_answers_time_options_from_the_remote_time_indexes(tiered, broker_stopped):
    """startingTimestamp / endingOffsetsByTimestamp resolve to the first remote record at or after
    the time, as a broker's ListOffsets would; a time past every remote record starts at the remote
    log end (strategy latest) or fails (strategy error), and ends at the remote log end."""
    def ranges(**extra: str) -> dict[int, tuple[int, int]]:
        parts = remote_parts(only_reader(**extra))
        return {p: (min(q.range.start for q in parts if q.range.partition == p),
                    max(q.range.end for q in parts if q.range.partition == p))
                for p in {q.range.partition for q in parts}}

    ends = {p: m.log_end_offset for p, m in tiered.items()}
    assert min(ends.values()) > 200
    # Record n's time is BASE_MS + STEP_MS * n; between two records' times the later one answers.
    got = ranges(startingTimestamp=str(BASE_MS + STEP_MS * 123 - 5),
                 endingOffsetsByTimestamp=json.dumps({TOPIC: {"0": BASE_MS + STEP_MS * 150, "1": BASE_MS + STEP_MS * 200}}))
    assert got == {0: (123, 150), 1: (123, 200)}
    past = str(BASE_MS + STEP_MS * PER_PARTITION * 10)
    with pytest.raises(InvalidOptionError, match="has no record at or after time"):
        only_reader(startingTimestamp=past).partitions()
    assert remote_parts(only_reader(startingTimestamp=past, startingOffsetsByTimestampStrategy="latest")) == []
    assert ranges(endingTimestamp=past) == {p: (0, e) for p, e in ends.items()}


@pytest.mark.parametrize("given, streaming, message", [
    ({"remoteStorage.only": "true"}, False, "'remoteStorage.only' needs 'remoteStorage.url'"),
    ({"remoteStorage.url": "file:///x", "remoteStorage.only": "true"}, True,
     "'remoteStorage.only' is for batch queries only"),
    ({"remoteStorage.url": "file:///x", "remoteStorage.only": "yes"}, False, "'remoteStorage.only' must be 'true'"),
], ids=["without-url", "streaming", "not-boolean"])
def test_remote_only_option_is_checked(given, streaming, message):
    """Misuses of remoteStorage.only fail at parse time, naming the option."""
    with pytest.raises(InvalidOptionError, match=re.escape(message)):
        SourceOptions.parse({"subscribe": "t", **given}, streaming)


def test_remote_only_makes_the_bootstrap_option_optional():
    """remoteStorage.only: no bootstrap needed; without it (or with only=false) it still is."""
    opts = SourceOptions.parse({"subscribe": "t", "remoteStorage.url": "file:///x", "remoteStorage.only": "true"}, False)
    assert opts.remote_storage_only and opts.bootstrap_servers == ""
    for given in ({"remoteStorage.url": "file:///x", "remoteStorage.only": "false"}, {}):
        with pytest.raises(InvalidOptionError, match="bootstrap.servers"):
            SourceOptions.parse({"subscribe": "t", **given}, False)
