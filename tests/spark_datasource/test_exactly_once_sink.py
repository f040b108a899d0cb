"""The exactly-once `pymq` sinks against a real broker: a streaming copy is seen once by
read_committed readers; a replayed micro-batch skips the partitions whose transaction committed
and rewrites the ones only prepared (the two-phase commit's steps driven by hand, as a driver
crash between two commits leaves them); a batch job that fails in a task leaves nothing visible
and holds no reader back; a versioned batch write (`txnAppId`, `txnVersion`) written again is
skipped; the options that exactly once cannot keep are refused by name."""
from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from broker.process import BrokerProcess
from client import Admin
from spark_datasource.options import InvalidOptionError
from spark_datasource.sink_transactions import TransactionNaming, WriteVersion, complete_all, write_prepared
from spark_datasource.writer import PymqStreamArrowWriter, SinkOptions, send_rows
from tests.helpers.client_records import produce
from tests.helpers.isolated_reads import read_isolated
from tests.helpers.streaming import batches_with_rows, run_to_end

TXN_SETTINGS = {"transaction.state.log.num.partitions": 3}


def string_columns(*names: str) -> StructType:
    return StructType([StructField(name, StringType()) for name in names])


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A broker whose __transaction_state has 3 partitions (50 by default: slow to create)."""
    process = BrokerProcess(tmp_path_factory.mktemp("eos-sink-broker"), TXN_SETTINGS).start()
    yield process.bootstrap
    process.kill()


def create_topics(bootstrap: str, partitions: int, *names: str) -> None:
    with Admin(bootstrap) as admin:
        for name in names:
            admin.create_topic(name, partitions=partitions)


def committed_values(bootstrap: str, topic: str, partitions: int) -> Counter:
    return Counter(v for _, _, _, v in read_isolated(bootstrap, topic, partitions, "read_committed"))


def test_a_streaming_copy_is_seen_once_by_read_committed_readers(spark, bootstrap, topic_name, tmp_path):
    """pymq -> pymq over several micro-batches through the exactly-once sink: a read_committed
    consumer of the output sees every input value once, and no transaction is left open."""
    source, sink = f"{topic_name}-in", f"{topic_name}-out"
    create_topics(bootstrap, 3, source, sink)
    values = [b"v%03d" % i for i in range(90)]
    for p in range(3):
        produce(bootstrap, source, values[p::3], partition=p)
    checkpoint = str(tmp_path / "checkpoint")
    query = (spark.readStream.format("pymq").option("kafka.bootstrap.servers", bootstrap).option("subscribe", source)
             .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", 40).load().select("key", "value")
             .writeStream.format("pymq").option("kafka.bootstrap.servers", bootstrap).option("topic", sink)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    assert batches_with_rows(run_to_end(query, 180)) > 1

    assert committed_values(bootstrap, sink, 3) == Counter(values)
    prefix = TransactionNaming.for_stream(None, checkpoint).prefix
    with Admin(bootstrap) as admin:
        states = {t.state for t in admin.describe_transactions([f"{prefix}-{p}" for p in range(3)])}
    assert states == {"CompleteCommit"}


def test_a_query_started_over_on_a_deleted_checkpoint_writes_its_batches(spark, bootstrap, topic_name, tmp_path):
    """A checkpoint deleted and the query started again at the same location (to reprocess):
    batch ids begin at 0 again under the same transactional ids, yet the new query's batch 0 is
    not taken for the old query's committed batch 0 (the label holds the query id): the output
    holds the input twice, as the user asked."""
    source, sink = f"{topic_name}-in", f"{topic_name}-out"
    create_topics(bootstrap, 1, source, sink)
    values = [b"once-%d" % i for i in range(5)]
    produce(bootstrap, source, values, partition=0)
    checkpoint = tmp_path / "checkpoint"
    for _ in range(2):
        query = (spark.readStream.format("pymq").option("kafka.bootstrap.servers", bootstrap)
                 .option("subscribe", source).option("startingOffsets", "earliest").load().select("value")
                 .writeStream.format("pymq").option("kafka.bootstrap.servers", bootstrap).option("topic", sink)
                 .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
        run_to_end(query, 180)
        shutil.rmtree(checkpoint)
    assert committed_values(bootstrap, sink, 1) == Counter(values * 2)


def test_a_replayed_batch_skips_committed_partitions_and_rewrites_prepared_ones(bootstrap, topic_name):
    """A driver dies after committing partition 0's transaction of batch 5 but not partition 1's
    (Spark has not recorded the batch): the replayed batch's task 0 finds its batch committed
    and writes nothing, task 1 fences and aborts its prepared transaction and writes again; once
    the new driver commits, read_committed readers see every row of the batch once."""
    create_topics(bootstrap, 2, topic_name)
    options = SinkOptions.parse({"kafka.bootstrap.servers": bootstrap, "topic": topic_name},
                                string_columns("key", "value"))
    rows = {task: pa.record_batch({"key": [f"t{task}-{i}" for i in range(5)],
                                   "value": [f"t{task}-v{i}" for i in range(5)]}) for task in (0, 1)}

    def run_task(task: int):
        return write_prepared(bootstrap, options.producer, f"{topic_name}-txn-{task}", "5", iter([rows[task]]),
                              lambda producer, batches: send_rows(options, producer, batches))

    first = [run_task(0), run_task(1)]
    complete_all(bootstrap, [first[0].prepared], commit=True)  # ... and the driver dies

    replay = [run_task(0), run_task(1)]
    assert replay[0].skipped and replay[0].prepared is None
    assert not replay[1].skipped and replay[1].prepared is not None
    complete_all(bootstrap, [m.prepared for m in replay if m.prepared], commit=True)

    want = Counter(v.encode() for batch in rows.values() for v in batch.column("value").to_pylist())
    assert committed_values(bootstrap, topic_name, 2) == want
    written = Counter(v for _, _, _, v in read_isolated(bootstrap, topic_name, 2, "read_uncommitted"))
    assert written - want == Counter(v.encode() for v in rows[1].column("value").to_pylist())  # the aborted copy


def test_a_failed_batch_job_leaves_nothing_visible_and_holds_no_reader_back(spark, bootstrap, topic_name):
    """A batch write whose UDF raises on a row of one task after the other task's rows were sent
    and prepared: the job fails, the driver aborts the prepared transaction, a read_committed
    reader sees none of the job (read_uncommitted sees the aborted rows), and nothing holds its
    last stable offset: a successful write next is seen, once."""
    create_topics(bootstrap, 1, topic_name)

    @F.udf(StringType())
    def checked(value: str) -> str:
        if value == "v-39":  # task 1's last row, once task 0's 20 rows are in the log (prepared)
            from tests.helpers.isolated_reads import read_isolated
            from tests.waiting import wait_until

            wait_until(lambda: len(read_isolated(bootstrap, topic_name, 1, "read_uncommitted")) == 20, 120,
                       "the other task's rows sent")
            raise ValueError("a bad row")
        return value

    df = spark.range(40, numPartitions=2).select(F.format_string("v-%d", "id").alias("value"))
    with pytest.raises(Exception, match="a bad row"):
        (df.select(checked("value").alias("value")).write.format("pymq").mode("append")
         .option("kafka.bootstrap.servers", bootstrap).option("topic", topic_name).save())
    assert committed_values(bootstrap, topic_name, 1) == Counter()
    assert len(read_isolated(bootstrap, topic_name, 1, "read_uncommitted")) == 20

    df.write.format("pymq").mode("append").option("kafka.bootstrap.servers", bootstrap).option("topic", topic_name).save()
    assert committed_values(bootstrap, topic_name, 1) == Counter(b"v-%d" % i for i in range(40))


def test_a_task_that_fails_mid_write_aborts_its_transaction_at_once(bootstrap, topic_name):
    """A task's rows fail after some were sent and acknowledged: its open transaction is aborted
    before the error is raised (left open, it would hold read_committed readers until
    transaction.timeout.ms), so another task's committed rows are readable right away."""
    create_topics(bootstrap, 1, topic_name)
    options = SinkOptions.parse({"kafka.bootstrap.servers": bootstrap, "topic": topic_name}, string_columns("value"))
    sent = pa.record_batch({"value": ["sent-0", "sent-1"]})

    def send_then_fail(producer, batches):
        send_rows(options, producer, batches)  # acknowledged: the partition is in the transaction
        raise ValueError("a bad row")

    with pytest.raises(ValueError, match="a bad row"):
        write_prepared(bootstrap, options.producer, f"{topic_name}-0", "1", iter([sent]), send_then_fail)
    good = write_prepared(bootstrap, options.producer, f"{topic_name}-1", "1",
                          iter([pa.record_batch({"value": ["good"]})]),
                          lambda producer, batches: send_rows(options, producer, batches))
    complete_all(bootstrap, [good.prepared], commit=True)
    assert committed_values(bootstrap, topic_name, 1) == Counter([b"good"])
    assert len(read_isolated(bootstrap, topic_name, 1, "read_uncommitted")) == 3


