"""The producer: accumulate records per partition, seal them into Arrow record batches, send.

Throughput/latency dial: a partition's open batch is sealed when it reaches `batch_size` bytes
or when it is `linger_ms` old, whichever comes first. Sealed batches are encoded (Arrow IPC,
optional lz4/zstd) and grouped per leader into Produce requests; up to `max_in_flight` requests
per broker are outstanding. Retriable errors (NOT_LEADER, lost connection, ...) are retried with
exponential backoff after a metadata refresh, until `delivery_timeout_ms` after the record was
sent. As in Kafka without idempotence, retries with `max_in_flight > 1` may reorder a partition;
use `max_in_flight=1` when order under failure matters: then, as Kafka does for
max.in.flight.requests.per.connection=1, a partition is muted while a batch of it is out (in
flight, waiting for its leader's connection or lookup, or backing off before a retry), so newer
batches of the partition wait and a retried batch goes again before them (`PartitionMutes`).
Retries may still write a batch twice when a response was lost.

`send()` is cheap: it appends to per-partition Python lists under one lock and returns a
`RecordFuture` that shares its batch's completion (one event per batch, not per record).
`send_batch()` is the columnar path: a whole Arrow table is partitioned with Arrow/numpy
kernels and each partition's rows become batches without any per-record Python.

Two faces, one core: `AsyncProducer` for asyncio code, `Producer` (a loop on a background thread)
for everything else. The accumulator is thread-safe so `Producer.send` never waits for the loop.
"""
from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import deque
from time import monotonic as _monotonic
from time import time_ns as _time_ns
from collections.abc import Mapping
from functools import partial
from itertools import repeat
from operator import attrgetter
from typing import Any, Callable, Iterable, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from segment_format import body_template, record
from broker.client.cluster import Cluster
from broker.client.config import BootstrapServers, client_settings
from broker.client.loop_thread import LoopThread
from broker.client.partitioner import StickyPartitioner, partition_for_key, partitions_for_keys
from broker.errors import (
    DeliveryTimeoutError,
    NetworkError,
    ProducerClosedError,
    PymqError,
    RequestTimedOutError,
)
from broker.client.connection import BrokerConnection, raise_for_error
from broker.protocol import ProducePartition, ProduceRequest, ProduceResponse, TopicRequest

log = logging.getLogger("pymq.producer")

Headers = list[tuple[str, bytes]] | None
RECORD_OVERHEAD = 16  # bytes counted per record on top of key + value when sizing batches
TIMER_SLACK_S = 0.0005  # half of uvloop's timer resolution


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


_new_future = tuple.__new__

class ProducerBatch:
    """Records for one partition: open (lists growing) until sealed, then encoded once and sent."""

    __slots__ = ("topic", "partition", "keys", "values", "timestamps", "headers", "body", "size",
                 "created", "result", "encoded", "attempts", "record_count", "drain_index")

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
        self.drain_index = -1  # set by PartitionMutes when first drained (max_in_flight=1 only)

    def encode(self, compression: str) -> record.EncodedBatch:
        if self.encoded is None:
            if self.body is None:
                self.encoded = self._encode_records(compression)
            else:
                self.encoded = record.encode_batch_parts(self.body, compression=compression)
        return self.encoded

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
            self.body = record.make_body(pa.array(values, pa.binary()),
                                         pa.nulls(n, pa.binary()) if keyless else pa.array(keys, pa.binary()),
                                         pa.array(timestamps, record.TIMESTAMP_TYPE), headers)
            encoded = record.encode_body(self.body, compression)
        if self.result.callbacks is not None:
            self.result.timestamps = timestamps
        self.keys = self.values = self.timestamps = []  # type: ignore[assignment]
        self.headers = None
        return record.frame_parts(encoded, record_count=n, base_timestamp=min(timestamps), max_timestamp=max(timestamps))


_drain_index = attrgetter("drain_index")


