"""The consumer: assign partitions, seek, and poll records or Arrow tables, with prefetching.

A background fetcher keeps one long-polling Fetch per leader in flight for every assigned
partition whose buffered data is below `max_buffer_bytes`, so the next `poll` usually finds data
already decoded. The next fetch goes out before a reply's records are decoded (its positions come
from the batch headers), so a tailing consumer always has a long poll parked at the broker.
Fetch responses are raw record batches: the consumer checks each batch's CRC (`check_crcs`),
decodes the Arrow body zero-copy, drops rows before the fetch position (a fetch from mid-batch
returns the whole batch) and adds `topic`, `partition`, `offset` and `timestamp_type` columns
with Arrow kernels, never per record in Python.

`poll_arrow()` returns one pyarrow Table (schema `RECORD_SCHEMA`); `poll()` returns
`ConsumerRecord`s built from the same table. An out-of-range position is reset per
`auto_offset_reset` ("earliest", "latest") or raised ("none").

A batch that fails the checks costs nothing that precedes it: every intact record before it
(and other partitions' records) is returned first, `position()` moves to the bad batch, and the
next poll raises `CorruptRecordError` with its topic, partition and offset, so that a
skip-and-continue loop can `seek(offset + 1)` past it.
"""
from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
from collections import deque
from functools import lru_cache, partial
from itertools import repeat
from collections.abc import Mapping
from typing import Any, Iterable, Iterator, NamedTuple

import numpy as np
import pyarrow as pa

from broker import protocol, record
from broker.client.cluster import Cluster
from broker.client.connection import BrokerConnection, Reply, decode_reply
from broker.client.config import BootstrapServers, client_settings
from broker.client.loop_thread import LoopThread
from broker.errors import (
    ConsumerStoppedError,
    CorruptMessageError,
    CorruptRecordError,
    NetworkError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    PymqError,
    RequestTimedOutError,
)
from broker.protocol import FetchPartition, FetchRequest, FetchResponse, FetchTopic, ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic

log = logging.getLogger("pymq.consumer")

TopicPartition = tuple[str, int]
RECORD_SCHEMA = pa.schema([
    pa.field("topic", pa.string(), nullable=False),
    pa.field("partition", pa.int32(), nullable=False),
    pa.field("offset", pa.int64(), nullable=False),
    pa.field("timestamp", record.TIMESTAMP_TYPE, nullable=False),
    pa.field("timestamp_type", pa.int8(), nullable=False),
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("headers", record.HEADERS_TYPE),
])


class ConsumerRecord(NamedTuple):
    """One consumed record. A NamedTuple: built at C speed, a million per second per core."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] | None


def _repeated_string(text: str, n: int) -> pa.StringArray:
    """`text` n times as a string column, built from two buffers (no per-row work)."""
    raw = text.encode()
    offsets = np.arange(n + 1, dtype=np.int32) * len(raw)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(raw * n))


_CONSTANT_ROWS = 1024  # constant columns of batches up to this size are slices of cached arrays


@lru_cache(maxsize=512)
def _constant_columns(topic: str, partition: int, log_append_time: bool) -> tuple[pa.Array, pa.Array, pa.Array]:
    """The topic, partition and timestamp-type columns of a partition's batches, _CONSTANT_ROWS
    long: small batches (the latency-bound case) slice them instead of building three arrays."""
    return _constant_arrays(topic, partition, log_append_time, _CONSTANT_ROWS)


def _constant_arrays(topic: str, partition: int, log_append_time: bool, n: int) -> tuple[pa.Array, pa.Array, pa.Array]:
    return (_repeated_string(topic, n), pa.array(np.full(n, partition, np.int32)),
            pa.array(np.full(n, 1 if log_append_time else 0, np.int8)))


class FetchedBatch(NamedTuple):
    """One fetched batch's records as the consumer buffers them: the decoded body (already
    trimmed to the records not yet consumed) and what turns it into records. Arrow rows of
    RECORD_SCHEMA are built only for poll_arrow (`to_record_batch`); poll() builds its records
    straight from the body's columns."""

    first_offset: int
    body: pa.RecordBatch  # key, value, timestamp, headers (, offset_delta)
    offsets: pa.Array | None  # each record's offset where they have gaps (compacted), else None
    append_time: int  # LogAppendTime: every record's timestamp (the broker's); -1: the body's

    @property
    def num_rows(self) -> int:
        return self.body.num_rows

    @property
    def next_offset(self) -> int:
        """The offset after the last record here."""
        return (self.offsets[-1].as_py() if self.offsets is not None else self.first_offset + self.body.num_rows - 1) + 1

    @classmethod
    def of(cls, header: record.BatchHeader, body: pa.RecordBatch, position: int) -> "FetchedBatch":
        """The records of a decoded batch from offset `position` on (a fetch from mid-batch
        returns the whole batch)."""
        append_time = header.max_timestamp if header.log_append_time else -1
        if body.num_columns == len(record.COMPACTED_BODY_SCHEMA):
            offsets = record.record_offsets(header, body)
            skip = int(np.searchsorted(offsets.to_numpy(), position))
            offsets = offsets.slice(skip)
            return cls(offsets[0].as_py() if len(offsets) else position, body.slice(skip), offsets, append_time)
        skip = max(position - header.base_offset, 0)
        return cls(header.base_offset + skip, body.slice(skip) if skip else body, None, append_time)

    def split(self, n: int) -> tuple["FetchedBatch", "FetchedBatch"]:
        """The first `n` records and the rest."""
        offsets = self.offsets
        rest_first = self.first_offset + n if offsets is None else offsets[n].as_py()
        return (self._replace(body=self.body.slice(0, n), offsets=None if offsets is None else offsets.slice(0, n)),
                self._replace(first_offset=rest_first, body=self.body.slice(n),
                              offsets=None if offsets is None else offsets.slice(n)))


