"""A producer batch and the futures of its records (Kafka's ProducerBatch, ProduceRequestResult
and FutureRecordMetadata).

`ProducerBatch` holds one partition's records: open (Python lists growing under the
accumulator's lock) until sealed, then encoded once into an Arrow record batch and sent.
`BatchResult` is its completion, shared by every record of the batch (one event per batch, not
per record); `RecordFuture` is the per-record view `send()` returns, a tuple built at C speed.

Thread rules: a batch is filled under the accumulator's lock by application threads and
encoded and completed on the producer's I/O thread; `BatchResult` and `RecordFuture` may be
waited on from any thread (`wait`, `result`) or awaited on any loop (`wait_async`).
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from functools import partial
from itertools import repeat
from typing import Any, Callable, NamedTuple

import pyarrow as pa

from segment_format import batch_body, body_template, record

log = logging.getLogger("pymq.producer")

Headers = list[tuple[str, bytes]] | None


class RecordMetadata(NamedTuple):
    """Where a record landed. `offset` is -1 with acks=0 (the broker does not answer) and when
    the record failed. A NamedTuple: one is built per record at C speed."""

    topic: str
    partition: int
    offset: int
    timestamp: int


# tuple.__new__ straight from C: RecordMetadata(...) would add a Python call per record.
_new_metadata = partial(tuple.__new__, RecordMetadata)

DeliveryCallback = Callable[[RecordMetadata, "BaseException | None"], Any]


_EVENT_LOCK = threading.Lock()  # guards the lazy creation of BatchResult._event


class BatchResult:
    """Completion shared by every record of one batch; completed once, on the producer's loop.

    `callbacks` holds the batch's `on_delivery` callbacks by record index (None where a record
    has none) and `timestamps` their create times; `complete` calls them, in offset order, on the
    thread that completes the batch: the producer's I/O thread."""

    __slots__ = ("topic", "partition", "base_offset", "log_append_time", "error", "completed", "callbacks",
                 "timestamps", "_event", "_futures")

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.base_offset = -1
        self.log_append_time = -1
        self.error: BaseException | None = None
        self.completed = False  # a plain attribute: what a completed future's methods check first
        self.callbacks: list[DeliveryCallback | None] | None = None
        self.timestamps: list[int] | None = None
        # Made by the first thread that waits (most batches complete unwaited: callbacks, flush,
        # or futures asked after completion), so opening a batch costs no Condition and Lock.
        self._event: threading.Event | None = None
        self._futures: list[asyncio.Future[None]] = []

    def done(self) -> bool:
        return self.completed

    def complete(self, base_offset: int, log_append_time: int = -1, error: BaseException | None = None) -> None:
        if self.completed:
            return
        self.base_offset, self.log_append_time, self.error = base_offset, log_append_time, error
        self.completed = True
        event = self._event  # read after `completed` is set: a waiter that made it saw False first
        if event is not None:
            event.set()
        for future in self._futures:
            if not future.done():
                future.get_loop().call_soon_threadsafe(_resolve, future)
        if self.callbacks is not None:
            self._deliver()

    def _deliver(self) -> None:
        """Call each record's on_delivery once with its RecordMetadata and the batch's error (or
        None). A callback that raises is logged; the others are still called (Kafka does the same)."""
        callbacks, timestamps = self.callbacks, self.timestamps
        self.callbacks = self.timestamps = None
        assert callbacks is not None
        n = len(callbacks)
        offsets = range(self.base_offset, self.base_offset + n) if self.base_offset >= 0 and self.error is None else repeat(-1, n)
        times = repeat(self.log_append_time, n) if self.log_append_time >= 0 or timestamps is None else timestamps
        error = self.error
        for callback, metadata in zip(callbacks, map(_new_metadata, zip(repeat(self.topic, n), repeat(self.partition, n),
                                                                        offsets, times))):
            if callback is not None:
                try:
                    callback(metadata, error)
                except Exception:  # noqa: BLE001 - one application callback must not stop the others
                    log.exception("on_delivery callback for %s-%d offset %d raised", self.topic, self.partition,
                                  metadata.offset)

    def wait(self, timeout_s: float | None) -> None:
        if self.completed:
            return
        event = self._event
        if event is None:
            with _EVENT_LOCK:  # two first waiters must share one event
                event = self._event
                if event is None:
                    event = self._event = threading.Event()
        if not self.completed and not event.wait(timeout_s):
            raise TimeoutError(f"record not acknowledged within {timeout_s}s")

    async def wait_async(self) -> None:
        if self.completed:
            return
        future = asyncio.get_running_loop().create_future()
        self._futures.append(future)
        if self.completed:  # completed between the check and the append
            return
        await future


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class RecordFuture(tuple):
    """The future `send()` returns: `.result()` blocks, `await` suspends; both give RecordMetadata.

    A tuple (batch completion, index in batch, timestamp) so that creating one per record costs
    a C call, not a Python __init__: send() is the per-record hot path.
    """

    __slots__ = ()

    def done(self) -> bool:
        return self[0].completed

    def result(self, timeout: float | None = None) -> RecordMetadata:
        batch = self[0]
        if not batch.completed:
            batch.wait(timeout)
        return self._metadata()

    def exception(self, timeout: float | None = None) -> BaseException | None:
        batch = self[0]
        if not batch.completed:
            batch.wait(timeout)
        return batch.error

    def __await__(self) -> Any:
        yield from self[0].wait_async().__await__()
        return self._metadata()

    def _metadata(self) -> RecordMetadata:
        batch, index, timestamp = self
        if batch.error is not None:
            raise batch.error
        return _new_metadata((batch.topic, batch.partition, batch.base_offset + index if batch.base_offset >= 0 else -1,
                              batch.log_append_time if batch.log_append_time >= 0 else timestamp))