class PartitionMutes:
    """Per-partition order under retries (max_in_flight=1): Kafka's muted partitions. I/O thread only.

    A partition is muted while any batch of it is out: handed out by the accumulator and neither
    completed nor queued again. Meanwhile its newer batches are held back here; when the last
    batch out comes back (to be retried, or once its connection opened or its leader is known)
    or completes, the partition's batches are released in the order they were first drained,
    to go before anything queued since. A batch out is retried before any newer batch of its
    partition is sent, whether the retry goes to the same leader or a new one.

    Per-batch work only, and only in this mode: the accumulator's drain passes the batches it
    takes through `hand_out`, and its requeue and done report batches back.
    """

    def __init__(self) -> None:
        self.muted: dict[tuple[str, int], list[ProducerBatch]] = {}  # partition -> batches held back
        self._out: dict[tuple[str, int], int] = {}  # how many batches of each muted partition are out
        self._drained = 0  # batches given a drain_index so far

    def hand_out(self, batches: list[ProducerBatch]) -> list[ProducerBatch]:
        """Of `batches` (drained, in queue order), those that may be sent now: every one of a
        partition that was not muted. Those go out together, in order; their partitions are muted.
        The rest are held back."""
        muted = self.muted
        ready = []
        index = self._drained
        for batch in batches:
            if batch.drain_index < 0:
                batch.drain_index = index
                index += 1
            held = muted.get((batch.topic, batch.partition))
            if held is None:
                ready.append(batch)
            else:
                held.append(batch)
        self._drained = index
        out = self._out
        for batch in ready:
            tp = (batch.topic, batch.partition)
            count = out.get(tp)
            if count is None:
                out[tp] = 1
                muted[tp] = []
            else:
                out[tp] = count + 1
        return ready

    def returned(self, batches: list[ProducerBatch]) -> list[ProducerBatch]:
        """Batches out that are to be sent again: they rejoin their partitions' held batches.
        Returns the batches of partitions with nothing out any more, to queue at the front."""
        released: list[ProducerBatch] = []
        for batch in batches:
            tp = (batch.topic, batch.partition)
            self.muted[tp].append(batch)
            released += self._one_back(tp)
        return released

    def completed(self, batch: ProducerBatch) -> list[ProducerBatch]:
        """A batch out succeeded or failed for good; like `returned`."""
        return self._one_back((batch.topic, batch.partition))

    def _one_back(self, tp: tuple[str, int]) -> list[ProducerBatch]:
        count = self._out[tp] - 1
        if count:
            self._out[tp] = count
            return []
        del self._out[tp]
        held = self.muted.pop(tp)
        # Drain order is queue order. Batches out in several groups (two requests, or a retry
        # group and batches without an in-flight slot) may come back in any order.
        held.sort(key=_drain_index)
        return held


