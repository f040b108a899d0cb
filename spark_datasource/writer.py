"""`df.write.format("pymq")` and `df.writeStream.format("pymq")`: rows to topics, Arrow end to end.

Columns, as the Spark Kafka sink takes them:

| column | type | |
| --- | --- | --- |
| `value` | binary or string | required |
| `key` | binary or string | optional; keyed rows go where the topic's key partitioner puts them (Kafka's murmur2 placement for new topics) |
| `topic` | string | required unless the `topic` option is set (the option wins, as in Kafka) |
| `partition` | int | optional; a non-null value picks the partition |
| `headers` | array<struct<key string, value binary>> | optional |

Other columns are ignored (as Kafka's sink does). Options: `kafka.bootstrap.servers` (or
`bootstrap.servers`), `topic`, `includeHeaders` (`true` by default: a `headers` column is
written; `false`: it is not), and producer settings as `kafka.<name>` (`kafka.linger.ms`,
`kafka.batch.size`, `kafka.compression.type`, ...). Batch writes need `.mode("append")`: Spark refuses its default mode
(ErrorIfExists) for every Python data source before the sink is asked, and the sink refuses
overwrite.

Each task sends its Arrow batches with the producer's columnar `send_batch` (rows are grouped by
topic and partition with Arrow kernels; no per-row Python), inside a transaction that it prepares;
the driver commits every task's transaction when Spark commits the write (streaming: per
micro-batch id), or aborts them: both sinks are exactly once for read_committed readers
(sink_transactions.py says how and under which assumption). Options of the transactions:
`transactionalIdPrefix` (the ids are `{prefix}-{partitionId}`; streaming: by default derived from
the query's `checkpointLocation`, batch: a uuid per job is appended) and
`kafka.transaction.timeout.ms` (default 5 minutes); for batch writes `txnAppId` and `txnVersion`
(Delta Lake's names: a version of an application is written once, so `foreachBatch` can pass the
micro-batch id and be exactly once through replays, also in Update mode). The sink owns its transactional ids:
`kafka.transactional.id` is refused, and so are `kafka.acks` other than `all` and
`kafka.enable.idempotence=false` (a transactional producer needs both).
"""
from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StringType, StructType

from client import Producer
from client.config import client_settings
from client.producer import AsyncProducer
from protocol.messages.transactions import LABEL_MAX_BYTES
from spark_datasource.options import InvalidOptionError, boolean_option, bootstrap_servers
from spark_datasource.schema import HEADER_TYPE
from spark_datasource.sink_transactions import (
    PreparedWrite,
    TransactionNaming,
    WriteVersion,
    complete_all,
    prepared_of,
    write_prepared,
)

log = logging.getLogger("pymq.spark.writer")

# A task's transaction stays open while the task computes and sends its rows: 5 minutes rather
# than the producer's 60 s, so a slow task is not aborted under it. It is also how long the
# producer retries reaching the transaction coordinator (init_transactions), so not the broker's
# 15-minute maximum: a task that cannot reach one fails within minutes and Spark sees it.
SINK_DEFAULTS = {"acks": "all", "linger_ms": 5, "batch_size": 1 << 20, "transaction_timeout_ms": 300_000}
# Options of Spark's own writers that reach every sink with the user's (`writeStream` keeps
# `checkpointLocation` and `queryName` there; `save(path)` sets `path`): not the sink's, so not
# refused as unknown.
SPARK_WRITER_OPTIONS = ("path", "checkpointlocation", "queryname")
_COLUMN_TYPES = {
    "value": (BinaryType(), StringType()),
    "key": (BinaryType(), StringType()),
    "topic": (StringType(),),
    "partition": (IntegerType(),),
    "headers": (ArrayType(HEADER_TYPE),),
}