def to_record_batch(topic: str, partition: int, fetched: FetchedBatch) -> pa.RecordBatch:
    """One fetched batch as RECORD_SCHEMA rows."""
    body, n = fetched.body, fetched.body.num_rows
    # LogAppendTime: the broker's append time in the header is every record's timestamp.
    log_append_time = fetched.append_time >= 0
    timestamps = (pa.array(np.full(n, fetched.append_time, np.int64)).cast(record.TIMESTAMP_TYPE)
                  if log_append_time else body.column(2))
    if n <= _CONSTANT_ROWS:
        topics, partitions, types = (column.slice(0, n) for column in _constant_columns(topic, partition, log_append_time))
    else:
        topics, partitions, types = _constant_arrays(topic, partition, log_append_time, n)
    offsets = (fetched.offsets if fetched.offsets is not None
               else pa.array(np.arange(fetched.first_offset, fetched.first_offset + n, dtype=np.int64)))
    return pa.RecordBatch.from_arrays(
        [topics, partitions, offsets, timestamps, types, body.column(0), body.column(1), body.column(3)],
        schema=RECORD_SCHEMA,
    )


class AsyncConsumer:
    """The consumer core; use on one event loop (`Consumer` wraps it for threads)."""

    def __init__(self, bootstrap_servers: str | list[str], *, auto_offset_reset: str = "latest",
                 fetch_max_wait_ms: int = 500, fetch_min_bytes: int = 1, fetch_max_bytes: int = 50 << 20,
                 max_partition_fetch_bytes: int = 8 << 20, max_buffer_bytes: int = 64 << 20,
                 check_crcs: bool = True, request_timeout_ms: int = 30_000, retry_backoff_ms: int = 100) -> None:
        if auto_offset_reset not in ("earliest", "latest", "none"):
            raise ValueError("auto_offset_reset must be 'earliest', 'latest' or 'none'")
        self.auto_offset_reset = auto_offset_reset
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.fetch_min_bytes = fetch_min_bytes
        self.fetch_max_bytes = fetch_max_bytes
        self.max_partition_fetch_bytes = max_partition_fetch_bytes
        self.max_buffer_bytes = max_buffer_bytes
        self.check_crcs = check_crcs
        self.retry_backoff_s = retry_backoff_ms / 1000
        self.request_timeout_s = request_timeout_ms / 1000
        self.cluster = Cluster(bootstrap_servers, request_timeout_ms=request_timeout_ms)
        self._consumed: dict[TopicPartition, int] = {}  # next offset poll returns, per partition
        self._fetch_positions: dict[TopicPartition, int] = {}  # next offset to fetch (ahead by the buffer)
        self.high_watermarks: dict[TopicPartition, int] = {}
        self._assigned: list[TopicPartition] = []
        # (tp, rows, bytes counted), or (tp, the error, 0) where a partition's fetched data turned
        # out corrupt: records before it are delivered first, and the partition fetches nothing
        # more until that error was raised.
        self._buffer: deque[tuple[TopicPartition, FetchedBatch | CorruptRecordError, int]] = deque()
        self._buffered_bytes = 0
        # The buffer, the consumed positions and `_error` are shared with the sync Consumer's
        # application thread, which takes records without a hop through the event loop; `_lock`
        # guards them and `_arrived` wakes such a poller. Async pollers wait on `_data_ready`.
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._data_ready = asyncio.Event()
        self._changed = asyncio.Event()
        self._waiting_for_room = False  # a fetch loop waits for poll to make room in the buffer
        self._error: PymqError | None = None
        self._fetchers: dict[int, asyncio.Task[None]] = {}
        self._epoch = 0  # bumped on every assign/seek: fetched data from an older epoch is dropped
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> "AsyncConsumer":
        self._loop = asyncio.get_running_loop()
        record.warm_up()
        await self.cluster.refresh()
        return self

    # -- assignment and positions ----------------------------------------------------------------

    async def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Consume exactly these partitions; new ones start per auto_offset_reset unless sought."""
        wanted = list(dict.fromkeys((t, int(p)) for t, p in partitions))
        for topic, partition in wanted:
            await self.cluster.leader(topic, partition)  # raises for unknown topics/partitions
        self._assigned = wanted
        self._consumed = {tp: pos for tp, pos in self._consumed.items() if tp in wanted}
        missing = [tp for tp in wanted if tp not in self._consumed]
        if missing and self.auto_offset_reset != "none":  # with "none", seek before poll
            await self._reset(missing, self.auto_offset_reset)
        self._invalidate()

    def assignment(self) -> list[TopicPartition]:
        return list(self._assigned)

    async def seek(self, tp: TopicPartition, offset: int) -> None:
        """Make `offset` the next record `poll` returns for `tp`."""
        self._require_assigned(tp)
        if offset < 0:
            raise OffsetOutOfRangeError(f"offset {offset} is negative")
        self._consumed[tp] = offset
        self._invalidate()

    async def seek_to_beginning(self, *tps: TopicPartition) -> None:
        await self._reset(list(tps) or self._assigned, "earliest")
        self._invalidate()

    async def seek_to_end(self, *tps: TopicPartition) -> None:
        await self._reset(list(tps) or self._assigned, "latest")
        self._invalidate()

    def position(self, tp: TopicPartition) -> int:
        """The offset of the next record `poll` will return for `tp` (not how far prefetch got)."""
        self._require_assigned(tp)
        if tp not in self._consumed:
            raise NoOffsetForPartitionError(f"{tp[0]}-{tp[1]} has no position: seek first (auto_offset_reset=none)")
        return self._consumed[tp]

    async def offsets_for_times(self, timestamps: dict[TopicPartition, int]) -> dict[TopicPartition, tuple[int, int] | None]:
        """For each partition, (offset, timestamp) of the first record at or after the time, or None."""
        found = await self.list_offsets(timestamps)
        return {tp: (off, ts) if off >= 0 else None for tp, (off, ts) in found.items()}

    async def beginning_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: o for tp, (o, _) in (await self.list_offsets({tp: protocol.EARLIEST_TIMESTAMP for tp in tps})).items()}

    async def end_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: o for tp, (o, _) in (await self.list_offsets({tp: protocol.LATEST_TIMESTAMP for tp in tps})).items()}

    async def list_offsets(self, timestamps: dict[TopicPartition, int]) -> dict[TopicPartition, tuple[int, int]]:
        return await list_offsets(self.cluster, timestamps)

    def _require_assigned(self, tp: TopicPartition) -> None:
        if tp not in self._assigned:
            raise ValueError(f"{tp[0]}-{tp[1]} is not assigned to this consumer")

    async def _reset(self, tps: list[TopicPartition], where: str) -> None:
        """Set the consumed positions of `tps` to the log's start or end."""
        for tp in tps:
            self._require_assigned(tp)
        target = protocol.EARLIEST_TIMESTAMP if where == "earliest" else protocol.LATEST_TIMESTAMP
        for tp, (offset, _) in (await self.list_offsets({tp: target for tp in tps})).items():
            self._consumed[tp] = offset

    def _invalidate(self) -> None:
        """Positions changed: drop prefetched data, and restart fetching from the consumed
        positions at once (a parked long poll for the old positions is abandoned)."""
        self._epoch += 1
        with self._lock:
            self._buffer.clear()
            self._buffered_bytes = 0
            self._data_ready.clear()
            self._fetch_positions = dict(self._consumed)
        for task in self._fetchers.values():
            task.cancel()
        self._fetchers = {}
        self._ensure_fetchers()

    # -- polling ---------------------------------------------------------------------------------

    async def poll_arrow(self, timeout_ms: int = 1000, max_records: int | None = None) -> pa.Table:
        """Fetched records as one Arrow table (possibly empty after `timeout_ms`).

        A corrupt batch: the records before it (and other partitions' records) are returned
        first and the partition's position moves to the bad batch; the next call raises
        CorruptRecordError naming topic, partition and offset (a call that has no records to
        return raises it at once). Until the caller seeks, the partition is fetched again and
        raises again."""
        return self._as_table(await self._poll_batches(timeout_ms, max_records))

    async def poll(self, timeout_ms: int = 1000, max_records: int | None = None) -> list[ConsumerRecord]:
        """Like poll_arrow, as ConsumerRecords (built from the batches' columns, no table)."""
        return fetched_to_records(await self._poll_batches(timeout_ms, max_records))

    async def _poll_batches(self, timeout_ms: int, max_records: int | None) -> list[tuple[TopicPartition, FetchedBatch]]:
        """What a poll returns, after waiting up to `timeout_ms` for records when none are buffered."""
        if self._closed:
            raise ConsumerStoppedError("consumer is closed")
        if not self._buffer and self._error is None and timeout_ms > 0:
            try:
                await asyncio.wait_for(self._data_ready.wait(), timeout_ms / 1000)
            except TimeoutError:
                pass
        return self._take_ready(max_records)

    @staticmethod
    def _as_table(taken: list[tuple[TopicPartition, FetchedBatch]]) -> pa.Table:
        return pa.Table.from_batches([to_record_batch(tp[0], tp[1], f) for tp, f in taken], schema=RECORD_SCHEMA)

    def _take_ready(self, max_records: int | None) -> list[tuple[TopicPartition, FetchedBatch]]:
        """What a poll returns now (any thread): a pending error is raised, else the buffered
        records up to `max_records`. Fetchers waiting for room in the buffer are woken."""
        wake = False
        try:
            with self._lock:
                try:
                    if self._error is not None:
                        err, self._error = self._error, None
                        raise err
                    missing = [tp for tp in self._assigned if tp not in self._consumed]
                    if missing:
                        raise NoOffsetForPartitionError(f"no position for {missing}: seek first (auto_offset_reset=none)")
                    batches = self._take(max_records if max_records is not None else float("inf"))
                    if not batches and self._buffer and isinstance(self._buffer[0][1], CorruptRecordError):
                        raise self._corrupt_batch_reached()
                finally:
                    if not self._buffer:
                        self._data_ready.clear()
                    wake, self._waiting_for_room = self._waiting_for_room, False
        finally:
            if wake:
                self._wake_fetchers()
        return batches

    def _wake_fetchers(self) -> None:
        """Set `_changed` on the loop, from whichever thread polled."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            self._changed.set()
        else:
            loop.call_soon_threadsafe(self._changed.set)

    def wait_for_data(self, timeout_s: float) -> None:
        """Block the calling (non-loop) thread until records or an error are buffered, the
        consumer closes, or `timeout_s` passes: the sync Consumer's poll, without a loop hop."""
        deadline = time.monotonic() + timeout_s
        with self._arrived:
            while not self._buffer and self._error is None and not self._closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self._arrived.wait(remaining)

    def _signal(self) -> None:
        """Records or an error arrived (loop thread, `_lock` held): wake pollers of both kinds."""
        self._data_ready.set()
        self._arrived.notify_all()

    def _take(self, limit: float) -> list[tuple[TopicPartition, FetchedBatch]]:
        """Up to `limit` buffered rows, in order. A corrupt-batch marker stays in the buffer (at
        the front once the rows before it are taken) and sets its partition's position."""
        batches: list[tuple[TopicPartition, FetchedBatch]] = []
        kept: list[tuple[TopicPartition, FetchedBatch | CorruptRecordError, int]] = []
        taken = 0
        while self._buffer and taken < limit:
            tp, batch, accounted = self._buffer.popleft()
            if isinstance(batch, CorruptRecordError):
                # Nothing of tp follows it in the buffer: its fetching stopped at the bad batch.
                self._consumed[tp] = batch.offset
                kept.append((tp, batch, accounted))
                continue
            if taken + batch.num_rows > limit:
                keep = int(limit - taken)
                share = accounted * keep // batch.num_rows
                batch, rest = batch.split(keep)
                self._buffer.appendleft((tp, rest, accounted - share))
                accounted = share
            self._buffered_bytes -= accounted
            batches.append((tp, batch))
            taken += batch.num_rows
            self._consumed[tp] = batch.next_offset
        self._buffer.extendleft(reversed(kept))
        return batches

    def _corrupt_batch_reached(self) -> CorruptRecordError:
        """Take the marker at the front (`_lock` held); the partition is fetched again from its
        position, so the error comes back until the caller seeks past the bad batch."""
        tp, err, _ = self._buffer.popleft()
        assert isinstance(err, CorruptRecordError)
        self._fetch_positions[tp] = self._consumed[tp]
        self._waiting_for_room = True  # the partition's fetcher has it back: wake it
        return err

    # -- fetching --------------------------------------------------------------------------------

    def _ensure_fetchers(self) -> None:
        loop = asyncio.get_running_loop()
        for node in {p.leader for t, ps in self.cluster.topics.items() for p in ps if (t, p.partition) in self._assigned}:
            task = self._fetchers.get(node)
            if task is None or task.done():
                self._fetchers[node] = loop.create_task(self._fetch_loop(node))

    async def _fetch_loop(self, node: int) -> None:
        me = asyncio.current_task()
        ahead: _Fetch | None = None  # the next fetch, sent before the last reply was decoded
        try:
            # A loop replaced by _invalidate ends even if its cancellation was lost (asyncio.wait_for
            # can swallow one whose inner future completed at the same moment): two loops fetching
            # one partition would deliver its records twice.
            while not self._closed and self._fetchers.get(node) is me:
                fetch, ahead = ahead, None
                mine: list[TopicPartition] = []
                if fetch is None:
                    self._changed.clear()
                    mine = [tp for tp in self._assigned if tp in self._fetch_positions and self._leader(tp) == node]
                    with self._lock:  # checked and flagged at once: a poll in between would not wake us
                        idle = not mine or self._buffered_bytes >= self.max_buffer_bytes
                        if idle:
                            self._waiting_for_room = True
                    if idle:
                        await self._changed.wait()
                        continue
                try:
                    if fetch is None:
                        conn = await self.cluster.connection(node)
                        fetch = self._send_fetch(conn, {tp: self._fetch_positions[tp] for tp in mine})
                    ahead = await self._complete_fetch(node, fetch)
                except (NetworkError, RequestTimedOutError) as err:
                    log.info("fetch from broker %d failed: %s; retrying", node, err)
                    await asyncio.sleep(self.retry_backoff_s)
                    await self._refresh_quietly()
                except PymqError as err:
                    with self._lock:
                        self._error = err
                        self._waiting_for_room = True
                        self._signal()
                    await self._changed.wait()
        finally:
            if ahead is not None:
                ahead.reply.cancel()

    def _leader(self, tp: TopicPartition) -> int | None:
        parts = self.cluster.topics.get(tp[0])
        return parts[tp[1]].leader if parts and tp[1] < len(parts) else None

    async def _refresh_quietly(self) -> None:
        try:
            await self.cluster.refresh()
        except PymqError as err:
            log.info("metadata refresh failed: %s", err)

    def _send_fetch(self, conn: BrokerConnection, positions: dict[TopicPartition, int]) -> "_Fetch":
        """Write a Fetch for `positions` now (no await between deciding and writing)."""
        by_topic: dict[str, list[FetchPartition]] = {}
        for (topic, partition), offset in positions.items():
            by_topic.setdefault(topic, []).append(FetchPartition(partition, offset, self.max_partition_fetch_bytes))
        request = FetchRequest(tuple(FetchTopic(t, tuple(ps)) for t, ps in by_topic.items()),
                               self.fetch_max_wait_ms, self.fetch_min_bytes, self.fetch_max_bytes)
        reply = conn.request(request, self.request_timeout_s + self.fetch_max_wait_ms / 1000)
        return _Fetch(request, reply, positions, self._epoch)

    async def _complete_fetch(self, node: int, fetch: "_Fetch") -> "_Fetch | None":
        """Buffer one fetch's records; the next fetch if it could be sent ahead of decoding them.

        A partition's data is taken only if the fetch asked for the partition's current fetch
        position: data of an older epoch (a seek or assign since), or following a batch found
        corrupt, starts at a stale offset and is dropped."""
        control, payload = await fetch.reply
        reply = decode_reply(fetch.request, control, payload)
        if fetch.epoch != self._epoch:
            return None
        ahead = self._fetch_ahead(node, fetch, reply)
        try:
            reset: list[TopicPartition] = []
            for t in reply.topics:
                for p in t.partitions:
                    tp = (t.name, p.partition)
                    err = p.error()
                    if err is not None:
                        if isinstance(err, OffsetOutOfRangeError) and self.auto_offset_reset != "none":
                            reset.append(tp)
                            continue
                        if err.retriable:
                            await self._refresh_quietly()
                            continue
                        raise err
                    self.high_watermarks[tp] = p.high_watermark
                    if self._fetch_positions.get(tp) == fetch.requested.get(tp):
                        self._absorb(tp, p.records)  # type: ignore[arg-type]
            if reset:
                await self._reset_fetch_positions({tp: fetch.requested[tp] for tp in reset}, fetch.epoch)
        except BaseException:
            if ahead is not None:
                ahead.reply.cancel()
            raise
        if ahead is not None and any(self._fetch_positions.get(tp) != at for tp, at in ahead.requested.items()):
            ahead.reply.cancel()  # decoding stopped short of where the headers said (a corrupt batch)
            return None
        return ahead

    def _fetch_ahead(self, node: int, fetch: "_Fetch", reply: FetchResponse) -> "_Fetch | None":
        """Send the next fetch before this reply's records are decoded, from the positions its
        complete batches move each partition to (read from the batch headers alone).

        The broker then holds the next long poll while this reply is decoded, and the I/O thread
        has nothing left to do once it hands the records to the sync Consumer's poll(): that
        thread waits for the GIL, which it gets only when this one goes idle. Only the plain
        case goes ahead: every partition answered without error and the buffer has room for
        what this reply brings; anything else waits for the reply to be handled first."""
        conn = self.cluster.open_connection(node)
        if conn is None or any(self._fetch_positions.get(tp) != at for tp, at in fetch.requested.items()):
            return None
        positions = dict(fetch.requested)
        incoming = 0
        try:
            for t in reply.topics:
                for p in t.partitions:
                    tp = (t.name, p.partition)
                    if p.error_code or tp not in positions:
                        return None
                    for _, header in record.iter_batches(p.records, verify=False):
                        positions[tp] = max(positions[tp], header.next_offset)
                    incoming += len(p.records)
        except CorruptMessageError:
            return None  # _absorb finds and reports it
        if self._buffered_bytes + incoming >= self.max_buffer_bytes:
            return None
        return self._send_fetch(conn, positions)

    async def _reset_fetch_positions(self, out_of_range: dict[TopicPartition, int], epoch: int) -> None:
        """Out of range (e.g. retention passed us): jump per auto_offset_reset. The consumed
        position follows unless records before the jump are still buffered for poll. Nothing
        moves if the position changed meanwhile (a seek, or another answer already applied)."""
        log.warning("offsets out of range for %s; resetting to %s", list(out_of_range), self.auto_offset_reset)
        target = protocol.EARLIEST_TIMESTAMP if self.auto_offset_reset == "earliest" else protocol.LATEST_TIMESTAMP
        found = await self.list_offsets({tp: target for tp in out_of_range})
        if epoch != self._epoch:
            return
        with self._lock:
            buffered = {tp for tp, _, _ in self._buffer}
            for tp, (offset, _) in found.items():
                if self._fetch_positions.get(tp) != out_of_range[tp]:
                    continue
                self._fetch_positions[tp] = offset
                if tp not in buffered:
                    self._consumed[tp] = offset

    def _absorb(self, tp: TopicPartition, data: memoryview) -> None:
        """Decode the complete batches of one partition's fetched bytes into the buffer. At a
        corrupt batch, what came before it stays buffered, a marker for it follows, and the
        partition fetches nothing more until the marker was raised (or the caller seeks).
        Decoding happens outside `_lock`; the buffer is extended under it in one step."""
        decoded = decode_fetched(tp, data, self._fetch_positions[tp], self.high_watermarks.get(tp, -1), self.check_crcs)
        fresh: list[tuple[TopicPartition, FetchedBatch | CorruptRecordError, int]] = [
            (tp, batch, size) for batch, size in decoded.batches]
        fresh_bytes = sum(size for _, size in decoded.batches)
        corrupt, position = decoded.corrupt, decoded.position
        if corrupt is not None:
            log.warning("corrupt batch: %s", corrupt)
            fresh.append((tp, corrupt, 0))
        if not fresh:
            return
        with self._lock:
            self._buffer.extend(fresh)
            self._buffered_bytes += fresh_bytes
            if corrupt is not None:
                del self._fetch_positions[tp]
            else:
                self._fetch_positions[tp] = position
            self._signal()

    async def close(self) -> None:
        self._closed = True
        self._changed.set()
        with self._lock:
            self._arrived.notify_all()
        for task in self._fetchers.values():
            task.cancel()
        await asyncio.gather(*self._fetchers.values(), return_exceptions=True)
        await self.cluster.close()


