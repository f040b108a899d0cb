"""`pymq job compact` (jobs/compact.py) on a compacted topic that a real broker tiers to S3 (moto's
server, through s3fs), against a model: each key's latest value, tombstones, erasure.

- The job keeps each key's latest record below the last remote segment, drops expired
  tombstones and every earlier value of a tombstoned key (erasure), keeps offsets, and the
  leader swaps the result in: readers through the broker and straight from the tier see the
  model's latest values.
- A swap racing the broker's own manifest change (a new upload) gets StaleManifestError, changes
  nothing and leaves no object of its own behind.
- The job SIGKILLed mid-write: every manifest stays valid and names only whole objects, and
  consumers read the same history as before.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from client import Admin, Consumer, Producer
from common.errors import StaleManifestError
from broker.process import BrokerProcess
from tests.tiered_storage.backends import s3_tiering
from jobs.compact import compact, compact_partition, plan_topic, swap
from tiered_storage import RemoteSegmentStore
from tests.waiting import wait_until

KEYS = 40


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, s3) -> Iterator[BrokerProcess]:
    url, options = s3
    process = BrokerProcess(tmp_path_factory.mktemp("compact-broker"), {
        **s3_tiering(url, options), "log.cleaner.enable": False}).start()  # the tier is compacted here, not the local log
    yield process
    process.kill()


class Model:
    """What was produced to a one-partition topic: every record, and each key's latest value."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.latest: dict[bytes, bytes | None] = {}
        self.rounds = 0

    def send(self, keys: list[bytes], values: list[bytes | None]) -> None:
        with Producer(self.bootstrap, linger_ms=0) as producer:
            producer.send_batch(self.topic, pa.table({"key": pa.array(keys, pa.binary()),
                                                      "value": pa.array(values, pa.binary())}), partition=0)
            producer.flush()
        self.latest.update(zip(keys, values))

    def round(self, keys: range = range(KEYS)) -> None:
        self.rounds += 1
        self.send([b"k%02d" % i for i in keys], [b"r%02d-k%02d-" % (self.rounds, i) + b"x" * 40 for i in keys])

    def live(self) -> dict[bytes, bytes]:
        return {k: v for k, v in self.latest.items() if v is not None}


def make_topic(broker: BrokerProcess, topic: str) -> Model:
    with Admin(broker.bootstrap) as admin:
        admin.create_topic(topic, partitions=1, configs={
            "cleanup.policy": "compact", "segment.bytes": 8 << 10, "remote.storage.enable": "true",
            "local.retention.bytes": 16 << 10, "delete.retention.ms": 0})
    model = Model(broker.bootstrap, topic)
    for _ in range(6):
        model.round()
    model.send([b"k%02d" % i for i in range(10)], [None] * 10)  # tombstones: k00..k09
    model.round(range(5))  # k00..k04 come back
    for _ in range(6):  # filler: the tombstones' segment is not the last remote one
        model.round(range(20, KEYS))
    return model


def wait_tiered(broker: BrokerProcess, topic: str, store: RemoteSegmentStore, min_segments: int = 4,
                timeout_s: float = 60.0) -> None:
    """Until the tier holds at least `min_segments` segments and everything but the active segment."""
    def caught_up() -> bool:
        manifest = store.load_manifest(topic, 0)
        with Admin(broker.bootstrap) as admin:
            (row,) = admin.describe_tiering([topic])
        return len(manifest.segments) >= min_segments and row.upload_lag_bytes <= 8 << 10 and not row.failures

    wait_until(caught_up, timeout_s, f"tiering of {topic} catches up", 0.1)


