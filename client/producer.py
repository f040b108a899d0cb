"""The producer: accumulate records per partition, seal them into Arrow record batches, send.

Throughput/latency dial: a partition's open batch is sealed when it reaches `batch_size` bytes
or when it is `linger_ms` old, whichever comes first. Sealed batches are encoded (Arrow IPC,
optional lz4/zstd) and grouped per leader into Produce requests; up to `max_in_flight` requests
per broker are outstanding. Retriable errors (NOT_LEADER, lost connection, ...) are retried with
exponential backoff after a metadata refresh, until `delivery_timeout_ms` after the record was
sent.

Idempotent by default (`enable_idempotence`, as Kafka 3+; off with acks=0): each batch carries
the producer id and a sequence number, and a partition leader answers a batch sent again after a
lost response with the offsets it got the first time: retries write nothing twice and keep each
partition's order (client/idempotence.py). A partition's batches in flight then lie within five
batches of its oldest unacknowledged one (several requests may be out, as without idempotence). Without
idempotence, as in Kafka, retries with `max_in_flight > 1` may reorder a partition and a retry
after a lost response writes a batch twice; with `max_in_flight=1`, as Kafka does for
max.in.flight.requests.per.connection=1, a partition is muted while a batch of it is out (in
flight, waiting for its leader's connection or lookup, or backing off before a retry), so newer
batches of the partition wait and a retried batch goes again before them (`PartitionMutes`).

`send()` is cheap: it appends to per-partition Python lists under one lock and returns a
`RecordFuture` that shares its batch's completion (one event per batch, not per record).
`send_batch()` is the columnar path: a whole Arrow table is partitioned with Arrow/numpy
kernels and each partition's rows become batches without any per-record Python.

Two faces, one core: `AsyncProducer` for asyncio code, `Producer` (a loop on a background thread)
for everything else. The accumulator is thread-safe so `Producer.send` never waits for the loop.
This module is the facade: records are batched by `accumulator` (RecordAccumulator) into
`producer_batch` batches and sent by `sender` (Sender).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from time import time_ns as _time_ns
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from client.accumulator import RecordAccumulator
from client.cluster import Cluster
from client.config import BootstrapServers, as_bool, client_settings
from client.group_membership import GroupMetadata
from client.idempotence import ProducerSequences
from client.transactions import PreparedTransaction, PreviousTransaction, TransactionManager
from client.loop_thread import LoopThread
from client.partitioner import StickyPartitioner, partition_for_key, partitions_for_keys
from client.producer_batch import BatchResult, DeliveryCallback, Headers, RecordFuture
from client.retry import Retry, retriable
from client.sender import Sender
from common.errors import (
    DeliveryTimeoutError,
    InvalidTxnStateError,
    ProducerClosedError,
    PymqError,
    UnknownTopicOrPartitionError,
)
from common.topic_partition import TopicPartition
from protocol.messages.metadata import LEGACY_KEY_PARTITIONER
from segment_format import batch_body

log = logging.getLogger("pymq.producer")

# Kafka codecs that Arrow IPC bodies do not have, and the one used instead (same purpose).
COMPRESSION_STAND_INS = {"gzip": "zstd", "snappy": "lz4"}

class AsyncProducer:
    """The producer core. Create and use it on one event loop (`Producer` wraps it for threads).

    `max_in_flight` bounds the Produce requests outstanding per broker. Each partition's records
    are written once and in send order, retries included, when the producer is idempotent (the
    default) or `max_in_flight` is 1 (see the module docstring).
    """

    def __init__(self, bootstrap_servers: str | list[str], *, acks: int | str | None = None, linger_ms: int = 5,
                 batch_size: int = 256 * 1024, compression: str = "none", max_in_flight: int = 5,
                 retries: int = 2**31 - 1, retry_backoff_ms: int = 100, retry_backoff_max_ms: int = 1000,
                 delivery_timeout_ms: int = 120_000, request_timeout_ms: int = 30_000,
                 max_request_size: int = 16 << 20, buffer_memory: int = 64 << 20, max_block_ms: int = 60_000,
                 metadata_max_age_ms: int = 300_000, client_id: str = "pymq-producer",
                 enable_idempotence: bool | None = None, transactional_id: str | None = None,
                 transaction_timeout_ms: int = 60_000) -> None:
        if acks is None:
            acks = "all" if transactional_id is not None else 1
        acks_code = {"all": -1, "-1": -1, "1": 1, "0": 0}.get(str(acks), acks)
        if acks_code not in (-1, 0, 1):
            raise ValueError(f"acks must be 0, 1 or 'all', got {acks!r}")
        if compression in COMPRESSION_STAND_INS:
            stand_in = COMPRESSION_STAND_INS[compression]
            log.warning("%s: compression %r is %r here: record batch bodies are Arrow IPC, which compresses "
                        "with lz4 or zstd only (zstd for gzip's ratio, lz4 for snappy's speed)", client_id,
                        compression, stand_in)
            compression = stand_in
        if compression not in batch_body.COMPRESSIONS:
            raise ValueError(f"compression must be one of {batch_body.COMPRESSIONS} (or Kafka's gzip, snappy), "
                             f"got {compression!r}")
        if batch_size <= 0 or linger_ms < 0 or max_in_flight < 1:
            raise ValueError("batch_size must be > 0, linger_ms >= 0, max_in_flight >= 1")
        if enable_idempotence is not None:
            enable_idempotence = as_bool("enable_idempotence", enable_idempotence)
        if enable_idempotence and acks_code == 0:
            raise ValueError("enable_idempotence needs acks=1 or 'all': with acks=0 the producer never learns what was written")
        idempotent = acks_code != 0 if enable_idempotence is None else enable_idempotence
        if transactional_id is not None:
            if not transactional_id:
                raise ValueError("transactional_id must not be empty")
            if not idempotent or acks_code != -1:
                raise ValueError("a transactional producer is idempotent and needs acks='all'")
            if transaction_timeout_ms <= 0:
                raise ValueError("transaction_timeout_ms must be > 0")
        sequences = ProducerSequences(transactional_id is not None) if idempotent else None
        self.max_block_s = max_block_ms / 1000
        # send() makes two method calls per record on this object: keep its attributes few
        # (on CPython 3.11 past 29 an instance gets a dict of its own and each call is ~15 ns
        # slower, measured). New state goes on a member object.
        # Lookups of a topic ask for its creation, as Kafka's producer's do (the broker decides).
        self.cluster = Cluster(bootstrap_servers, request_timeout_ms=request_timeout_ms, max_in_flight=max_in_flight,
                               auto_create_topics=True)
        # max_in_flight=1 guarantees each partition's order (Kafka's guaranteeMessageOrder).
        self.accumulator = RecordAccumulator(batch_size, linger_ms, buffer_memory, self._on_batch,
                                             in_order=max_in_flight == 1, sequences=sequences)
        self.sender = Sender(self.cluster, self.accumulator, self._refresh_metadata, acks=acks_code,
                             compression=compression, max_in_flight=max_in_flight, retries=retries,
                             retry_backoff_s=retry_backoff_ms / 1000, retry_backoff_max_s=retry_backoff_max_ms / 1000,
                             delivery_timeout_s=delivery_timeout_ms / 1000, max_request_size=max_request_size,
                             request_timeout_ms=request_timeout_ms, metadata_max_age_s=metadata_max_age_ms / 1000,
                             sequences=sequences)
        # A transactional producer's transactions (client/transactions.py), else None.
        self.transactions: TransactionManager | None = None
        if transactional_id is not None:
            assert sequences is not None
            self.transactions = TransactionManager(self.cluster, sequences, transactional_id, transaction_timeout_ms,
                                                   retry_backoff_ms / 1000, self.flush, self.sender.fail_all_paused)
            sequences.on_failure = self.transactions.abortable
            self.sender.transactions = self.transactions
        self.sticky = StickyPartitioner()
        self.partition_counts: dict[str, int] = {}
        self._closed = False

    async def start(self) -> "AsyncProducer":
        self.sender.start(asyncio.get_running_loop())
        batch_body.warm_up()
        await self.sender.refresh_metadata()
        return self

    async def __aenter__(self) -> "AsyncProducer":
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # -- partitioning ----------------------------------------------------------------------------

    async def partitions_of(self, topic: str) -> int:
        """The topic's partition count, looked up on its first record. A lookup that fails on a
        lost connection or a broker going away (a leader killed as a Spark task starts, a rolling
        restart) is tried again with back-off for up to max_block_ms, as Kafka's producer waits on
        metadata; an unknown topic, or a broker that refuses, fails at once."""
        count = self.partition_counts.get(topic)
        if count is None:
            retry = Retry(self.sender.retry_backoff_s, self.max_block_s)
            while True:
                try:
                    partitions = await self.cluster.partitions(topic)
                    break
                except PymqError as err:
                    if isinstance(err, UnknownTopicOrPartitionError) or not retriable(err):
                        raise
                    log.info("metadata lookup of topic %r failed (%s); trying again", topic, err)
                    await retry.back_off(err)
            count = self.partition_counts[topic] = len(partitions)
        return count

    async def _refresh_metadata(self) -> None:
        """Reload leaders and partition counts (new partitions start receiving records)."""
        await self.cluster.refresh()
        self.partition_counts = {t: len(ps) for t, ps in self.cluster.topics.items()}

    def choose_partition(self, topic: str, count: int, key: bytes | None, partition: int | None) -> int:
        if partition is not None:
            if not 0 <= partition < count:
                raise ValueError(f"partition {partition} outside 0..{count - 1} of topic {topic!r}")
            return partition
        if key is not None:
            return partition_for_key(key, count, self.cluster.key_partitioners.get(topic, LEGACY_KEY_PARTITIONER))
        return self.sticky.partition(topic, count)

    # -- sending ---------------------------------------------------------------------------------

    def append(self, topic: str, partition: int, key: bytes | None, value: bytes | None,
               timestamp_ms: int | None, headers: Headers, on_delivery: DeliveryCallback | None = None) -> RecordFuture:
        """Thread-safe enqueue of one record for an already chosen partition."""
        if self._closed:
            raise ProducerClosedError("producer is closed")
        if self.transactions is not None:
            self.transactions.check_can_send()
        if key.__class__ is not bytes and key is not None:
            _check_bytes("key", key)
        if value.__class__ is not bytes and value is not None:
            _check_bytes("value", value)
        return self.accumulator.append(topic, partition, key, value,
                                       _time_ns() // 1_000_000 if timestamp_ms is None else timestamp_ms, headers,
                                       on_delivery)

    def _on_batch(self, topic: str, partition: int, sealed: bool) -> None:
        """A batch opened (the sender must learn its linger deadline) or sealed (ready to go);
        a sealed batch also moves the sticky partition on. A new batch needs no cross-thread
        wake-up when the sleeping sender will wake before the batch is due anyway, or when a
        request for its partition is in flight (its completion wakes the sender: see drain)."""
        sender = self.sender
        if sealed:
            self.sticky.next(topic, self.partition_counts.get(topic, 1), partition)
        elif (topic, partition) in sender.busy or 0.0 < sender.next_wake <= time.monotonic() + self.accumulator.linger_s:
            return
        sender.wake()

    async def send(self, topic: str, value: bytes | None = None, key: bytes | None = None, *,
                   partition: int | None = None, timestamp_ms: int | None = None, headers: Headers = None,
                   on_delivery: DeliveryCallback | None = None) -> RecordFuture:
        """Queue one record; await the returned future for its RecordMetadata. `on_delivery(metadata,
        error)` is called once when the record is acknowledged (error None) or failed, on this
        event loop's thread, in offset order within a partition."""
        await self._wait_for_room()
        count = await self.partitions_of(topic)
        return self.append(topic, self.choose_partition(topic, count, key, partition), key, value, timestamp_ms, headers,
                           on_delivery)

    async def send_batch(self, topic: str, data: Any, *, partition: int | None = None,
                         timestamp_ms: int | None = None) -> list[BatchResult]:
        """Send a pyarrow Table/RecordBatch or pandas DataFrame with a `value` column and optional
        `key`, `timestamp` and `headers` columns. Rows are partitioned by key with the topic's key
        partitioner, vectorized (null keys spread in batch_size chunks); returns one BatchResult per batch sent."""
        if self.transactions is not None:
            self.transactions.check_can_send()
        table = _as_table(data)
        count = await self.partitions_of(topic)
        results = []
        for part, body in self._split(topic, table, count, partition, timestamp_ms):
            await self._wait_for_room()
            results.append(self.accumulator.append_body(topic, part, body))
            self.sender.wake()
        return results

    async def _wait_for_room(self) -> None:
        """Block (up to max_block_ms) while buffer_memory is full of unacknowledged records."""
        deadline = time.monotonic() + self.max_block_s
        while not self.accumulator.has_room():
            if time.monotonic() > deadline:
                raise DeliveryTimeoutError(f"buffer_memory full for {self.max_block_s}s (max_block_ms)")
            await asyncio.sleep(0.001)

    def _split(self, topic: str, table: pa.Table, count: int, partition: int | None,
               timestamp_ms: int | None) -> Iterable[tuple[int, pa.RecordBatch]]:
        body = _standard_body(table, timestamp_ms)
        if partition is not None:
            self.choose_partition(topic, count, None, partition)
            yield from ((partition, chunk) for chunk in self._chunks(body))
            return
        keys = body.column("key").combine_chunks()
        partitioner = self.cluster.key_partitioners.get(topic, LEGACY_KEY_PARTITIONER)
        assignment = (partitions_for_keys(keys, count, partitioner) if keys.null_count < len(keys)
                      else np.full(len(keys), -1, np.int32))
        order = np.argsort(assignment, kind="stable")
        sorted_parts = assignment[order]
        bounds = np.flatnonzero(np.diff(sorted_parts)) + 1
        for rows in np.split(order, bounds):
            if not len(rows):
                continue
            target = int(assignment[rows[0]])
            subset = body.take(pa.array(rows)) if len(rows) < len(body) else body
            for chunk in self._chunks(subset):
                if target >= 0:
                    yield target, chunk
                else:
                    sticky = self.sticky.partition(topic, count)
                    self.sticky.next(topic, count, sticky)
                    yield sticky, chunk

    def _chunks(self, table: pa.Table) -> Iterable[pa.RecordBatch]:
        """Slices of about batch_size bytes (zero-copy), each combined into one RecordBatch."""
        if table.num_rows == 0:
            return
        rows_per_batch = max(1, int(table.num_rows * self.accumulator.batch_size / max(table.nbytes, 1)))
        for start in range(0, table.num_rows, rows_per_batch):
            yield table.slice(start, rows_per_batch).combine_chunks().to_batches()[0]

    def metrics(self) -> dict[str, float]:
        """This producer's metrics, with Kafka's names (client/client_metrics.py):
        record-send-total / -rate, record-error-total, record-retry-total, batch-size-avg / -max,
        record-queue-time-avg / -max (ms), request-total, request-latency-avg / -max (ms),
        records-per-request-avg, buffer-available-bytes."""
        accumulator = self.accumulator
        return self.sender.metrics.snapshot(max(0, accumulator.buffer_memory - accumulator.buffered_bytes))

    # -- transactions (a producer with a transactional_id; client/transactions.py) -----------------

    def _transactional(self) -> TransactionManager:
        if self.transactions is None:
            raise InvalidTxnStateError("this producer has no transactional_id")
        return self.transactions

    async def init_transactions(self) -> PreviousTransaction:
        """Register this instance of the transactional id with its coordinator: fences every older
        instance and aborts its open transaction. Returns how the id's last transaction ended."""
        return await self._transactional().init_transactions()

    def begin_transaction(self) -> None:
        self._transactional().begin_transaction()

    async def send_offsets_to_transaction(self, offsets: Mapping[TopicPartition, int],
                                          group: str | GroupMetadata) -> None:
        """Commit a consumer group's offsets ((topic, partition) -> next offset to read) with the
        transaction: `group` is the consumer's `group_metadata()` (or a group id)."""
        await self._transactional().send_offsets(offsets, group)

    async def commit_transaction(self) -> None:
        """Wait for every record of the transaction, then commit it. Raises the error that made it
        abortable, if any (then call abort_transaction)."""
        await self._transactional().commit()

    async def abort_transaction(self) -> None:
        await self._transactional().abort()

    async def prepare_transaction(self, label: str | None = None) -> PreparedTransaction:
        """Two-phase commit: wait for every record, then prepare the transaction (it no longer times
        out) and return what another client needs to commit or abort it (`Admin.complete_transaction`)."""
        return await self._transactional().prepare(label)

    async def flush(self, timeout_s: float | None = None) -> None:
        """Send everything buffered now and wait until each of those records is acknowledged."""
        pending = list(self.accumulator.incomplete)
        self.sender.flush_requested = True
        self.sender.wake()
        async with asyncio.timeout(timeout_s):
            await asyncio.gather(*(r.wait_async() for r in pending))

    async def close(self, timeout_s: float | None = 60.0) -> None:
        """Flush, stop the sender, close connections. Records still unsent after `timeout_s` fail."""
        if self._closed:
            return
        try:
            await self.flush(timeout_s)
        finally:
            self._closed = True
            await self.sender.close()
            for result in list(self.accumulator.incomplete):
                result.complete(-1, error=ProducerClosedError("producer closed before the record was sent"))
            await self.cluster.close()


