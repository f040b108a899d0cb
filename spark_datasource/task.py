"""Executor side of a read: one Spark task fetches one offset range from its partition's leader.

The task owns a private event loop and one client `Cluster` for the duration of the range and
steps the client's async range reader from the task's own thread (no background thread, no hop).
A fetch (up to `kafka.max.partition.fetch.bytes` and `kafka.fetch.max.bytes`, default 8 MiB)
becomes Arrow record batches of the source's schema (`schema.to_rows`); no per-record Python
anywhere on the way.

Offsets the range wants that are gone (deleted by retention, the log truncated, the topic deleted
while the range was read) fail the task with DataLossError (failOnDataLoss=true) or end the
range where they start, logged (false): whichever way the range planned on the driver went away.
Every fetch names the topic id the range was planned on, so a topic deleted and re-created since
(however quickly) is that kind of loss, told by the broker (INCONSISTENT_TOPIC_ID), and the new
topic's records at the old offsets are never read. A fetch that makes no progress (a leader not
known yet, a topic missing for a moment) is retried for `kafkaConsumer.pollTimeoutMs`.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pyarrow as pa

from client.cluster import Cluster
from client.range_reader import RangeStats, read_range
from common.errors import DataLossError, InconsistentTopicIdError, PymqError, UnknownTopicOrPartitionError
from spark_datasource.options import SourceOptions
from spark_datasource.ranges import OffsetRange
from spark_datasource.schema import arrow_schema, to_rows

DEFAULT_FETCH_BYTES = 8 << 20

log = logging.getLogger("pymq.spark.task")


def read_offset_range(options: SourceOptions, offset_range: OffsetRange,
                      stats: RangeStats | None = None) -> Iterator[pa.RecordBatch]:
    """The rows of `offset_range`, a fetch's worth per Arrow batch."""
    schema = arrow_schema(options.include_headers)
    client = options.client
    loop = asyncio.new_event_loop()
    cluster = Cluster(options.bootstrap_servers, request_timeout_ms=client.get("request_timeout_ms", 30_000))
    batches = read_range(
        cluster, offset_range.topic, offset_range.partition, offset_range.start, offset_range.end,
        max_bytes=min(client.get("max_partition_fetch_bytes", DEFAULT_FETCH_BYTES),
                      client.get("fetch_max_bytes", DEFAULT_FETCH_BYTES)),
        fail_on_data_loss=options.fail_on_data_loss, check_crcs=client.get("check_crcs", True),
        retry_backoff_s=client.get("retry_backoff_ms", 100) / 1000, retry_timeout_s=options.poll_timeout_ms / 1000,
        topic_id=offset_range.topic_id, stats=stats, isolation_level=options.isolation_level,
    )
    try:
        while True:
            try:
                fetched = loop.run_until_complete(anext(batches))
            except StopAsyncIteration:
                return
            except (DataLossError, UnknownTopicOrPartitionError, InconsistentTopicIdError) as err:
                _gone(options, _as_data_loss(offset_range, err))
                return
            yield from to_rows(offset_range.topic, offset_range.partition, fetched, schema)
    finally:
        try:
            loop.run_until_complete(batches.aclose())
            loop.run_until_complete(cluster.close())
        finally:
            loop.close()


def _as_data_loss(offset_range: OffsetRange, err: PymqError) -> DataLossError:
    """`err` as the loss of the rest of `offset_range`: UNKNOWN_TOPIC_OR_PARTITION here (retried
    until the poll timeout) is a topic deleted since planning, INCONSISTENT_TOPIC_ID one deleted and
    re-created (the broker's message names the new id)."""
    if isinstance(err, DataLossError):
        return err
    r = offset_range
    what = (f"was re-created: offsets {r.start}..{r.end - 1} were planned on topic id {r.topic_id}"
            if isinstance(err, InconsistentTopicIdError) else
            f"no longer exists (topic deleted?) while offsets {r.start}..{r.end - 1} were read")
    return DataLossError(f"{r.topic}-{r.partition} {what} ({err})", r.topic, r.partition, r.start, r.end)


def _gone(options: SourceOptions, err: DataLossError) -> None:
    """The rest of the range is gone: raise (failOnDataLoss=true), or log that it is skipped."""
    if options.fail_on_data_loss:
        raise err
    log.warning("%s: skipping the rest of the range (failOnDataLoss=false)", err)