def read_all(bootstrap: str, topic: str) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every record, through the broker (tier and local log)."""
    consumer = Consumer(bootstrap, auto_offset_reset="earliest")
    try:
        consumer.assign([(topic, 0)])
        with Admin(bootstrap) as admin:
            end = admin.list_offsets({(topic, 0): -1})[(topic, 0)][0]
        rows: list[tuple[int, bytes | None, bytes | None]] = []
        deadline = time.monotonic() + 30
        while (not rows or rows[-1][0] < end - 1) and time.monotonic() < deadline:
            table = consumer.poll_arrow(timeout_ms=500)
            rows += zip(table.column("offset").to_pylist(), table.column("key").to_pylist(), table.column("value").to_pylist())
        return rows
    finally:
        consumer.close()


def latest_of(rows: list[tuple[int, bytes | None, bytes | None]]) -> dict[bytes, bytes]:
    latest: dict[bytes, bytes | None] = {}
    for _, key, value in rows:
        latest[key] = value
    return {k: v for k, v in latest.items() if v is not None}


def test_compaction_keeps_the_latest_value_of_each_key_and_erases_tombstoned_ones(spark, broker: BrokerProcess, s3) -> None:
    url, options = s3
    topic = "compact-model"
    store = RemoteSegmentStore.from_url(url, options)
    model = make_topic(broker, topic)
    wait_tiered(broker, topic, store)
    before = store.load_manifest(topic, 0)
    assert latest_of(read_all(broker.bootstrap, topic)) == model.live()

    (result,) = compact(spark, [topic], broker.bootstrap, url, options)
    assert result.status == "swapped", result
    after = store.load_manifest(topic, 0)
    assert after.version > before.version and after.log_end_offset == before.log_end_offset
    assert after.segments[-1] == before.segments[-1]  # the last remote segment is never compacted

    rows = read_all(broker.bootstrap, topic)
    assert latest_of(rows) == model.live()  # readers through the broker see the same latest values
    assert [o for o, _, _ in rows] == sorted(o for o, _, _ in rows)
    # The tier itself, read as Spark executors read it (the broker may still hold local copies).
    compacted_end = after.segments[-1].base_offset
    remote = (spark.read.format("pymq").option("subscribe", topic).option("remoteStorage.url", url)
              .option("remoteStorage.only", "true").option("remoteStorage.s3.endpointUrl", options["endpoint_url"])
              .option("remoteStorage.s3.accessKey", "testing").option("remoteStorage.s3.secretKey", "testing")
              .option("remoteStorage.s3.region", options["region"]).load()
              .select("offset", "key", "value").collect())
    tier = sorted((r["offset"], bytes(r["key"]), None if r["value"] is None else bytes(r["value"])) for r in remote)
    compacted = [row for row in tier if row[0] < compacted_end]
    keys = [k for _, k, _ in compacted]
    assert len(keys) == len(set(keys))  # one record per key below the last remote segment
    for i in range(5, 10):  # tombstoned for good: no value left in the tier (the expired tombstone went too)
        assert not [row for row in compacted if row[1] == b"k%02d" % i], i
    later = {k for o, k, _ in tier if o >= compacted_end}
    assert not set(keys) & later  # a key written again later in the tier keeps only its later record
    assert result.records_kept < result.records_in and result.tombstones_removed > 0


def upload_more(model: Model, broker: BrokerProcess) -> None:
    """The broker uploads new segments: its manifest gains some at the end."""
    for _ in range(4):
        model.round(range(20, KEYS))


def apply_retention(model: Model, broker: BrokerProcess) -> None:
    """The broker's retention expires the oldest remote segments: its manifest loses some at the start."""
    with Admin(broker.bootstrap) as admin:
        admin.alter_configs(model.topic, {"cleanup.policy": "compact,delete", "retention.bytes": 24 << 10})