def _check_bytes(name: str, value: Any) -> None:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"{name} must be bytes or None, got {type(value).__name__}")


def _as_table(data: Any) -> pa.Table:
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - pandas is a dependency
        pd = None
    if pd is not None and isinstance(data, pd.DataFrame):
        return pa.Table.from_pandas(data, preserve_index=False)
    raise TypeError(f"send_batch takes a pyarrow Table/RecordBatch or a pandas DataFrame, got {type(data).__name__}")


def _standard_body(table: pa.Table, timestamp_ms: int | None) -> pa.Table:
    """Project a user table onto the body schema (key, value, timestamp, headers), casting types."""
    if "value" not in table.column_names:
        raise ValueError("send_batch needs a 'value' column")
    n = table.num_rows

    def column(name: str, kind: pa.DataType) -> pa.ChunkedArray:
        if name not in table.column_names:
            return pa.chunked_array([batch_body.null_headers(n) if kind == batch_body.HEADERS_TYPE else pa.nulls(n, kind)])
        col = table.column(name)
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            col = pc.cast(col, pa.binary())
        return col.cast(kind)

    if "timestamp" in table.column_names:
        ts = table.column("timestamp")
        if pa.types.is_timestamp(ts.type):  # finer units are truncated to milliseconds
            ts = pc.floor_temporal(ts, unit="millisecond").cast(batch_body.TIMESTAMP_TYPE, safe=False)
        else:
            ts = ts.cast(pa.int64()).cast(batch_body.TIMESTAMP_TYPE)
    else:
        now = batch_body.now_ms() if timestamp_ms is None else timestamp_ms
        ts = pa.chunked_array([pa.array(np.full(n, now, dtype=np.int64)).cast(batch_body.TIMESTAMP_TYPE)])
    return pa.table([column("key", pa.binary()), column("value", pa.binary()), ts, column("headers", batch_body.HEADERS_TYPE)],
                    schema=batch_body.BODY_SCHEMA)


