"""Spark batch reads of a topic the broker tiered itself to S3 (moto's server, through s3fs):
older segments live only in the bucket (local retention deleted them), the tail only on the
broker. With `remoteStorage.url` the executors read the bucket and the broker the tail; without
it the broker serves both (fetches below its local log start come from the remote tier). Both
return every record exactly once, in offset order per partition, with the values produced."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from client import Admin, Producer
from broker.process import BrokerProcess
from tests.tiered_storage.backends import s3_tiering
from tests.waiting import wait_until
from tiered_storage import RemoteSegmentStore

TOPIC = "tiered-s3"
PARTITIONS = 2
PER_PARTITION = 6_000


def value_of(p: int, n: int) -> bytes:
    return b"p%d-n%08d-" % (p, n) + b"x" * 80


@pytest.fixture(scope="module")
def tiering_broker(tmp_path_factory: pytest.TempPathFactory, s3) -> Iterator[BrokerProcess]:
    url, store_options = s3
    process = BrokerProcess(tmp_path_factory.mktemp("tiering-broker"), {
        **s3_tiering(url, store_options), "log.flush.scheduler.interval.ms": 20}).start()
    yield process
    process.kill()


def local_bases(log_dir: Path, p: int) -> list[int]:
    return sorted(int(path.name[:20]) for path in (log_dir / f"{TOPIC}-{p}").glob("*.log"))


@pytest.fixture(scope="module")
def tiered_topic(tiering_broker: BrokerProcess, s3) -> dict[int, int]:
    """TOPIC produced, tiered and trimmed locally; the remote log end of each partition."""
    url, store_options = s3
    with Admin(tiering_broker.bootstrap) as admin:
        admin.create_topic(TOPIC, partitions=PARTITIONS, configs={
            "segment.bytes": 32 << 10, "remote.storage.enable": "true", "local.retention.bytes": 64 << 10,
            "retention.ms": -1})
    schema = pa.schema([("key", pa.binary()), ("value", pa.binary())])
    with Producer(tiering_broker.bootstrap, linger_ms=5) as producer:
        for start in range(0, PER_PARTITION, 500):
            for p in range(PARTITIONS):
                ns = range(start, start + 500)
                producer.send_batch(TOPIC, pa.table({"key": [None] * 500, "value": [value_of(p, n) for n in ns]},
                                                    schema=schema), partition=p)
        producer.flush()
    store = RemoteSegmentStore.from_url(url, store_options)

    def caught_up() -> tuple[dict, dict] | None:  # type: ignore[type-arg]
        manifests = {p: store.load_manifest(TOPIC, p) for p in range(PARTITIONS)}
        bases = {p: local_bases(tiering_broker.log_dir, p) for p in range(PARTITIONS)}
        done = all(manifests[p].log_end_offset == bases[p][-1] and len(bases[p]) <= 3 for p in range(PARTITIONS))
        return (manifests, bases) if done else None

    manifests, bases = wait_until(caught_up, 90, "tiering caught up: every sealed segment in S3, <= 3 local")
    for p in range(PARTITIONS):
        assert bases[p][0] > 0 and bases[p][0] <= manifests[p].log_end_offset  # older segments: only in S3
    return {p: manifests[p].log_end_offset for p in range(PARTITIONS)}


def check_every_record_once(rows: list) -> None:  # type: ignore[type-arg]
    for p in range(PARTITIONS):
        mine = [(r["offset"], r["value"]) for r in rows if r["partition"] == p]
        assert [offset for offset, _ in mine] == list(range(PER_PARTITION))
        assert all(bytes(v) == value_of(p, offset) for offset, v in mine)


def test_spark_reads_the_s3_tier_directly_and_the_tail_from_the_broker(spark, tiering_broker, tiered_topic, s3):
    url, store_options = s3
    options = {"kafka.bootstrap.servers": tiering_broker.bootstrap, "subscribe": TOPIC, "remoteStorage.url": url,
               "remoteStorage.s3.endpointUrl": store_options["endpoint_url"], "remoteStorage.s3.accessKey": "testing",
               "remoteStorage.s3.secretKey": "testing", "remoteStorage.s3.region": store_options["region"]}
    df = spark.read.format("pymq").options(**options).load()
    check_every_record_once(df.select("partition", "offset", "value").orderBy("partition", "offset").collect())


def test_spark_reads_the_tiered_history_through_the_broker_alone(spark, tiering_broker, tiered_topic):
    """Without remoteStorage.url the broker answers below its local log start from the tier."""
    df = spark.read.format("pymq").option("kafka.bootstrap.servers", tiering_broker.bootstrap) \
        .option("subscribe", TOPIC).load()
    check_every_record_once(df.select("partition", "offset", "value").orderBy("partition", "offset").collect())