class _Fetch(NamedTuple):
    """A Fetch in flight: the request, its raw reply, the positions it asked for, and the
    epoch (of assign/seek) it was sent in."""

    request: FetchRequest
    reply: asyncio.Future[Reply]
    requested: dict[TopicPartition, int]
    epoch: int


def corrupt_batch_offset(data: memoryview, at: int, position: int, high_watermark: int) -> int:
    """The offset a corrupt batch at byte `at` stands for: the consumer's position there, or the
    batch's own base offset when that lies beyond it (a compaction gap) and below the high
    watermark. The base offset is outside the CRC, so only a plausible one is believed."""
    if len(data) - at < record.HEADER_SIZE:
        return position
    base = record.read_header(data, at).base_offset
    return base if position < base < high_watermark else position


class DecodedFetch(NamedTuple):
    batches: list[tuple[FetchedBatch, int]]  # each with its wire size (what the fetch cost)
    position: int  # the offset after the last complete batch decoded
    corrupt: CorruptRecordError | None  # the batch decoding stopped at, if one failed its checks


def decode_fetched(tp: TopicPartition, data: memoryview | bytes, position: int, high_watermark: int,
                   verify: bool) -> DecodedFetch:
    """The complete batches of one partition's fetched bytes from `position` on (a fetch from
    mid-batch returns the whole batch; records before `position` are dropped). Decoding stops at
    a batch that fails its checks: what came before it is kept and `corrupt` names topic,
    partition and offset. The consumer and the range reader both read fetches through this."""
    data = memoryview(data)
    batches: list[tuple[FetchedBatch, int]] = []
    bad_at = 0  # where the next batch starts: the corrupt one, if iter_batches raises
    try:
        # decode_body checks each body fully: the CRC and header checks are what is left.
        for pos, header in record.iter_batches(data, verify=verify, check_body=False):
            bad_at = pos + header.size
            if header.next_offset <= position:
                continue
            batches.append((FetchedBatch.of(header, record.decode_body(data, header, pos), position), header.size))
            position = header.next_offset
    except CorruptMessageError as err:
        offset = corrupt_batch_offset(data, bad_at, position, high_watermark)
        corrupt = CorruptRecordError(f"{tp[0]}-{tp[1]} offset {offset}: {err}", tp[0], tp[1], offset)
        return DecodedFetch(batches, position, corrupt)
    return DecodedFetch(batches, position, None)