def test_a_version_written_again_is_skipped_and_the_next_is_written(spark, bootstrap, topic_name):
    """Versioned batch writes (`txnAppId`, `txnVersion`), as foreachBatch makes them: version 7
    written again (a replayed micro-batch) writes nothing, version 8 is written, and another
    application's version 7 is its own: read_committed readers see each write once."""
    create_topics(bootstrap, 2, topic_name)

    def write(app: str, version: int, tag: str) -> None:
        df = spark.range(20, numPartitions=2).select(F.format_string(f"{tag}-%d", "id").alias("value"))
        (df.write.format("pymq").mode("append").option("kafka.bootstrap.servers", bootstrap)
         .option("topic", topic_name).option("txnAppId", app).option("txnVersion", version).save())

    write("daily-totals", 7, "v7")
    write("daily-totals", 7, "v7-again")
    write("daily-totals", 8, "v8")
    write("hourly-totals", 7, "other")
    want = Counter(b"%s-%d" % (tag, i) for tag in (b"v7", b"v8", b"other") for i in range(20))
    assert committed_values(bootstrap, topic_name, 2) == want
    assert len(read_isolated(bootstrap, topic_name, 2, "read_uncommitted")) == 60


@pytest.mark.parametrize("options, message", [
    ({"kafka.transactional.id": "mine"}, "names its own transactions.*transactionalIdPrefix"),
    ({"kafka.acks": "1"}, "need kafka.acks=all"),
    ({"kafka.enable.idempotence": "false"}, "need the idempotent producer"),
    ({"txnAppId": "app"}, "'txnAppId' and 'txnVersion' go together"),
    ({"txnVersion": "3"}, "'txnAppId' and 'txnVersion' go together"),
    ({"txnAppId": "app", "txnVersion": "-1"}, "whole number >= 0, not '-1'"),
    ({"txnAppId": "app", "txnVersion": "three"}, "whole number >= 0, not 'three'"),
    ({"txnAppId": "é" * 512, "txnVersion": "1"}, "'txnAppId' is too long.*at most 1024 UTF-8 bytes"),
], ids=["transactional-id", "acks-1", "no-idempotence", "app-alone", "version-alone", "negative-version",
        "text-version", "app-id-too-long"])