class RecordAccumulator:
    """Per-partition open batches plus the queue of sealed ones, shared by the application's
    threads (append) and the producer's I/O thread (drain, done).

    Appends take one lock. The I/O thread takes it only to seal open batches that lingered out
    (and to count the sealed batches queued before them): taking sealed batches (a deque) and
    accounting completed ones (counters only it writes) need no lock. That matters under the
    GIL: a thread switched out while holding the lock makes the other wait for the GIL's next
    hand-over, up to the 5 ms switch interval, so an application in a tight send() loop and the
    sender would otherwise stall each other.

    With `in_order` (max_in_flight=1) it mutes partitions as Kafka's accumulator does: see
    PartitionMutes.
    """

    def __init__(self, batch_size: int, linger_ms: int, buffer_memory: int,
                 on_batch: Callable[[str, int, bool], None], in_order: bool = False) -> None:
        self.on_batch = on_batch
        self.batch_size = batch_size
        self.linger_s = linger_ms / 1000
        # linger_ms=0 sends whatever accumulated by the time the sender looks: never seal on age.
        self.seal_after_s = self.linger_s or math.inf
        self.buffer_memory = buffer_memory
        self.lock = threading.Lock()
        self.space = threading.Condition(threading.Lock())  # waited on while buffer_memory is full
        self.waiting_for_space = 0
        self.open: dict[tuple[str, int], ProducerBatch] = {}
        self.sealed: deque[ProducerBatch] = deque()
        self.appended_bytes = 0  # written under `lock`
        self.completed_bytes = 0  # written by the I/O thread only
        self.incomplete: set[BatchResult] = set()
        self.mutes = PartitionMutes() if in_order else None

    @property
    def buffered_bytes(self) -> int:
        return self.appended_bytes - self.completed_bytes

    def append(self, topic: str, partition: int, key: bytes | None, value: bytes | None, timestamp: int,
               headers: Headers, on_delivery: DeliveryCallback | None = None) -> RecordFuture:
        """Add one record and return its future. Opening a batch (the loop must learn its linger
        deadline) or sealing one (ready to send) calls `on_batch(topic, partition, sealed)`."""
        size = (len(key) if key else 0) + (len(value) if value else 0) + RECORD_OVERHEAD
        tp = (topic, partition)
        with self.lock:
            batch = self.open.get(tp)
            if batch is None:
                batch = self.open[tp] = ProducerBatch(topic, partition)
                self.incomplete.add(batch.result)
                self.on_batch(topic, partition, False)
            index = len(batch.values)
            batch.keys.append(key)
            batch.values.append(value)
            batch.timestamps.append(timestamp)
            if headers is not None or batch.headers is not None:
                if batch.headers is None:
                    batch.headers = [None] * index
                batch.headers.append(headers)
            if on_delivery is not None or batch.result.callbacks is not None:
                callbacks = batch.result.callbacks
                if callbacks is None:
                    callbacks = batch.result.callbacks = [None] * index
                callbacks.append(on_delivery)
            batch.size += size
            self.appended_bytes += size
            # Sealing a lingered-out batch here, rather than only when the sender's timer fires,
            # keeps linger_ms precise under load: event-loop timers have millisecond resolution.
            if batch.size >= self.batch_size or _monotonic() >= batch.created + self.seal_after_s:
                batch.record_count = index + 1
                del self.open[tp]
                self.sealed.append(batch)
                self.on_batch(topic, partition, True)
            return _new_future(RecordFuture, (batch.result, index, timestamp))

    def append_body(self, topic: str, partition: int, body: pa.RecordBatch) -> BatchResult:
        """Queue an already-built Arrow body as one sealed batch (the columnar path)."""
        batch = ProducerBatch(topic, partition, body)
        with self.lock:
            self.incomplete.add(batch.result)
            self.appended_bytes += batch.size
            self.sealed.append(batch)
        return batch.result

    def drain(self, force: bool = False, busy: Mapping[tuple[str, int], int] | None = None
              ) -> tuple[list[ProducerBatch], float | None]:
        """Sealed batches plus open ones past linger (all open ones with `force`), and the time
        until the next open batch lingers out (None if none is waiting on a timer). I/O thread only.

        An open batch whose partition is in `busy` (a request carrying that partition is in
        flight) stays open even past linger: it goes when that request completes, carrying every
        record that arrived meanwhile. That is how small batches form without a timer: with
        linger_ms 0 a lone record still goes at once, but records arriving faster than the
        broker answers share requests instead of each paying a request's cost (Kafka's sender
        batches the same way, by being busy). Full batches never wait for it.

        A batch due within TIMER_SLACK_S counts as due: uvloop's timers have millisecond
        resolution and turn shorter waits into immediate callbacks, so waiting for it would spin.

        The sealed batches handed out are those queued when the lock was taken: an application
        thread may seal a partition's batch and open its next one at any moment, and that next
        one, if taken here, must not go without the one sealed before it.

        In order (max_in_flight=1), batches of muted partitions are held back (PartitionMutes),
        and a muted partition's open batch stays open as a busy one's does.
        """
        sealed = self.sealed
        mutes = self.mutes
        if not self.open:
            ready = [sealed.popleft() for _ in range(len(sealed))]
            return (ready if mutes is None else mutes.hand_out(ready)), None
        if mutes is not None:
            busy = mutes.muted  # a partition with a request in flight or a retry pending is muted
        next_due = None
        expired = []
        with self.lock:
            # The clock is read under the lock: a batch opened just before it was taken is judged
            # against a time after its creation (linger 0: due), however long the wait for the lock.
            now = time.monotonic()
            count = len(sealed)
            for tp, batch in list(self.open.items()):
                due = batch.created + self.linger_s - now
                if force or (due <= TIMER_SLACK_S and not (busy and tp in busy)):
                    del self.open[tp]
                    batch.record_count = len(batch.values)
                    expired.append(batch)
                elif due > TIMER_SLACK_S:
                    next_due = due if next_due is None else min(next_due, due)
        # Only this thread takes from the left (appends go to the right): the first `count` are
        # the ones counted under the lock.
        ready = [sealed.popleft() for _ in range(count)]
        if expired:
            ready += expired
        return (ready if mutes is None else mutes.hand_out(ready)), next_due

    def requeue(self, batches: list[ProducerBatch]) -> None:
        """Batches drained are to go again, before anything queued since (I/O thread)."""
        if self.mutes is not None:
            batches = self.mutes.returned(batches)
        self.sealed.extendleft(reversed(batches))

    def done(self, batch: ProducerBatch) -> bool:
        """`batch` completed (I/O thread): its bytes leave buffer_memory. True when that unmuted
        its partition and queued batches held back behind it: the sender has work."""
        self.incomplete.discard(batch.result)
        self.completed_bytes += batch.size
        if self.waiting_for_space:
            with self.space:
                self.space.notify_all()
        if self.mutes is not None:
            released = self.mutes.completed(batch)
            if released:
                self.sealed.extendleft(reversed(released))
                return True
        return False

    def wait_for_space(self, timeout_s: float) -> None:
        """Block the calling application thread until buffer_memory has room, up to `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        with self.space:
            self.waiting_for_space += 1
            try:
                while self.buffered_bytes >= self.buffer_memory:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise DeliveryTimeoutError(f"buffer_memory full for {timeout_s}s (max_block_ms)")
                    self.space.wait(min(remaining, 0.1))
            finally:
                self.waiting_for_space -= 1

    def has_room(self) -> bool:
        return self.buffered_bytes < self.buffer_memory


class AsyncProducer:
    """The producer core. Create and use it on one event loop (`Producer` wraps it for threads).

    `max_in_flight` bounds the Produce requests outstanding per broker; with 1, each partition's
    records are written in send order even when batches are retried (see the module docstring).
    """

    def __init__(self, bootstrap_servers: str | list[str], *, acks: int | str = 1, linger_ms: int = 5,
                 batch_size: int = 256 * 1024, compression: str = "none", max_in_flight: int = 5,
                 retries: int = 2**31 - 1, retry_backoff_ms: int = 100, retry_backoff_max_ms: int = 1000,
                 delivery_timeout_ms: int = 120_000, request_timeout_ms: int = 30_000,
                 max_request_size: int = 16 << 20, buffer_memory: int = 64 << 20, max_block_ms: int = 60_000,
                 metadata_max_age_ms: int = 300_000) -> None:
        self.acks = {"all": -1, "-1": -1, "1": 1, "0": 0}.get(str(acks), acks)
        if self.acks not in (-1, 0, 1):
            raise ValueError(f"acks must be 0, 1 or 'all', got {acks!r}")
        if compression not in record.COMPRESSIONS:
            raise ValueError(f"compression must be one of {record.COMPRESSIONS}, got {compression!r}")
        if batch_size <= 0 or linger_ms < 0 or max_in_flight < 1:
            raise ValueError("batch_size must be > 0, linger_ms >= 0, max_in_flight >= 1")
        self.compression = compression
        self.max_in_flight = max_in_flight
        self.retries = retries
        self.retry_backoff_s = retry_backoff_ms / 1000
        self.retry_backoff_max_s = retry_backoff_max_ms / 1000
        self.delivery_timeout_s = delivery_timeout_ms / 1000
        self.max_request_size = max_request_size
        self.request_timeout_ms = request_timeout_ms  # how long the broker may wait for the acks
        self.max_block_s = max_block_ms / 1000
        self.metadata_max_age_s = metadata_max_age_ms / 1000
        self._metadata_refreshed = 0.0
        # 29 attributes, and no more: on CPython 3.11 a 30th no longer fits the class's shared
        # keys, each instance gets a dict of its own, and a method call on it is ~15 ns slower
        # (measured); send() makes two per record. New state goes on a member object.
        self.cluster = Cluster(bootstrap_servers, request_timeout_ms=request_timeout_ms, max_in_flight=max_in_flight)
        # max_in_flight=1 guarantees each partition's order (Kafka's guaranteeMessageOrder).
        self.accumulator = RecordAccumulator(batch_size, linger_ms, buffer_memory, self._on_batch,
                                             in_order=max_in_flight == 1)
        self.sticky = StickyPartitioner()
        self.partition_counts: dict[str, int] = {}
        self._in_flight: dict[int, int] = {}  # Produce requests outstanding per broker
        self._replies: set[asyncio.Future[Any]] = set()  # their reply futures
        self._busy: dict[tuple[str, int], int] = {}  # partitions with a request in flight: how many
        # Batches drained for a broker whose connection is being opened, oldest first: one list
        # and one connect task per broker, so they go out in the order they were drained.
        self._awaiting_connection: dict[int, list[ProducerBatch]] = {}
        # Likewise batches whose partition is missing from the cached metadata: one lookup at a time.
        self._awaiting_leaders: list[ProducerBatch] | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # slow paths: connect, resolve, retry, refresh
        self._sender_queued = False  # a _run_sender call is queued on the loop
        self._timer: asyncio.TimerHandle | None = None  # runs the sender when a batch lingers out
        self._next_wake = 0.0  # monotonic time `_timer` fires (inf: none needed; 0: unknown)
        self._refreshing = False
        self._closed = False
        self._flush_requested = False
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> "AsyncProducer":
        self._loop = asyncio.get_running_loop()
        record.warm_up()
        await self._refresh_metadata()
        return self

    async def __aenter__(self) -> "AsyncProducer":
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # -- partitioning ----------------------------------------------------------------------------

    async def partitions_of(self, topic: str) -> int:
        count = self.partition_counts.get(topic)
        if count is None:
            count = self.partition_counts[topic] = len(await self.cluster.partitions(topic))
        return count

    async def _refresh_metadata(self) -> None:
        """Reload leaders and partition counts (new partitions start receiving records)."""
        await self.cluster.refresh()
        self.partition_counts = {t: len(ps) for t, ps in self.cluster.topics.items()}
        self._metadata_refreshed = time.monotonic()

    def choose_partition(self, topic: str, count: int, key: bytes | None, partition: int | None) -> int:
        if partition is not None:
            if not 0 <= partition < count:
                raise ValueError(f"partition {partition} outside 0..{count - 1} of topic {topic!r}")
            return partition
        if key is not None:
            return partition_for_key(key, count)
        return self.sticky.partition(topic, count)

    # -- sending ---------------------------------------------------------------------------------

    def append(self, topic: str, partition: int, key: bytes | None, value: bytes | None,
               timestamp_ms: int | None, headers: Headers, on_delivery: DeliveryCallback | None = None) -> RecordFuture:
        """Thread-safe enqueue of one record for an already chosen partition."""
        if self._closed:
            raise ProducerClosedError("producer is closed")
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
        if sealed:
            self.sticky.next(topic, self.partition_counts.get(topic, 1), partition)
        elif (topic, partition) in self._busy or 0.0 < self._next_wake <= time.monotonic() + self.accumulator.linger_s:
            return
        self._wake()

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
        `key`, `timestamp` and `headers` columns. Rows are partitioned by key with vectorized
        murmur3 (null keys spread in batch_size chunks); returns one BatchResult per batch sent."""
        table = _as_table(data)
        count = await self.partitions_of(topic)
        results = []
        for part, body in self._split(topic, table, count, partition, timestamp_ms):
            await self._wait_for_room()
            results.append(self.accumulator.append_body(topic, part, body))
            self._wake()
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
        assignment = partitions_for_keys(keys, count) if keys.null_count < len(keys) else np.full(len(keys), -1, np.int32)
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

    def _wake(self) -> None:
        """Have the sender run soon, from any thread; at most one run is queued at a time."""
        loop = self._loop
        if loop is None or self._sender_queued or self._closed:
            return
        self._sender_queued = True
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        try:
            if running is loop:
                loop.call_soon(self._run_sender)
            else:
                loop.call_soon_threadsafe(self._run_sender)
        except RuntimeError:  # the loop closed under a late append
            self._sender_queued = False

    async def flush(self, timeout_s: float | None = None) -> None:
        """Send everything buffered now and wait until each of those records is acknowledged."""
        pending = list(self.accumulator.incomplete)
        self._flush_requested = True
        self._wake()
        await asyncio.wait_for(asyncio.gather(*(r.wait_async() for r in pending)), timeout_s)

    async def close(self, timeout_s: float | None = 60.0) -> None:
        """Flush, stop the sender, close connections. Records still unsent after `timeout_s` fail."""
        if self._closed:
            return
        try:
            await self.flush(timeout_s)
        finally:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            for reply in list(self._replies):
                reply.cancel()
            for result in list(self.accumulator.incomplete):
                result.complete(-1, error=ProducerClosedError("producer closed before the record was sent"))
            await self.cluster.close()

    # -- the sender ------------------------------------------------------------------------------
    #
    # Callbacks on the loop, not a task: a run drains what is ready, writes Produce requests
    # straight to the leaders' connections and returns; each reply's callback completes its
    # batches and runs the sender again if anything waits. No coroutine, task or timeout wrapper
    # per request: on the latency path (a handful of records per request) those were most of the
    # producer's CPU. Slow paths (connecting, unknown leaders, retry back-off, metadata refresh)
    # are tasks in `_tasks`.

    def _run_sender(self) -> None:
        self._sender_queued = False
        if self._closed:
            return
        force, self._flush_requested = self._flush_requested, False
        batches, next_due = self.accumulator.drain(force, self._busy)
        if batches:
            self._dispatch(batches)
        self._arm_timer(next_due)

    def _arm_timer(self, next_due: float | None) -> None:
        """Run the sender when the next open batch lingers out; `_next_wake` tells appending
        threads whether a new batch needs a wake-up at all (see _on_batch)."""
        if next_due is None:
            self._next_wake = math.inf
            return
        when = time.monotonic() + next_due
        if self._timer is not None and not self._timer.cancelled() and self._next_wake <= when:
            return  # an earlier run is armed; it re-arms for the rest
        if self._timer is not None:
            self._timer.cancel()
        assert self._loop is not None
        self._timer = self._loop.call_later(next_due, self._on_timer)
        self._next_wake = when

    def _on_timer(self) -> None:
        self._timer = None
        self._next_wake = 0.0
        self._run_sender()

    def _spawn(self, coro: Any) -> None:
        """Run a slow path as a task that close() cancels."""
        assert self._loop is not None
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _dispatch(self, batches: list[ProducerBatch]) -> None:
        """Group batches per leader (from cached metadata) and send them. While a lookup of
        leaders is under way, batches of the topics it looks up wait behind its batches."""
        now = time.monotonic()
        if now - self._metadata_refreshed > self.metadata_max_age_s and not self._refreshing:
            self._refreshing = True
            self._spawn(self._refresh_in_background())
        by_node: dict[int, list[ProducerBatch]] = {}
        unknown: list[ProducerBatch] = []
        waiting = self._awaiting_leaders
        looked_up = {b.topic for b in waiting} if waiting is not None else ()
        for batch in batches:
            if now - batch.created > self.delivery_timeout_s:
                self._fail(batch, DeliveryTimeoutError(f"{batch.record_count} records to {batch.topic}-{batch.partition} "
                                                       f"not acknowledged within {self.delivery_timeout_s}s"))
                continue
            parts = self.cluster.topics.get(batch.topic)
            if parts is None or batch.partition >= len(parts) or batch.topic in looked_up:
                unknown.append(batch)
            else:
                by_node.setdefault(parts[batch.partition].leader, []).append(batch)
        if unknown and waiting is not None:
            waiting.extend(unknown)
        elif unknown:
            self._awaiting_leaders = unknown
            self._spawn(self._resolve_leaders())
        for node, node_batches in by_node.items():
            self._send_to(node, node_batches)

    def _send_to(self, node: int, batches: list[ProducerBatch]) -> None:
        """Requests of at most max_request_size to `node`, while it has fewer than max_in_flight
        outstanding; the rest wait at the front of the queue for a reply to free a slot.

        While the connection is being opened, batches join those already waiting for it, even
        once it is open: the waiting ones are older and must go first (see _connect)."""
        waiting = self._awaiting_connection.get(node)
        if waiting is not None:
            waiting.extend(batches)
            return
        conn = self.cluster.open_connection(node)
        if conn is None:
            self._awaiting_connection[node] = list(batches)
            self._spawn(self._connect(node))
            return
        requests: list[list[ProducerBatch]] = [[]]
        size = 0
        for batch in batches:
            encoded = batch.encode(self.compression)
            if requests[-1] and size + encoded.size > self.max_request_size:
                requests.append([])
                size = 0
            requests[-1].append(batch)
            size += encoded.size
        for i, request in enumerate(requests):
            if self._in_flight.get(node, 0) >= self.max_in_flight:
                self.accumulator.requeue([b for r in requests[i:] for b in r])
                return
            self._launch(node, conn, request)

    def _launch(self, node: int, conn: BrokerConnection, batches: list[ProducerBatch]) -> None:
        """One Produce request. A partition's batches travel as one record set in queue order; the
        broker answers with the first offset, and each batch's base follows from the counts."""
        groups: dict[str, dict[int, list[ProducerBatch]]] = {}
        for batch in batches:
            groups.setdefault(batch.topic, {}).setdefault(batch.partition, []).append(batch)
            batch.attempts += 1
        request = ProduceRequest(tuple(
            TopicRequest(topic, tuple(ProducePartition(p, tuple(part for b in group for part in b.encode(self.compression)))
                                      for p, group in parts.items()))
            for topic, parts in groups.items()), self.acks, self.request_timeout_ms)
        ordered = [b for parts in groups.values() for group in parts.values() for b in group]
        try:
            if self.acks == 0:
                conn.write(request, expect_response=False)
            else:
                reply = conn.request(request, self.cluster.request_timeout_s)
        except PymqError as err:  # the connection closed since it was looked up
            self._retry(ordered, err)
            return
        if self.acks == 0:
            for batch in ordered:
                self._succeed(batch, -1, -1)
            return
        partitions = [(topic, p) for topic, parts in groups.items() for p in parts]
        busy = self._busy
        for tp in partitions:
            busy[tp] = busy.get(tp, 0) + 1
        self._in_flight[node] = self._in_flight.get(node, 0) + 1
        self._replies.add(reply)
        reply.add_done_callback(partial(self._on_reply, node, groups, partitions))

    def _on_reply(self, node: int, groups: dict[str, dict[int, list[ProducerBatch]]],
                  partitions: list[tuple[str, int]], reply: asyncio.Future[Any]) -> None:
        self._replies.discard(reply)
        self._in_flight[node] -= 1
        busy = self._busy
        for tp in partitions:
            if busy[tp] == 1:
                del busy[tp]
            else:
                busy[tp] -= 1
        if reply.cancelled():  # close(): the batches fail there
            return
        try:
            response = ProduceResponse.from_control(*_checked_reply(reply))
        except (NetworkError, RequestTimedOutError) as err:
            self._retry([b for parts in groups.values() for group in parts.values() for b in group], err)
        except PymqError as err:
            for parts in groups.values():
                for group in parts.values():
                    for batch in group:
                        self._fail(batch, err)
        else:
            self._complete(groups, response)
        if self.accumulator.sealed or self.accumulator.open:
            self._wake()  # batches held back while this request was out may go now

    def _complete(self, groups: dict[str, dict[int, list[ProducerBatch]]], response: ProduceResponse) -> None:
        outcomes = {(t.name, p.partition): p for t in response.topics for p in t.partitions}
        retry: list[ProducerBatch] = []
        retry_error: PymqError | None = None
        for topic, parts in groups.items():
            for partition, group in parts.items():
                outcome = outcomes.get((topic, partition))
                err = NetworkError("broker response omitted the partition") if outcome is None else outcome.error()
                if err is None:
                    assert outcome is not None
                    base = outcome.base_offset
                    for batch in group:
                        self._succeed(batch, base, outcome.log_append_time)
                        base += batch.record_count
                elif err.retriable:
                    retry.extend(group)
                    retry_error = err
                else:
                    for batch in group:
                        self._fail(batch, err)
        if retry:
            assert retry_error is not None
            self._retry(retry, retry_error)

    def _retry(self, batches: list[ProducerBatch], err: PymqError) -> None:
        """Fail what is out of time or retries, or not retriable; the rest go again after a
        back-off and a metadata refresh. Their partitions count as busy meanwhile, so their open
        batches keep filling instead of lingering out. Newer sealed batches of theirs may go
        first unless max_in_flight=1 (their partitions stay muted: PartitionMutes)."""
        now = time.monotonic()
        retryable = []
        for batch in batches:
            if now - batch.created >= self.delivery_timeout_s:
                timeout = DeliveryTimeoutError(f"{batch.record_count} records to {batch.topic}-{batch.partition} not "
                                               f"acknowledged within {self.delivery_timeout_s}s (last error: {err.name()})")
                timeout.__cause__ = err
                self._fail(batch, timeout)
            elif err.retriable and batch.attempts <= self.retries:
                retryable.append(batch)
            else:
                self._fail(batch, err)
        if retryable:
            self._spawn(self._retry_after_backoff(retryable, err))

    async def _retry_after_backoff(self, batches: list[ProducerBatch], err: PymqError) -> None:
        partitions = [(b.topic, b.partition) for b in batches]
        busy = self._busy
        for tp in partitions:
            busy[tp] = busy.get(tp, 0) + 1
        try:
            attempts = max(b.attempts for b in batches)
            backoff = min(self.retry_backoff_s * 2 ** max(attempts - 1, 0), self.retry_backoff_max_s)
            log.info("retrying %d batches after %s (attempt %d, backoff %.3fs)", len(batches), err.name(), attempts, backoff)
            await asyncio.sleep(backoff)
            try:
                await self._refresh_metadata()
            except PymqError as refresh_err:
                log.info("metadata refresh failed: %s", refresh_err)
        finally:
            for tp in partitions:
                if busy[tp] == 1:
                    del busy[tp]
                else:
                    busy[tp] -= 1
            self.accumulator.requeue(batches)
            self._wake()

    async def _resolve_leaders(self) -> None:
        """Batches whose partition is not in the cached metadata: look it up, then queue them
        all again in drain order (or retry/fail them with the lookup's error). Batches that join
        while it runs are looked up too; see _connect for why there is one list."""
        batches = self._awaiting_leaders
        assert batches is not None
        error: PymqError | None = None
        try:
            checked = 0
            while checked < len(batches):  # the list grows while a lookup is awaited
                await self.cluster.leader(batches[checked].topic, batches[checked].partition)
                checked += 1
        except PymqError as err:
            error = err
        finally:
            self._awaiting_leaders = None
        if error is not None:
            self._retry(batches, error)
            return
        self.accumulator.requeue(batches)
        self._wake()

    async def _connect(self, node: int) -> None:
        """Open the connection to `node`, then queue every batch that waited for it, in drain
        order, at the front (they are older than anything queued since).

        A task per sender run, each requeueing its own batches at the front when the connection
        opened, put the last run's batches first: a partition's records were written in reverse
        groups. Hence one list per broker, taken whole."""
        error: PymqError | None = None
        try:
            await self.cluster.connection(node)
        except PymqError as err:
            error = err
        finally:  # also when close() cancels the task: a later connect starts afresh
            batches = self._awaiting_connection.pop(node)
        if error is not None:
            for batch in batches:
                batch.attempts += 1  # a failed connection attempt counts as one
            self._retry(batches, error)
            return
        self.accumulator.requeue(batches)
        self._wake()

    async def _refresh_in_background(self) -> None:
        try:
            await self._refresh_metadata()
        except PymqError as err:
            log.info("periodic metadata refresh failed: %s", err)
        finally:
            self._refreshing = False

    def _succeed(self, batch: ProducerBatch, base_offset: int, log_append_time: int) -> None:
        batch.result.complete(base_offset, log_append_time)
        if self.accumulator.done(batch):
            self._wake()

    def _fail(self, batch: ProducerBatch, err: BaseException) -> None:
        batch.result.complete(-1, error=err)
        if self.accumulator.done(batch):
            self._wake()