async def list_offsets(cluster: Cluster, timestamps: dict[TopicPartition, int]) -> dict[TopicPartition, tuple[int, int]]:
    """ListOffsets for many partitions, one request per leader; raises the first partition error."""
    by_node: dict[int, dict[str, list[ListOffsetsPartition]]] = {}
    for (topic, partition), ts in timestamps.items():
        node = await cluster.leader(topic, partition)
        by_node.setdefault(node, {}).setdefault(topic, []).append(ListOffsetsPartition(partition, ts))
    out: dict[TopicPartition, tuple[int, int]] = {}
    for node, topics in by_node.items():
        reply = await cluster.send(node, ListOffsetsRequest(tuple(ListOffsetsTopic(t, tuple(ps)) for t, ps in topics.items())))
        for t in reply.topics:
            for p in t.partitions:
                err = p.error()
                if err is not None:
                    raise err
                out[(t.name, p.partition)] = (p.offset, p.timestamp)
    return out


# tuple.__new__ straight from C: NamedTuple._make would add a Python call per record.
_new_record = partial(tuple.__new__, ConsumerRecord)


def fetched_to_records(taken: list[tuple[TopicPartition, FetchedBatch]]) -> list[ConsumerRecord]:
    """Taken batches as ConsumerRecords, built from the bodies' columns: topic, partition and
    timestamp type repeated, offsets counted, never materialized as Arrow columns first."""
    out: list[ConsumerRecord] = []
    # Building a million tuples would trigger the cyclic GC thousands of times, each pass
    # scanning every live record so far: records hold no cycles, so pause it while building.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for (topic, partition), fetched in taken:
            body, n = fetched.body, fetched.body.num_rows
            if not n:
                continue
            offsets: Iterable[int] = (range(fetched.first_offset, fetched.first_offset + n) if fetched.offsets is None
                                      else fetched.offsets.to_numpy().tolist())
            if fetched.append_time >= 0:
                timestamps: Iterable[int] = repeat(fetched.append_time, n)
            else:
                timestamps = body.column(2).to_numpy().view(np.int64).tolist()  # datetime64[ms], zero-copy
            out.extend(map(_new_record, zip(
                repeat(topic, n), repeat(partition, n), offsets, timestamps, repeat(1 if fetched.append_time >= 0 else 0, n),
                body.column(0).to_pylist(), body.column(1).to_pylist(), _header_values(body.column(3), n),
            )))
    finally:
        if gc_was_enabled:
            gc.enable()
    return out