def test_options_exactly_once_cannot_keep_are_refused(options, message):
    """Producer settings a transactional producer cannot have are refused on the driver, by name."""
    with pytest.raises(InvalidOptionError, match=message):
        SinkOptions.parse({"kafka.bootstrap.servers": "127.0.0.1:1", "topic": "t", **options},
                          string_columns("value"))


def test_stream_transactions_are_named_after_the_query(tmp_path: Path):
    """The stream sink's prefix: the option when given, else a hash of the checkpoint location
    (the same for the same query, trailing slash or not; another for another query); neither is
    refused by name."""
    one, other = str(tmp_path / "a"), str(tmp_path / "b")
    assert TransactionNaming.for_stream("orders-sink", one).prefix == "orders-sink"
    assert TransactionNaming.for_stream(None, one) == TransactionNaming.for_stream(None, one + "/")
    assert TransactionNaming.for_stream(None, one) != TransactionNaming.for_stream(None, other)
    with pytest.raises(InvalidOptionError, match="checkpointLocation.*transactionalIdPrefix"):
        TransactionNaming.for_stream(None, None)
    jobs = TransactionNaming.for_job("etl"), TransactionNaming.for_job("etl")
    assert jobs[0].prefix.startswith("etl-") and jobs[0] != jobs[1]
    versioned = TransactionNaming.for_job(None, WriteVersion("totals", 4))
    assert versioned == TransactionNaming.for_job(None, WriteVersion("totals", 4))  # the same ids and label again
    assert versioned.label == "totals:4" and versioned.prefix != TransactionNaming.for_job(None, WriteVersion("x", 4)).prefix
    assert TransactionNaming.for_job("etl", WriteVersion("totals", 4)).prefix == "etl"


def test_the_streaming_sink_refuses_a_write_version():
    """`txnAppId`/`txnVersion` are for batch writes: the streaming sink labels its batches itself."""
    options = SinkOptions.parse({"kafka.bootstrap.servers": "127.0.0.1:1", "topic": "t", "txnAppId": "a",
                                 "txnVersion": "1", "checkpointLocation": "/tmp/c"}, string_columns("value"))
    with pytest.raises(InvalidOptionError, match="for batch writes"):
        PymqStreamArrowWriter(options)