new_future = tuple.__new__  # RecordFuture from C: send() makes one per record


class ProducerBatch:
    """Records for one partition: open (lists growing) until sealed, then encoded once and sent."""

    __slots__ = ("topic", "partition", "keys", "values", "timestamps", "headers", "body", "size",
                 "created", "result", "encoded", "attempts", "record_count", "drain_index", "producer",
                 "attributes")

    def __init__(self, topic: str, partition: int, body: pa.RecordBatch | None = None) -> None:
        self.topic, self.partition = topic, partition
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.timestamps: list[int] = []
        self.headers: list[Headers] | None = None
        self.body = body
        self.size = body.get_total_buffer_size() if body is not None else 0
        self.record_count = body.num_rows if body is not None else 0
        self.created = time.monotonic()
        self.result = BatchResult(topic, partition)
        self.encoded: record.EncodedBatch | None = None
        self.attempts = 0
        self.drain_index = -1  # set by PartitionMutes when first drained (in order only)
        # (producer id, epoch, base sequence) of an idempotent producer's batch once it is first
        # admitted to go out (client/idempotence.py), else None.
        self.producer: tuple[int, int, int] | None = None
        self.attributes = 0  # the header's: TRANSACTIONAL_BIT for a transactional producer's batch

    def set_producer(self, producer: tuple[int, int, int] | None, transactional: bool = False) -> None:
        """Give the batch its producer fields (or take them away). An encoded batch is framed
        again with them; a batch encoded without any (None) is sent as such."""
        self.producer = producer
        self.attributes = record.TRANSACTIONAL_BIT if transactional and producer is not None else 0
        if self.encoded is not None:
            self.encoded = record.with_producer(self.encoded, *(producer or (-1, -1, -1)), self.attributes)

    def encode(self, compression: str) -> record.EncodedBatch:
        if self.encoded is None:
            if self.body is None:
                self.encoded = self._encode_records(compression)
            else:
                self.encoded = record.encode_batch_parts(self.body, compression=compression, **self._producer_fields())
        return self.encoded

    def _producer_fields(self) -> dict[str, int]:
        if self.producer is None:
            return {}
        producer_id, producer_epoch, base_sequence = self.producer
        return {"producer_id": producer_id, "producer_epoch": producer_epoch, "base_sequence": base_sequence,
                "attributes": self.attributes}

    def _encode_records(self, compression: str) -> record.EncodedBatch:
        """The accumulated lists as one batch. Most batches under a latency target hold a handful
        of records, where fixed costs are all there is: the common shape (no headers, no null
        values, keys all null or all set, uncompressed) fills in a BodyTemplate without pyarrow;
        others are built column by column (null keys and headers as shared null arrays,
        timestamp bounds from the list)."""
        n = len(self.values)
        keys, values, timestamps = self.keys, self.values, self.timestamps
        keyless = keys.count(None) == n
        template = None
        if (compression == "none" and self.headers is None and n <= body_template.MAX_RECORDS
                and None not in values and (keyless or None not in keys)):
            template = body_template.template_for(not keyless)
        if template is not None:  # the common small batch: no pyarrow on the way
            encoded: pa.Buffer | bytes = template.encode(None if keyless else keys, values, timestamps)
        else:
            headers = None
            if self.headers is not None:
                headers = [None if h is None else [{"key": k, "value": v} for k, v in h] for h in self.headers]
            self.body = batch_body.make_body(pa.array(values, pa.binary()),
                                             pa.nulls(n, pa.binary()) if keyless else pa.array(keys, pa.binary()),
                                             pa.array(timestamps, batch_body.TIMESTAMP_TYPE), headers)
            encoded = batch_body.encode_body(self.body, compression)
        if self.result.callbacks is not None:
            self.result.timestamps = timestamps
        self.keys = self.values = self.timestamps = []  # type: ignore[assignment]
        self.headers = None
        return record.frame_parts(encoded, record_count=n, base_timestamp=min(timestamps), max_timestamp=max(timestamps),
                                  **self._producer_fields())