def _checked_reply(reply: asyncio.Future[Any]) -> tuple[dict[str, Any], memoryview]:
    """A reply future's (control, payload); its exception, or the PymqError its top-level error
    code names, is raised."""
    control, payload = reply.result()
    raise_for_error(control)
    return control, payload


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
            return pa.chunked_array([record.null_headers(n) if kind == record.HEADERS_TYPE else pa.nulls(n, kind)])
        col = table.column(name)
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            col = pc.cast(col, pa.binary())
        return col.cast(kind)

    if "timestamp" in table.column_names:
        ts = table.column("timestamp")
        if pa.types.is_timestamp(ts.type):  # finer units are truncated to milliseconds
            ts = pc.floor_temporal(ts, unit="millisecond").cast(record.TIMESTAMP_TYPE, safe=False)
        else:
            ts = ts.cast(pa.int64()).cast(record.TIMESTAMP_TYPE)
    else:
        now = record.now_ms() if timestamp_ms is None else timestamp_ms
        ts = pa.chunked_array([pa.array(np.full(n, now, dtype=np.int64)).cast(record.TIMESTAMP_TYPE)])
    return pa.table([column("key", pa.binary()), column("value", pa.binary()), ts, column("headers", record.HEADERS_TYPE)],
                    schema=record.BODY_SCHEMA)


class Producer:
    """Synchronous producer: `send()` from any thread; I/O runs on a private background loop.

        with Producer("127.0.0.1:9092", linger_ms=5) as producer:
            future = producer.send("orders", b"value", key=b"customer-7")
            producer.flush()
            print(future.result())          # RecordMetadata(topic, partition, offset, timestamp)

    Settings may also be Kafka's dotted names or one dict (`broker.client.config`):
    `Producer({"bootstrap.servers": "127.0.0.1:9092", "linger.ms": 5})`.
    """

    def __init__(self, bootstrap_servers: BootstrapServers | Mapping[str, Any] | None = None,
                 config: Mapping[str, Any] | None = None, **settings: Any) -> None:
        bootstrap, kwargs = client_settings(AsyncProducer.__init__, bootstrap_servers, config, settings)
        self._thread = LoopThread("pymq-producer")
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
