"""Stream offsets as Spark users parse them: `{topic: {partition: offset}}`, Spark Kafka's form, in
`StreamingQueryProgress.sources[]` and in the checkpoint's `offsets/N` files, checked with the
parser code written for Kafka's source uses (every inner key a partition number, every value an
int) against the brokers' log end offsets; fed back as `startingOffsets`/`endingOffsets`; a
query resumed from a checkpoint written with the legacy inline `topicId` keys; a topic
re-created under a running query. The topic-id ledger's own rules are tested without Spark.
"""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from client import LATEST, Admin, Producer
from spark_datasource.stream_reader import LEGACY_TOPIC_ID, TopicIdLedger, from_json, to_json

KafkaOffsets = dict[tuple[str, int], int]


def kafka_offsets(offsets: str | dict | None) -> KafkaOffsets:
    """`offsets` parsed the way code written for Spark's Kafka source parses them (Scala's
    `JsonUtils.partitionOffsets`: a Map[String, Map[Int, Long]]): fails on anything else."""
    parsed = json.loads(offsets) if isinstance(offsets, str) else offsets
    assert isinstance(parsed, dict), offsets
    out: KafkaOffsets = {}
    for topic, partitions in parsed.items():
        assert isinstance(partitions, dict), offsets
        for partition, offset in partitions.items():
            assert type(offset) is int, f"{topic}/{partition}: {offset!r} is not an offset in {offsets}"
            out[(topic, int(partition))] = offset  # int() raises on a key that is not a partition
    return out


# -- the ledger, no Spark ------------------------------------------------------------------------


def test_offsets_are_kafkas_form_and_legacy_inline_ids_are_read():
    """to_json writes only partitions; from_json reads Kafka's form and the legacy one alike."""
    offsets = to_json({("b", 1): 7, ("a", 0): 3, ("b", 0): 5})
    assert offsets == {"a": {"0": 3}, "b": {"0": 5, "1": 7}}
    assert kafka_offsets(offsets) == {("a", 0): 3, ("b", 0): 5, ("b", 1): 7}
    legacy = {"a": {"0": 3, LEGACY_TOPIC_ID: "id-a"}, "b": {"0": 5, "1": 7}}
    assert from_json(legacy) == from_json(offsets)


def test_ledger_knows_the_ids_of_offsets_it_recorded_and_of_legacy_ones():
    """Recorded offsets have the ids of their own topics (by value, any dict of equal JSON);
    offsets never recorded have their inline ids or none."""
    ledger = TopicIdLedger()
    offsets = ledger.record({"a": {"0": 3}}, {"a": "id-a", "b": "id-b"})
    assert ledger.ids_of(json.loads(json.dumps(offsets))) == {"a": "id-a"}
    assert ledger.ids_of({"a": {"0": 4}}) == {}
    assert ledger.ids_of({"a": {"0": 4, LEGACY_TOPIC_ID: "old"}, "b": {"0": 1}}) == {"a": "old"}
    ledger.record({"a": {"0": 3}}, {"a": "id-a2"})  # the same positions in a new incarnation
    assert ledger.ids_of({"a": {"0": 3}}) == {"a": "id-a2"}


def test_ledger_is_bounded():
    """A query running for months records offsets every trigger: the ledger keeps the latest."""
    ledger = TopicIdLedger(capacity=3)
    for n in range(10):
        ledger.record({"a": {"0": n}}, {"a": f"id-{n}"})
    assert [ledger.ids_of({"a": {"0": n}}) for n in (6, 7, 8, 9)] == [{}, {"a": "id-7"}, {"a": "id-8"}, {"a": "id-9"}]


# -- through Spark ---------------------------------------------------------------------------------


@pytest.fixture
def bootstrap(source_broker) -> str:
    return source_broker.bootstrap


def produce(bootstrap: str, topic: str, counts: dict[int, int], first: int = 0) -> None:
    with Producer(bootstrap, linger_ms=0, acks="all") as producer:
        results = []
        for partition, n in counts.items():
            values = [f"{topic}-{partition}-{i}".encode() for i in range(first, first + n)]
            if values:
                results += producer.send_batch(topic, pa.table({"value": values}), partition=partition)
        producer.flush()
    assert all(r.completed and r.error is None for r in results)


def log_end_offsets(bootstrap: str, topic: str, partitions: int) -> KafkaOffsets:
    """Ground truth: each partition's log end offset, from the broker."""
    with Admin(bootstrap) as admin:
        found = admin.list_offsets({(topic, p): LATEST for p in range(partitions)})
    return {tp: offset for tp, (offset, _) in found.items()}