def _header_values(headers: pa.Array, n: int) -> Iterable[Any]:
    if headers.null_count == n:
        return repeat(None, n)
    return [None if h is None else [(e["key"], e["value"]) for e in h] for h in headers.to_pylist()]


class Consumer:
    """Synchronous consumer over a private background loop.

        consumer = Consumer("127.0.0.1:9092", auto_offset_reset="earliest")
        consumer.assign([("orders", 0), ("orders", 1)])
        table = consumer.poll_arrow(timeout_ms=500)   # pyarrow.Table, RECORD_SCHEMA
        for record in consumer:                       # ConsumerRecord, as they arrive
            ...

    Settings may also be Kafka's dotted names or one dict (`broker.client.config`):
    `Consumer({"bootstrap.servers": "127.0.0.1:9092", "auto.offset.reset": "earliest"})`.
    """

    def __init__(self, bootstrap_servers: BootstrapServers | Mapping[str, Any] | None = None,
                 config: Mapping[str, Any] | None = None, **settings: Any) -> None:
        bootstrap, kwargs = client_settings(AsyncConsumer.__init__, bootstrap_servers, config, settings)
        self._thread = LoopThread("pymq-consumer")
        try:
            self._core: AsyncConsumer = self._thread.run(AsyncConsumer(bootstrap, **kwargs).start())
        except BaseException:
            self._thread.stop()
            raise

    def _run(self, coro: Any) -> Any:
        return self._thread.run(coro)

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        self._run(self._core.assign(list(partitions)))

    def assignment(self) -> list[TopicPartition]:
        return self._core.assignment()

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._run(self._core.seek(tp, offset))

    def seek_to_beginning(self, *tps: TopicPartition) -> None:
        self._run(self._core.seek_to_beginning(*tps))

    def seek_to_end(self, *tps: TopicPartition) -> None:
        self._run(self._core.seek_to_end(*tps))

    def position(self, tp: TopicPartition) -> int:
        return self._core.position(tp)

    def offsets_for_times(self, timestamps: dict[TopicPartition, int]) -> dict[TopicPartition, tuple[int, int] | None]:
        return self._run(self._core.offsets_for_times(timestamps))

    def beginning_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self._run(self._core.beginning_offsets(list(tps)))

    def end_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self._run(self._core.end_offsets(list(tps)))

    def poll_arrow(self, timeout_ms: int = 1000, max_records: int | None = None) -> pa.Table:
        """See AsyncConsumer.poll_arrow. Runs on the calling thread: it waits for the background
        fetcher's data directly, so a record costs no hop through the event loop to be returned."""
        return self._core._as_table(self._poll_batches(timeout_ms, max_records))

    def poll(self, timeout_ms: int = 1000, max_records: int | None = None) -> list[ConsumerRecord]:
        """See AsyncConsumer.poll; on the calling thread, like poll_arrow."""
        return fetched_to_records(self._poll_batches(timeout_ms, max_records))

    def _poll_batches(self, timeout_ms: int, max_records: int | None) -> list[tuple[TopicPartition, FetchedBatch]]:
        core = self._core
        if core._closed:
            raise ConsumerStoppedError("consumer is closed")
        if timeout_ms > 0:
            core.wait_for_data(timeout_ms / 1000)
        return core._take_ready(max_records)

    def records(self, idle_timeout_ms: int | None = None) -> Iterator[ConsumerRecord]:
        """Every record of the assigned partitions as it arrives, for `for record in ...` loops.
        Runs until the consumer is closed, or until no record arrived for `idle_timeout_ms` (None:
        forever, as `for record in consumer` does). Errors (e.g. CorruptRecordError) are raised
        from the loop after every record before them was yielded; seek past and iterate again."""
        idle_since = time.monotonic()
        while not self._core._closed:
            batch = self.poll(timeout_ms=200 if idle_timeout_ms is None else min(200, idle_timeout_ms))
            if batch:
                yield from batch
                idle_since = time.monotonic()
            elif idle_timeout_ms is not None and (time.monotonic() - idle_since) * 1000 >= idle_timeout_ms:
                return

    def __iter__(self) -> Iterator[ConsumerRecord]:
        return self.records()

    def close(self) -> None:
        """Stop fetching and release everything; calling it again does nothing."""
        if self._core._closed:
            return
        try:
            self._run(self._core.close())
        finally:
            self._thread.stop()

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