@dataclass(frozen=True)
class SinkOptions:
    bootstrap_servers: str
    topic: str | None
    producer: dict[str, Any] = field(default_factory=dict)
    headers: bool = True  # write the `headers` column when there is one (includeHeaders=false: not)
    transactional_id_prefix: str | None = None  # the `transactionalIdPrefix` option
    checkpoint_location: str | None = None  # writeStream's, which names a query's transactions
    version: WriteVersion | None = None  # `txnAppId` and `txnVersion`: a batch write of one version

    @classmethod
    def parse(cls, options: Mapping[str, str], schema: StructType) -> "SinkOptions":
        """Check the options and the DataFrame's columns before any task runs."""
        opts = {k.lower(): str(v) for k, v in options.items()}
        bootstrap = bootstrap_servers(opts)
        opts.pop("kafka.bootstrap.servers", None)
        opts.pop("bootstrap.servers", None)
        topic = opts.pop("topic", None)
        headers = boolean_option(opts, "includeheaders", True)
        opts.pop("includeheaders", None)
        prefix = opts.pop("transactionalidprefix", "").strip() or None
        version = _write_version(opts.pop("txnappid", None), opts.pop("txnversion", None))
        checkpoint = opts.get("checkpointlocation")
        for name in SPARK_WRITER_OPTIONS:
            opts.pop(name, None)
        _check_transactional(opts)
        settings = {}
        for name, value in opts.items():
            if not name.startswith("kafka."):
                raise InvalidOptionError(f"unknown option {name!r} for the pymq sink; accepted: kafka.bootstrap.servers, "
                                         "topic, includeHeaders, transactionalIdPrefix, txnAppId and txnVersion, "
                                         "and producer settings as "
                                         "kafka.<name> (e.g. kafka.linger.ms)")
            settings[name.removeprefix("kafka.")] = _number_or_text(value)
        try:
            _, producer = client_settings(AsyncProducer.__init__, bootstrap, settings, {})
        except ValueError as err:
            raise InvalidOptionError(f"pymq sink: {err} (give them with the 'kafka.' prefix)") from err
        _check_columns(schema, topic)
        return cls(bootstrap, topic.strip() if topic else None, {**SINK_DEFAULTS, **producer}, headers, prefix,
                   checkpoint, version)


def _write_version(app_id: str | None, version: str | None) -> WriteVersion | None:
    """`txnAppId` and `txnVersion`, both or neither (Delta Lake's rule)."""
    if app_id is None and version is None:
        return None
    if app_id is None or not app_id.strip() or version is None:
        raise InvalidOptionError("the pymq sink's 'txnAppId' and 'txnVersion' go together: give both (a versioned "
                                 "write, e.g. in foreachBatch: a name of the write and the batch id) or neither")
    try:
        number = int(version)
    except ValueError:
        number = -1
    if number < 0:
        raise InvalidOptionError(f"the pymq sink's 'txnVersion' must be a whole number >= 0, not {version!r}")
    written = WriteVersion(app_id.strip(), number)
    if len(written.label.encode("utf-8", "surrogatepass")) > LABEL_MAX_BYTES:
        raise InvalidOptionError(f"the pymq sink's 'txnAppId' is too long: with the version it labels the "
                                 f"transactions, at most {LABEL_MAX_BYTES} UTF-8 bytes")
    return written


def _check_transactional(opts: Mapping[str, str]) -> None:
    """Producer settings that exactly once cannot keep, refused on the driver before any task."""
    if "kafka.transactional.id" in opts:
        raise InvalidOptionError("the pymq sink names its own transactions (one id per task): remove "
                                 "kafka.transactional.id; 'transactionalIdPrefix' sets the ids' prefix")
    if opts.get("kafka.acks", "all").strip().lower() not in ("all", "-1"):
        raise InvalidOptionError(f"the pymq sink writes exactly once, in transactions, which need kafka.acks=all "
                                 f"(given {opts['kafka.acks']!r})")
    if opts.get("kafka.enable.idempotence", "true").strip().lower() == "false":
        raise InvalidOptionError("the pymq sink writes exactly once, in transactions, which need the idempotent "
                                 "producer: remove kafka.enable.idempotence=false")


def _number_or_text(value: str) -> Any:
    try:
        return int(value)
    except ValueError:
        return value


def _check_columns(schema: StructType, topic_option: str | None) -> None:
    fields = {f.name.lower(): f for f in schema.fields}
    if "value" not in fields:
        raise InvalidOptionError(f"the pymq sink needs a 'value' column (binary or string); the DataFrame has "
                                 f"{', '.join(schema.fieldNames()) or 'no columns'}")
    if topic_option is None and "topic" not in fields:
        raise InvalidOptionError("the pymq sink needs the 'topic' option or a 'topic' column (string)")
    for name, accepted in _COLUMN_TYPES.items():
        f = fields.get(name)
        if name == "topic" and topic_option is not None:
            continue  # the option wins: the column is not read (Kafka's sink ignores it too)
        # Compared as type strings, which leave nullability out: headers made with F.struct of
        # literals have non-nullable fields (a DataType compare refused them as "not
        # array<struct<key:string,value:binary>>"), and the producer casts each batch anyway.
        if f is not None and f.dataType.simpleString() not in {t.simpleString() for t in accepted}:
            kinds = " or ".join(t.simpleString() for t in accepted)
            raise InvalidOptionError(f"the pymq sink's column {name!r} must be {kinds}, not {f.dataType.simpleString()}")