class Producer:
    """Synchronous producer: `send()` from any thread; I/O runs on a private background loop.

        with Producer("127.0.0.1:9092", linger_ms=5) as producer:
            future = producer.send("orders", b"value", key=b"customer-7")
            producer.flush()
            print(future.result())          # RecordMetadata(topic, partition, offset, timestamp)

    Settings may also be Kafka's dotted names or one dict (`client.config`):
    `Producer({"bootstrap.servers": "127.0.0.1:9092", "linger.ms": 5})`.
    """

    def __init__(self, bootstrap_servers: BootstrapServers | Mapping[str, Any] | None = None,
                 config: Mapping[str, Any] | None = None, **settings: Any) -> None:
        bootstrap, kwargs = client_settings(AsyncProducer.__init__, bootstrap_servers, config, settings)
        self._thread = LoopThread(kwargs.get("client_id", "pymq-producer"))
        try:
            self._core: AsyncProducer = self._thread.run(self._create(bootstrap, kwargs))
        except BaseException:
            self._thread.stop()
            raise

    @staticmethod
    async def _create(bootstrap_servers: str | list[str], config: dict[str, Any]) -> AsyncProducer:
        return await AsyncProducer(bootstrap_servers, **config).start()

    def send(self, topic: str, value: bytes | None = None, key: bytes | None = None, *, partition: int | None = None,
             timestamp_ms: int | None = None, headers: Headers = None,
             on_delivery: DeliveryCallback | None = None) -> RecordFuture:
        """Queue one record (thread-safe, does not wait for the network). Blocks up to max_block_ms
        when buffer_memory is full.

        Its outcome: the returned future (`result()`, `exception()`, `done()`; cheap once the
        record completed), or `on_delivery(metadata, error)`, called exactly once per record with
        its RecordMetadata (offset -1 on failure) and None or the exception, on the producer's I/O
        thread ("pymq-producer"), in offset order within a partition. Callbacks run where the
        producer does its network work: keep them short (count, append to a queue), and do not
        call `flush()` or `close()` from one. An exception a callback raises is logged."""
        core = self._core
        if core._closed:
            raise ProducerClosedError("producer is closed")
        count = core.partition_counts.get(topic)
        if count is None:
            count = self._thread.run(core.partitions_of(topic))
        accumulator = core.accumulator
        if accumulator.appended_bytes - accumulator.completed_bytes >= accumulator.buffer_memory:
            accumulator.wait_for_space(core.max_block_s)
        return core.append(topic, core.choose_partition(topic, count, key, partition), key, value, timestamp_ms, headers,
                           on_delivery)

    def send_batch(self, topic: str, data: Any, *, partition: int | None = None,
                   timestamp_ms: int | None = None) -> list[BatchResult]:
        """Columnar send of a pyarrow Table/RecordBatch or pandas DataFrame (see AsyncProducer.send_batch)."""
        if self._core._closed:
            raise ProducerClosedError("producer is closed")
        return self._thread.run(self._core.send_batch(topic, data, partition=partition, timestamp_ms=timestamp_ms))

    def init_transactions(self) -> PreviousTransaction:
        """See AsyncProducer.init_transactions."""
        return self._thread.run(self._core.init_transactions())

    def begin_transaction(self) -> None:
        self._core.begin_transaction()

    def send_offsets_to_transaction(self, offsets: Mapping[TopicPartition, int], group: str | GroupMetadata) -> None:
        """See AsyncProducer.send_offsets_to_transaction."""
        self._thread.run(self._core.send_offsets_to_transaction(offsets, group))

    def commit_transaction(self) -> None:
        self._thread.run(self._core.commit_transaction())

    def abort_transaction(self) -> None:
        self._thread.run(self._core.abort_transaction())

    def prepare_transaction(self, label: str | None = None) -> PreparedTransaction:
        """See AsyncProducer.prepare_transaction."""
        return self._thread.run(self._core.prepare_transaction(label))

    def metrics(self) -> dict[str, float]:
        """See AsyncProducer.metrics (read without waiting for the I/O thread)."""
        return self._core.metrics()

    def flush(self, timeout_s: float | None = None) -> None:
        if self._core._closed:
            raise ProducerClosedError("producer is closed")
        self._thread.run(self._core.flush(timeout_s))

    def close(self, timeout_s: float | None = 60.0) -> None:
        """Flush and release everything; calling it again does nothing."""
        if self._core._closed:
            return
        try:
            self._thread.run(self._core.close(timeout_s))
        finally:
            self._thread.stop()

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