@pytest.mark.parametrize("race", [upload_more, apply_retention], ids=["new-upload", "retention"])
def test_a_swap_racing_the_broker_is_refused_and_leaves_nothing(broker: BrokerProcess, s3, race) -> None:
    url, options = s3
    topic = f"compact-race-{race.__name__.replace('_', '-')}"
    store = RemoteSegmentStore.from_url(url, options)
    model = make_topic(broker, topic)
    wait_tiered(broker, topic, store)
    with Admin(broker.bootstrap) as admin:
        (plan,), why_not = plan_topic(admin, store, url, tuple(sorted(options.items())), topic, 1_000_000,
                                      int(time.time() * 1000))
    assert why_not is None
    before_start = store.load_manifest(topic, 0).segments[0].base_offset
    result = compact_partition(plan)
    assert result.status == "compacted" and result.segments
    race(model, broker)
    wait_until(lambda: store.load_manifest(topic, 0).version != plan.manifest_version, 30,
               f"the broker's manifest moves on ({race.__name__})")
    with Admin(broker.bootstrap) as admin, pytest.raises(StaleManifestError):
        swap(admin, store, result, plan.topic_id)
    manifest = store.load_manifest(topic, 0)
    ours = {segment["upload_id"] for segment in result.segments}
    assert not ours & {s.upload_id for s in manifest.segments}
    names = {Path(path).name for path in store.fs.ls(store.partition_path(topic, 0))}
    assert not [name for name in names if any(upload_id in name for upload_id in ours)]  # its objects deleted
    for segment in manifest.segments:
        store.verify_upload(topic, 0, segment)
    if race is upload_more:  # retention has removed records on purpose; an upload removes none
        assert latest_of(read_all(broker.bootstrap, topic)) == model.live()
    else:
        assert manifest.segments[0].base_offset > before_start


def test_sigkill_mid_write_leaves_every_manifest_valid_and_the_history_unchanged(broker: BrokerProcess, s3,
                                                                                 tmp_path: Path) -> None:
    url, options = s3
    topic = "compact-kill"
    store = RemoteSegmentStore.from_url(url, options)
    model = make_topic(broker, topic)
    wait_tiered(broker, topic, store)
    history = read_all(broker.bootstrap, topic)
    work = tmp_path / "job-tmp"
    work.mkdir()
    job = subprocess.Popen(
        [sys.executable, "-m", "jobs.compact", topic, "--remote-storage", url, "-b", broker.bootstrap,
         *[arg for k, v in options.items() for arg in ("-s", f"{k}={v}")]],
        start_new_session=True, env={**os.environ, "TMPDIR": str(work)},
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "job.err", "wb"))
    try:
        def writing() -> bool:  # the task is writing compacted segments
            assert job.poll() is None, (tmp_path / "job.err").read_text()[-3000:]
            return bool(list(work.glob("pymq-compact-*/out/*.log")))

        wait_until(writing, 240, "the job writing a compacted segment", interval_s=0.005)
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(30)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    manifest = store.load_manifest(topic, 0)  # parses and checks every invariant
    for segment in manifest.segments:
        store.verify_upload(topic, 0, segment)  # every object it names is whole
    after = read_all(broker.bootstrap, topic)
    assert after == history or latest_of(after) == model.live() == latest_of(history)


def test_a_swap_that_does_not_fit_the_manifest_is_refused_by_name(broker: BrokerProcess, s3) -> None:
    from common.errors import InvalidRequestError, UnknownTopicOrPartitionError

    url, options = s3
    topic = "compact-refused"
    store = RemoteSegmentStore.from_url(url, options)
    make_topic(broker, topic)
    wait_tiered(broker, topic, store)
    manifest = store.load_manifest(topic, 0)
    first, last = manifest.segments[0], manifest.segments[-1]
    with Admin(broker.bootstrap) as admin:
        with pytest.raises(InvalidRequestError, match="not a run"):
            admin.replace_remote_segments(topic, 0, manifest.version, [(first.base_offset, "f" * 16)], [])
        with pytest.raises(InvalidRequestError, match="last remote segment"):
            admin.replace_remote_segments(topic, 0, manifest.version, [(last.base_offset, last.upload_id)], [])
        with pytest.raises(InvalidRequestError, match="not within"):
            admin.replace_remote_segments(topic, 0, manifest.version, [(first.base_offset, first.upload_id)], [last])
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.replace_remote_segments("no-such-topic", 0, 1, [(0, first.upload_id)], [])
        admin.create_topic("compact-not-tiered", partitions=1)
        with pytest.raises(InvalidRequestError, match="not tiered"):
            admin.replace_remote_segments("compact-not-tiered", 0, 1, [(0, first.upload_id)], [])
    assert store.load_manifest(topic, 0) == manifest  # nothing changed
