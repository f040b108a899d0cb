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
written; `false`: it is not), and producer settings as `kafka.<name>` (`kafka.acks`,
`kafka.linger.ms`, `kafka.batch.size`, `kafka.compression.type`, ...). The sink's producer
defaults to `acks=all`. Batch writes need `.mode("append")`: Spark refuses its default mode
(ErrorIfExists) for every Python data source before the sink is asked, and the sink refuses
overwrite.

Each task sends its Arrow batches with the producer's columnar `send_batch` (rows are grouped by
topic and partition with Arrow kernels; no per-row Python), flushes, and checks every batch's
outcome: a task whose rows were not all acknowledged raises, so Spark retries it or fails the
job. Delivery is at least once (a retried task sends its rows again); the exactly-once sink is a
later step (transactions committed by the driver per batch id).
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
from spark_datasource.options import InvalidOptionError, boolean_option, bootstrap_servers
from spark_datasource.schema import HEADER_TYPE

log = logging.getLogger("pymq.spark.writer")

SINK_DEFAULTS = {"acks": "all", "linger_ms": 5, "batch_size": 1 << 20}
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
        for name in SPARK_WRITER_OPTIONS:
            opts.pop(name, None)
        settings = {}
        for name, value in opts.items():
            if not name.startswith("kafka."):
                raise InvalidOptionError(f"unknown option {name!r} for the pymq sink; accepted: kafka.bootstrap.servers, "
                                         "topic, includeHeaders, and producer settings as kafka.<name> (e.g. "
                                         "kafka.linger.ms)")
            settings[name.removeprefix("kafka.")] = _number_or_text(value)
        try:
            _, producer = client_settings(AsyncProducer.__init__, bootstrap, settings, {})
        except ValueError as err:
            raise InvalidOptionError(f"pymq sink: {err} (give them with the 'kafka.' prefix)") from err
        _check_columns(schema, topic)
        return cls(bootstrap, topic.strip() if topic else None, {**SINK_DEFAULTS, **producer}, headers)


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


@dataclass
class WrittenRows(WriterCommitMessage):
    """What one task wrote: acknowledged rows per topic."""

    rows: dict[str, int]


def write_batches(options: SinkOptions, batches: Iterator[pa.RecordBatch]) -> WrittenRows:
    """Send every row of `batches`; return once all are acknowledged, or raise."""
    written: dict[str, int] = {}
    results = []
    with Producer(options.bootstrap_servers, **options.producer) as producer:
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
    return WrittenRows(written)


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


class PymqArrowWriter(DataSourceArrowWriter):
    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WrittenRows:
        return write_batches(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        log.info("pymq sink: wrote %d rows", _total(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning("pymq sink: job aborted after %d acknowledged rows (at least once: they stay written)",
                    _total(messages))


class PymqStreamArrowWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WrittenRows:
        return write_batches(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.info("pymq sink: batch %d wrote %d rows", batchId, _total(messages))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("pymq sink: batch %d aborted after %d acknowledged rows (at least once: Spark runs it again)",
                    batchId, _total(messages))


def _total(messages: list[WriterCommitMessage | None]) -> int:
    return sum(sum(m.rows.values()) for m in messages if isinstance(m, WrittenRows))