def run_available_now(spark, bootstrap: str, topic: str, out: Path, **options: str):
    """A Trigger.AvailableNow query from `topic` into Parquet at `out`, run to its end."""
    reader = spark.readStream.format("pymq").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
    for name, value in {"startingOffsets": "earliest", **options}.items():
        reader = reader.option(name, value)
    query = (reader.load().writeStream.format("parquet").option("path", str(out / "data"))
             .option("checkpointLocation", str(out / "checkpoint")).trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(120)
        assert query.exception() is None
    finally:
        query.stop()
    return query


def checkpointed(out: Path) -> dict[int, str]:
    """The source's line of each `offsets/N` file (format v1, metadata, one line per source)."""
    files = [f for f in (out / "checkpoint" / "offsets").iterdir() if f.name.isdigit()]
    return {int(f.name): f.read_text().splitlines()[2] for f in files}


def stored_offsets(spark, out: Path) -> dict[tuple[str, int], list[int]]:
    rows = spark.read.parquet(str(out / "data")).select("topic", "partition", "offset").collect()
    found: dict[tuple[str, int], list[int]] = {}
    for row in rows:
        found.setdefault((row["topic"], row["partition"]), []).append(row["offset"])
    return {tp: sorted(offsets) for tp, offsets in found.items()}


def test_progress_and_checkpoint_offsets_parse_as_kafkas_and_feed_a_batch_read(spark, bootstrap, topic_name, tmp_path):
    """Every micro-batch's startOffset, endOffset and latestOffset parse as Kafka's offsets, each
    batch's row count is its end minus its start, the last end is the log end offsets, the
    checkpoint's offsets files hold the same; a batch's offsets, given as startingOffsets and
    endingOffsets (Spark's exact JSON, as the progress renders it), read exactly that batch."""
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=3)
    produce(bootstrap, topic_name, {0: 9, 1: 4, 2: 0})
    query = run_available_now(spark, bootstrap, topic_name, tmp_path, maxOffsetsPerTrigger="5")

    progress = [p for p in query.recentProgress if p["numInputRows"]]
    assert len(progress) >= 3  # 13 rows, at most 5 a batch
    assert json.loads(progress[0]["sources"][0]["startOffset"]) is None  # as Kafka's: the first batch has none
    for p in progress:
        source = p["sources"][0]
        start = kafka_offsets(source["startOffset"]) if p is not progress[0] else {}
        end = kafka_offsets(source["endOffset"])
        kafka_offsets(source["latestOffset"])
        assert p["numInputRows"] == sum(end[tp] - start.get(tp, 0) for tp in end)
    truth = log_end_offsets(bootstrap, topic_name, 3)
    assert truth == {(topic_name, 0): 9, (topic_name, 1): 4, (topic_name, 2): 0}
    assert kafka_offsets(progress[-1]["sources"][0]["endOffset"]) == truth

    files = checkpointed(tmp_path)
    assert all(kafka_offsets(line) for line in files.values())
    assert kafka_offsets(files[max(files)]) == truth

    second = progress[1]["sources"][0]
    batch = (spark.read.format("pymq").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic_name)
             .option("startingOffsets", json.dumps(json.loads(second["startOffset"])))
             .option("endingOffsets", second["endOffset"]).load().select("partition", "offset").collect())
    start, end = kafka_offsets(second["startOffset"]), kafka_offsets(second["endOffset"])
    assert sorted((r["partition"], r["offset"]) for r in batch) == sorted(
        (p, o) for (_, p), stop in end.items() for o in range(start[(topic_name, p)], stop))


def test_a_query_resumes_from_a_checkpoint_with_legacy_topic_ids(spark, bootstrap, topic_name, tmp_path):
    """A checkpoint whose offsets carry the legacy inline `topicId` keys (written before they
    left the offsets) resumes where it stopped: each record read once, and the offsets written
    from then on are Kafka's form."""
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2)
        topic_id = admin.describe_topics([topic_name])[0].topic_id
    produce(bootstrap, topic_name, {0: 3, 1: 2})
    run_available_now(spark, bootstrap, topic_name, tmp_path)
    files = checkpointed(tmp_path)
    last = tmp_path / "checkpoint" / "offsets" / str(max(files))
    legacy = {t: {**parts, LEGACY_TOPIC_ID: topic_id} for t, parts in json.loads(files[max(files)]).items()}
    lines = last.read_text().splitlines()
    last.write_text("\n".join([*lines[:2], json.dumps(legacy)]))
    (last.parent / f".{last.name}.crc").unlink(missing_ok=True)  # Hadoop's checksum of the old text

    produce(bootstrap, topic_name, {0: 2, 1: 3}, first=3)
    run_available_now(spark, bootstrap, topic_name, tmp_path)
    assert stored_offsets(spark, tmp_path) == {(topic_name, 0): list(range(5)), (topic_name, 1): list(range(5))}
    resumed = {n: line for n, line in checkpointed(tmp_path).items() if n > max(files)}
    assert resumed and all(kafka_offsets(line) for line in resumed.values())
    assert kafka_offsets(resumed[max(resumed)]) == log_end_offsets(bootstrap, topic_name, 2)


def test_a_topic_recreated_under_a_running_query_is_read_from_its_start(spark, bootstrap, topic_name):
    """A topic deleted and re-created under a running query (failOnDataLoss=false) with more
    records than the query had read: the new topic is read from offset 0, whether a trigger saw
    it deleted or only its new id, and every offset the query reported parses as Kafka's."""
    with Admin(bootstrap) as admin:
        admin.create_topic(topic_name, partitions=1)
    produce(bootstrap, topic_name, {0: 3})
    name = f"recreated_{topic_name.replace('-', '_').replace('.', '_')}"
    query = (spark.readStream.format("pymq").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", topic_name).option("startingOffsets", "earliest").option("failOnDataLoss", "false")
             .load().writeStream.format("memory").queryName(name).trigger(processingTime="200 milliseconds").start())
    try:
        query.processAllAvailable()
        with Admin(bootstrap) as admin:
            admin.delete_topics([topic_name])
            admin.create_topic(topic_name, partitions=1)
        produce(bootstrap, topic_name, {0: 5}, first=100)
        query.processAllAvailable()  # the trigger that drops the re-created topic, then the one reading it as new
        rows = spark.table(name).select("offset", "value").collect()
        reported = [s[key] for p in query.recentProgress for s in p["sources"]
                    for key in ("startOffset", "endOffset", "latestOffset") if json.loads(s[key] or "null") is not None]
    finally:
        query.stop()
    assert sorted((r["offset"], r["value"]) for r in rows) == sorted(
        [(i, f"{topic_name}-0-{i}".encode()) for i in range(3)]
        + [(i, f"{topic_name}-0-{100 + i}".encode()) for i in range(5)])
    assert all(kafka_offsets(offsets) is not None for offsets in reported)