def send_rows(options: SinkOptions, producer: Producer, batches: Iterator[pa.RecordBatch]) -> dict[str, int]:
    """Send every row of `batches`; return the rows per topic once all are acknowledged, or raise."""
    written: dict[str, int] = {}
    results = []
    for batch in batches:
        for topic, partition, rows in _split(batch, options.topic, options.headers):
            results.extend(producer.send_batch(topic, rows, partition=partition))
            written[topic] = written.get(topic, 0) + rows.num_rows
    producer.flush()
    failed = [r for r in results if r.error is not None or not r.completed]
    if failed:
        first = failed[0]
        raise RuntimeError(f"pymq sink: {len(failed)} of {len(results)} batches were not acknowledged; first: "
                           f"{first.topic}-{first.partition}: {first.error!r}") from first.error
    return written


def _split(batch: pa.RecordBatch, topic_option: str | None, headers: bool) -> Iterator[tuple[str, int | None, pa.Table]]:
    """The batch's rows grouped by topic and chosen partition (None: by key), with kernels; only
    the sink's columns are carried (others are ignored, and never copied by the filters)."""
    names = {n.lower(): n for n in batch.schema.names}
    used = [c for c in ("key", "value", "headers", "topic", "partition")
            if c in names and not (c == "topic" and topic_option is not None) and not (c == "headers" and not headers)]
    table = pa.Table.from_batches([batch]).select([names[c] for c in used]).rename_columns(used)
    body = [c for c in ("key", "value", "headers") if c in used]
    if topic_option is not None:
        groups = [(topic_option, table)]
    else:
        topics = table.column("topic")
        if topics.null_count:
            raise ValueError("pymq sink: a row has a null 'topic' and no 'topic' option is set")
        groups = [(name, table.filter(pc.equal(topics, name))) for name in pc.unique(topics).to_pylist()]
    for topic, rows in groups:
        if "partition" not in used:
            yield topic, None, rows.select(body)
            continue
        partitions = rows.column("partition")
        keyed = pc.is_null(partitions)
        if pc.any(keyed).as_py():
            yield topic, None, rows.filter(keyed).select(body)
        for p in pc.unique(pc.drop_null(partitions)).to_pylist():
            yield topic, p, rows.filter(pc.fill_null(pc.equal(partitions, p), False)).select(body)


def write_task(options: SinkOptions, naming: TransactionNaming, batches: Iterator[pa.RecordBatch]) -> PreparedWrite:
    """A task's rows, in its prepared transaction (executor side)."""
    transactional_id, label = naming.task_id_and_label()
    return write_prepared(options.bootstrap_servers, options.producer, transactional_id, label, batches,
                          lambda producer, rows: send_rows(options, producer, rows))


class PymqArrowWriter(DataSourceArrowWriter):
    """Batch writes: the job's transactions, named with a uuid made here on the driver."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        self.naming = TransactionNaming.for_job(options.transactional_id_prefix, options.version)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PreparedWrite:
        return write_task(self.options, self.naming, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        complete_all(self.options.bootstrap_servers, prepared_of(messages), commit=True)
        log.info("pymq sink: job %s committed %d rows", self.naming.label, _total(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning("pymq sink: job %s failed: aborting the transactions of %d rows", self.naming.label,
                    _total(messages))
        complete_all(self.options.bootstrap_servers, prepared_of(messages), commit=False)


class PymqStreamArrowWriter(DataSourceStreamArrowWriter):
    """Streaming writes: each micro-batch's transactions, committed by `commit(messages, batchId)`."""

    def __init__(self, options: SinkOptions) -> None:
        if options.version is not None:
            raise InvalidOptionError("'txnAppId' and 'txnVersion' are for batch writes (df.write, e.g. in "
                                     "foreachBatch): the streaming sink labels each micro-batch itself")
        self.options = options
        self.naming = TransactionNaming.for_stream(options.transactional_id_prefix, options.checkpoint_location)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PreparedWrite:
        return write_task(self.options, self.naming, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        complete_all(self.options.bootstrap_servers, prepared_of(messages), commit=True)
        skipped = sum(1 for m in messages if isinstance(m, PreparedWrite) and m.skipped)
        log.info("pymq sink: batch %d committed %d rows (%d partitions committed by an earlier run)", batchId,
                 _total(messages), skipped)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("pymq sink: batch %d failed: aborting the transactions of %d rows (Spark runs it again)",
                    batchId, _total(messages))
        complete_all(self.options.bootstrap_servers, prepared_of(messages), commit=False)


def _total(messages: list[WriterCommitMessage | None]) -> int:
    return sum(sum(m.rows.values()) for m in messages if isinstance(m, PreparedWrite))
