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
skip-and-continue loop can `seek(offset + 1)` past it. A broker's non-retriable error for a
partition (e.g. CORRUPT_MESSAGE from a damaged log) is delivered the same way, as Kafka's
fetcher does: after the partition's records fetched before it, while the other partitions go on.

Consumer groups. With `group_id`, `subscribe(topics)` (or `pattern=`) lets the group's
coordinator share the topics' partitions among its members (`broker.client.consumer_coordinator`
keeps the membership: join, sync, background heartbeats); `assign()` instead reads fixed
partitions and still commits to the group. The two are mutually exclusive. A newly assigned
partition starts at the group's committed offset, else per `auto_offset_reset`. A position is
always the next record to consume, and so is a committed offset.

  - Rebalances happen inside `poll`: eager assignors (range, roundrobin) revoke everything before
    rejoining; when every assignor is cooperative (cooperative-sticky) the consumer keeps its
    partitions, consumes them during the rebalance, and revokes only those that move (then
    rejoins at once, so the follow-up rebalance can place them). Callbacks `on_revoke`,
    `on_assign` and `on_lost` get a sorted list of partitions and run on the application's
    thread inside `poll` (and `unsubscribe`/`close`), never on the I/O thread, so they may call
    the consumer (seek, commit, position). An AsyncConsumer's callbacks may be coroutine
    functions. `on_lost` (default: `on_revoke`) means the partitions are already someone else's:
    the session expired, the member was fenced, or it left after `max_poll_interval_ms`; a commit
    for them would be refused. Under the cooperative protocol `on_revoke` runs after the new
    generation began; the broker still accepts commits of the revoked partitions then, because
    nobody owns them until the follow-up rebalance.
  - Heartbeats run on the consumer's event loop, independent of the application: a sync
    Consumer keeps its membership however slow the processing between polls, up to
    `max_poll_interval_ms`; past that it leaves the group and rejoins at its next poll. An
    AsyncConsumer heartbeats on its caller's loop: a step that blocks that loop for longer than
    `session_timeout_ms` loses the membership.
  - Static membership (`group_instance_id`): `close()` does not leave the group, so a restart
    within `session_timeout_ms` gets the same partitions back without a rebalance.

Delivery semantics:
  - at least once (the default): `enable_auto_commit` commits the positions of records `poll`
    returned only at a later poll (every `auto_commit_interval_ms`), before a rebalance revokes
    partitions and at `close()`; so a record is committed only after the application came back
    for more, and records returned but not processed before a crash are delivered again;
  - at most once: `enable_auto_commit=False` and `commit()` right after `poll`, before processing;
  - exactly once: through transactions (not yet).
`commit()` commits the current positions (or the offsets given) and waits; `commit_async()` does
not wait, never retries (a retry could land after a later commit and move the offset back) and
hands its outcome to a callback at the next poll. A `seek` is explicit: what was sought is what
the next commit commits.

Thread safety: one application thread polls a Consumer (as in Kafka); its other methods may be
called from that thread, including from inside the callbacks.
"""
from __future__ import annotations

import asyncio
import gc
import inspect
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping, Sequence
from functools import lru_cache, partial
from itertools import repeat
from typing import Any, Iterable, Iterator, NamedTuple, TypeVar

import numpy as np
import pyarrow as pa

from broker import protocol
from segment_format import record
from broker.client.assignors import ASSIGNORS, DEFAULT_ASSIGNORS, revocations
from broker.client.cluster import Cluster
from broker.client.config import BootstrapServers, as_bool, assignor_names, client_settings
from broker.client.connection import BrokerConnection, Reply, decode_reply
from broker.client.consumer_coordinator import (
    CommitCallback,
    ConsumerCoordinator,
    GroupMetadata,
    LostEvent,
)
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
from broker.protocol import FetchPartition, FetchRequest, FetchResponse, ListOffsetsPartition, ListOffsetsRequest, TopicRequest

log = logging.getLogger("pymq.consumer")

TopicPartition = tuple[str, int]
T = TypeVar("T")
# Work the application's thread drives: it runs the generator (and so the rebalance callbacks)
# itself and hands every coroutine the generator yields to the consumer's loop.
Steps = Generator[Coroutine[Any, Any, Any], Any, T]
RebalanceCallback = Callable[[list[TopicPartition]], Any]
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


async def _awaited(awaitable: Awaitable[T]) -> T:
    return await awaitable


async def run_steps_async(steps: Steps[T]) -> T:
    """Drive `steps` on the current loop (the AsyncConsumer: the application's coroutine)."""
    value: Any = None
    error: Exception | None = None
    while True:
        try:
            step = steps.send(value) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value
        value, error = None, None
        try:
            value = await step
        except Exception as err:  # handed back to the generator, which decides
            error = err


def run_steps(thread: LoopThread, steps: Steps[T]) -> T:
    """Drive `steps` from the application's thread, each yielded coroutine on the loop thread."""
    value: Any = None
    error: Exception | None = None
    while True:
        try:
            step = steps.send(value) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value
        value, error = None, None
        try:
            value = thread.run(step)
        except Exception as err:  # handed back to the generator, which decides
            error = err


class AsyncConsumer:
    """The consumer core; use on one event loop (`Consumer` wraps it for threads).

    Group settings (Kafka's names and defaults): `group_id` (None: no group; `subscribe` and
    `commit` need one), `group_instance_id` (static membership), `session_timeout_ms`,
    `heartbeat_interval_ms` (below the session timeout), `max_poll_interval_ms` (also the
    rebalance timeout the coordinator waits for members to rejoin), `partition_assignment_strategy`
    (assignor names in preference order, or Kafka's class names), `enable_auto_commit` (default:
    True with a group), `auto_commit_interval_ms`, `metadata_max_age_ms` (how often a pattern
    subscription looks for new topics), `client_id`."""

    def __init__(self, bootstrap_servers: str | list[str], *, auto_offset_reset: str = "latest",
                 fetch_max_wait_ms: int = 500, fetch_min_bytes: int = 1, fetch_max_bytes: int = 50 << 20,
                 max_partition_fetch_bytes: int = 8 << 20, max_buffer_bytes: int = 64 << 20,
                 check_crcs: bool = True, request_timeout_ms: int = 30_000, retry_backoff_ms: int = 100,
                 group_id: str | None = None, group_instance_id: str | None = None, client_id: str = "pymq-consumer",
                 session_timeout_ms: int = 45_000, heartbeat_interval_ms: int = 3_000,
                 max_poll_interval_ms: int = 300_000,
                 partition_assignment_strategy: str | Sequence[str] = DEFAULT_ASSIGNORS,
                 enable_auto_commit: bool | str | None = None, auto_commit_interval_ms: int = 5_000,
                 metadata_max_age_ms: int = 300_000) -> None:
        if auto_offset_reset not in ("earliest", "latest", "none"):
            raise ValueError("auto_offset_reset must be 'earliest', 'latest' or 'none'")
        if group_id is not None and not group_id:
            raise ValueError("group_id must not be empty (None: no group)")
        if group_id is None and group_instance_id is not None:
            raise ValueError("group_instance_id needs a group_id")
        auto_commit = group_id is not None if enable_auto_commit is None else as_bool("enable.auto.commit", enable_auto_commit)
        if auto_commit and group_id is None:
            raise ValueError("enable_auto_commit needs a group_id: offsets are committed to a group")
        if not 0 < heartbeat_interval_ms < session_timeout_ms:
            raise ValueError(f"heartbeat_interval_ms ({heartbeat_interval_ms}) must be positive and below "
                             f"session_timeout_ms ({session_timeout_ms})")
        for name, value in (("max_poll_interval_ms", max_poll_interval_ms), ("auto_commit_interval_ms",
                            auto_commit_interval_ms), ("metadata_max_age_ms", metadata_max_age_ms)):
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        strategies = assignor_names(partition_assignment_strategy, ASSIGNORS)
        self.auto_offset_reset = auto_offset_reset
        self.enable_auto_commit = auto_commit
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
        # out corrupt or its broker answered a non-retriable error: records before it are
        # delivered first, and the partition fetches nothing more until that error was raised.
        self._buffer: deque[tuple[TopicPartition, FetchedBatch | PymqError, int]] = deque()
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
        # Bumped whenever the partitions to fetch change without an epoch (group assignment, pause,
        # resume, new start positions): a fetch sent ahead keeps its partitions, so one planned
        # before the change is not sent and the loop plans again.
        self._plan = 0
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._paused: set[TopicPartition] = set()
        # Group-assigned partitions whose committed offset is still to be looked up (`_lock`).
        self._needs_position: set[TopicPartition] = set()
        self._manual = False  # assign() was called with partitions: subscribe() must not be
        # Set (under `_lock`) when the group needs the poller's attention: it stops waiting for records.
        self._attention = False
        self._on_assign: RebalanceCallback | None = None
        self._on_revoke: RebalanceCallback | None = None
        self._on_lost: RebalanceCallback | None = None
        self._coordinator: ConsumerCoordinator | None = None
        if group_id is not None:
            self._coordinator = ConsumerCoordinator(
                self.cluster, group_id, group_instance_id=group_instance_id, client_id=client_id,
                session_timeout_ms=session_timeout_ms, heartbeat_interval_ms=heartbeat_interval_ms,
                max_poll_interval_ms=max_poll_interval_ms, assignors=strategies, request_timeout_ms=request_timeout_ms,
                retry_backoff_ms=retry_backoff_ms, metadata_max_age_ms=metadata_max_age_ms,
                auto_commit_interval_ms=auto_commit_interval_ms, on_lost=self._partitions_lost, wake=self._wake_poller)

    async def start(self) -> "AsyncConsumer":
        self._loop = asyncio.get_running_loop()
        record.warm_up()
        await self.cluster.refresh()
        return self

    # -- assignment and positions ----------------------------------------------------------------

    async def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Consume exactly these partitions (no group rebalancing; `assign([])` stops). New ones
        start at the group's committed offset (with a group_id), else per auto_offset_reset,
        unless sought. Raises ValueError while subscribed."""
        if self._coordinator is not None and self._coordinator.subscribed:
            raise ValueError("assign() and subscribe() are mutually exclusive: this consumer is subscribed; "
                             "call unsubscribe() first")
        wanted = list(dict.fromkeys((t, int(p)) for t, p in partitions))
        for topic, partition in wanted:
            await self.cluster.leader(topic, partition)  # raises for unknown topics/partitions
        self._manual = bool(wanted)
        self._set_assigned(wanted, needs_position=False)
        await self._init_positions([tp for tp in wanted if tp not in self._consumed])
        self._invalidate()

    def assignment(self) -> list[TopicPartition]:
        """The partitions this consumer reads now (assigned by hand or by its group)."""
        return list(self._assigned)

    async def seek(self, tp: TopicPartition, offset: int) -> None:
        """Make `offset` the next record `poll` returns for `tp`."""
        self._require_assigned(tp)
        if offset < 0:
            raise OffsetOutOfRangeError(f"offset {offset} is negative")
        with self._lock:
            self._consumed[tp] = offset
            self._needs_position.discard(tp)
        self._invalidate()

    async def pause(self, *tps: TopicPartition) -> None:
        """Stop fetching these partitions and returning their records (they stay assigned, and
        in the group, and keep their positions) until `resume`. Buffered records of them are
        dropped and fetched again after resume."""
        for tp in tps:
            self._require_assigned(tp)
        with self._lock:
            self._paused.update(tps)
            self._drop_buffered(set(tps))
            for tp in tps:
                if tp in self._consumed:
                    self._fetch_positions[tp] = self._consumed[tp]
        self._replan()

    async def resume(self, *tps: TopicPartition) -> None:
        """Fetch and return these paused partitions again."""
        self._paused.difference_update(tps)
        self._ensure_fetchers()
        self._replan()

    def _replan(self) -> None:
        """The partitions to fetch changed (loop): fetch loops plan their next fetch afresh."""
        self._plan += 1
        self._changed.set()

    def paused(self) -> list[TopicPartition]:
        return sorted(self._paused)

    async def seek_to_beginning(self, *tps: TopicPartition) -> None:
        await self._reset(list(tps) or self._assigned, "earliest")
        self._invalidate()

    async def seek_to_end(self, *tps: TopicPartition) -> None:
        await self._reset(list(tps) or self._assigned, "latest")
        self._invalidate()

    def position(self, tp: TopicPartition) -> int:
        """The offset of the next record `poll` will return for `tp` (not how far prefetch got).
        A partition the group just assigned gets its position (its committed offset) during the
        poll that assigned it, after on_assign: asked before that, this raises (the sync
        Consumer's `position` looks it up instead)."""
        self._require_assigned(tp)
        if tp in self._needs_position:
            raise NoOffsetForPartitionError(f"{tp[0]}-{tp[1]} has no position yet: its committed offset is looked "
                                            "up after on_assign (seek there to choose one)")
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
        found = await self.list_offsets({tp: target for tp in tps})
        with self._lock:
            for tp, (offset, _) in found.items():
                self._consumed[tp] = offset
                self._needs_position.discard(tp)

    def _set_assigned(self, partitions: list[TopicPartition], *, needs_position: bool) -> None:
        """Make `partitions` the assignment (loop): partitions that go lose their positions and
        buffered records at once (no poll returns a record of a partition it no longer has); those
        that stay keep theirs. With `needs_position`, new partitions wait for their committed
        offset (`_init_positions`), and no poll complains about them meanwhile."""
        keep = set(partitions)
        removed = {tp for tp in self._assigned if tp not in keep}
        with self._lock:
            self._assigned = list(partitions)
            self._drop_buffered(removed)
            for tp in removed:
                self._consumed.pop(tp, None)
                self._fetch_positions.pop(tp, None)
            self._paused &= keep
            self._needs_position &= keep
            if needs_position:
                self._needs_position.update(tp for tp in partitions if tp not in self._consumed)
        if self._coordinator is not None and self._coordinator.subscribed:
            self._coordinator.owned = frozenset(partitions)
        self._replan()

    def _drop_buffered(self, tps: set[TopicPartition]) -> None:
        """Forget the buffered records (and error markers) of `tps` (`_lock` held)."""
        if not tps or not self._buffer:
            return
        kept = [entry for entry in self._buffer if entry[0] not in tps]
        self._buffered_bytes -= sum(entry[2] for entry in self._buffer if entry[0] in tps)
        self._buffer.clear()
        self._buffer.extend(kept)
        if not kept:
            self._data_ready.clear()

    async def _init_positions(self, tps: list[TopicPartition]) -> None:
        """Start positions for assigned partitions without one: the group's committed offset,
        else per auto_offset_reset; with "none", none (poll raises NoOffsetForPartitionError
        until a seek). A position set meanwhile (a seek inside on_assign) wins."""
        assigned = set(self._assigned)
        wanted = [tp for tp in tps if tp in assigned and tp not in self._consumed]
        found: dict[TopicPartition, int] = {}
        if wanted:
            for topic in sorted({t for t, _ in wanted}):
                await self.cluster.partitions(topic)  # the fetchers need the leaders
            if self._coordinator is not None:
                committed = await self._coordinator.fetch_committed(wanted)
                found = {tp: offset for tp, offset in committed.items() if offset is not None}
            rest = [tp for tp in wanted if tp not in found]
            if rest and self.auto_offset_reset != "none":
                target = protocol.EARLIEST_TIMESTAMP if self.auto_offset_reset == "earliest" else protocol.LATEST_TIMESTAMP
                found.update({tp: offset for tp, (offset, _) in (await self.list_offsets({tp: target for tp in rest})).items()})
        assigned = set(self._assigned)
        with self._lock:
            for tp, offset in found.items():
                if tp in assigned and tp not in self._consumed:
                    self._consumed[tp] = offset
                    self._fetch_positions[tp] = offset
            self._needs_position.difference_update(tps)
        self._ensure_fetchers()
        self._replan()

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
        """What a poll returns, after waiting up to `timeout_ms` for records when none are buffered.
        In a group, the poll first does the group's work (see `_group_steps`)."""
        if self._closed:
            raise ConsumerStoppedError("consumer is closed")
        group = self._coordinator
        if group is None:
            if not self._buffer and self._error is None and timeout_ms > 0:
                try:
                    await asyncio.wait_for(self._data_ready.wait(), timeout_ms / 1000)
                except TimeoutError:
                    pass
            return self._take_ready(max_records)
        deadline = time.monotonic() + timeout_ms / 1000
        group.note_poll_start()
        try:
            while True:
                await run_steps_async(self._group_steps(deadline))
                batches = self._take_ready(max_records)
                remaining = deadline - time.monotonic()
                if batches or remaining <= 0 or max_records == 0:
                    return batches
                if not self._attention:
                    try:
                        await asyncio.wait_for(self._data_ready.wait(), remaining)
                    except TimeoutError:
                        pass
        finally:
            group.note_poll_end()

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
                    missing = [tp for tp in self._assigned if tp not in self._consumed and tp not in self._needs_position]
                    if missing:
                        raise NoOffsetForPartitionError(f"no position for {missing}: seek first (auto_offset_reset=none)")
                    batches = self._take(max_records if max_records is not None else float("inf"))
                    if not batches and self._buffer and isinstance(self._buffer[0][1], PymqError):
                        raise self._partition_error_reached()
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
        consumer closes, the group needs the poller, or `timeout_s` passes: the sync Consumer's
        poll, without a loop hop."""
        deadline = time.monotonic() + timeout_s
        with self._arrived:
            while not self._buffer and self._error is None and not self._closed and not self._attention:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self._arrived.wait(remaining)

    def _signal(self) -> None:
        """Records or an error arrived (loop thread, `_lock` held): wake pollers of both kinds."""
        self._data_ready.set()
        self._arrived.notify_all()

    def _take(self, limit: float) -> list[tuple[TopicPartition, FetchedBatch]]:
        """Up to `limit` buffered rows, in order. An error marker stays in the buffer (at the
        front once the rows before it are taken); a corrupt batch's sets its partition's position."""
        batches: list[tuple[TopicPartition, FetchedBatch]] = []
        kept: list[tuple[TopicPartition, FetchedBatch | PymqError, int]] = []
        taken = 0
        while self._buffer and taken < limit:
            tp, batch, accounted = self._buffer.popleft()
            if isinstance(batch, PymqError):
                # Nothing of tp follows it in the buffer: its fetching stopped there.
                if isinstance(batch, CorruptRecordError):
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

    def _partition_error_reached(self) -> PymqError:
        """Take the error marker at the front (`_lock` held); the partition is fetched again from
        its position, so the error comes back until the caller seeks past it (or it clears)."""
        tp, err, _ = self._buffer.popleft()
        assert isinstance(err, PymqError)
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
                    mine = [tp for tp in self._assigned if tp in self._fetch_positions and tp not in self._paused
                            and self._leader(tp) == node]
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
        request = FetchRequest(tuple(TopicRequest(t, tuple(ps)) for t, ps in by_topic.items()),
                               self.fetch_max_wait_ms, self.fetch_min_bytes, self.fetch_max_bytes)
        reply = conn.request(request, self.request_timeout_s + self.fetch_max_wait_ms / 1000)
        return _Fetch(request, reply, positions, self._epoch, self._plan)

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
                        if self._fetch_positions.get(tp) == fetch.requested.get(tp):
                            self._hold_error(tp, err)
                        continue
                    self.high_watermarks[tp] = p.high_watermark
                    if self._fetch_positions.get(tp) == fetch.requested.get(tp) and tp not in self._paused:
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
        if conn is None or fetch.plan != self._plan or any(self._fetch_positions.get(tp) != at
                                                           for tp, at in fetch.requested.items()):
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

    def _hold_error(self, tp: TopicPartition, err: PymqError) -> None:
        """A broker's non-retriable error for `tp`: a marker after its buffered records, raised
        by the poll that reaches it; the partition fetches nothing more until then."""
        log.warning("fetch of %s-%d failed: %s", tp[0], tp[1], err)
        with self._lock:
            self._buffer.append((tp, err, 0))
            del self._fetch_positions[tp]
            self._signal()

    def _absorb(self, tp: TopicPartition, data: memoryview) -> None:
        """Decode the complete batches of one partition's fetched bytes into the buffer. At a
        corrupt batch, what came before it stays buffered, a marker for it follows, and the
        partition fetches nothing more until the marker was raised (or the caller seeks).
        Decoding happens outside `_lock`; the buffer is extended under it in one step."""
        decoded = decode_fetched(tp, data, self._fetch_positions[tp], self.high_watermarks.get(tp, -1), self.check_crcs)
        fresh: list[tuple[TopicPartition, FetchedBatch | PymqError, int]] = [
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
        """Leave the group as `unsubscribe` does (commit if auto-commit, on_revoke, LeaveGroup
        unless static), then stop fetching and release everything; calling it again does nothing."""
        if self._closed:
            return
        try:
            await run_steps_async(self._leave_steps("the consumer is closing"))
        finally:
            await self._shutdown()

    async def _shutdown(self) -> None:
        self._closed = True
        self._changed.set()
        with self._lock:
            self._arrived.notify_all()
        for task in self._fetchers.values():
            task.cancel()
        await asyncio.gather(*self._fetchers.values(), return_exceptions=True)
        if self._coordinator is not None:
            await self._coordinator.close()
        await self.cluster.close()

    # -- group membership ------------------------------------------------------------------------
    #
    # The poll runs `_group_steps` on the application's thread (Kafka's ConsumerCoordinator.poll):
    # events the background task queued, auto-commit, and a rebalance (onJoinPrepare, the join
    # round on the loop, onJoinComplete). Callbacks run in the generator, the loop work in the
    # coroutines it yields; `run_steps` / `run_steps_async` drive it.

    def _group(self) -> ConsumerCoordinator:
        if self._coordinator is None:
            raise ValueError("this needs a consumer group: create the consumer with group_id")
        return self._coordinator

    async def subscribe(self, topics: list[str] | None = None, pattern: str | None = None,
                        on_assign: RebalanceCallback | None = None, on_revoke: RebalanceCallback | None = None,
                        on_lost: RebalanceCallback | None = None) -> None:
        """Let the group assign partitions of `topics` (or of every topic whose whole name
        matches the regular expression `pattern`, checked every metadata_max_age_ms). Nothing
        happens until the next poll, which joins. Calling it again replaces the subscription and
        the callbacks (a changed subscription rejoins). See the module docstring for the
        callbacks. Raises ValueError without a group_id, for a bad pattern, or after assign()."""
        group = self._group()
        if (topics is None) == (pattern is None):
            raise ValueError("subscribe to either a list of topics or a pattern")
        if isinstance(topics, str):
            raise ValueError(f"topics must be a list of topic names, got the string {topics!r}")
        if self._manual:
            raise ValueError("assign() and subscribe() are mutually exclusive: this consumer has assigned "
                             "partitions; call unsubscribe() (or assign([])) first")
        try:
            compiled = re.compile(pattern) if pattern is not None else None
        except re.error as err:
            raise ValueError(f"bad subscription pattern {pattern!r}: {err}") from err
        self._on_assign, self._on_revoke, self._on_lost = on_assign, on_revoke, on_lost
        group.subscribe(None if topics is None else list(topics), compiled)

    async def unsubscribe(self) -> None:
        """Give up the subscription (commit if auto-commit, on_revoke, LeaveGroup unless static)
        or the manual assignment."""
        await run_steps_async(self._leave_steps("the consumer unsubscribed"))

    async def commit(self, offsets: Mapping[TopicPartition, int] | None = None, metadata: str | None = None) -> None:
        """Commit `offsets` (each the next record to consume; default: the current positions of
        every assigned partition) and wait. Raises PartitionNotAssignedError for a partition the
        group did not give this member, RebalanceInProgressError during a rebalance (poll
        finishes it), IllegalGenerationError / UnknownMemberIdError when the membership was
        lost (the next poll rejoins)."""
        group = self._group()
        await group.commit(self._positions() if offsets is None else _checked_offsets(offsets), metadata)

    def commit_async(self, offsets: Mapping[TopicPartition, int] | None = None,
                     callback: CommitCallback | None = None, metadata: str | None = None) -> None:
        """Commit without waiting (call on the consumer's loop); `callback(offsets, error)` runs
        inside a later poll (or close). Never retried."""
        group = self._group()
        group.commit_in_background(self._positions() if offsets is None else _checked_offsets(offsets), metadata, callback)

    async def committed(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        """The group's committed offset of each partition (None: nothing committed)."""
        return await self._group().fetch_committed([(t, int(p)) for t, p in partitions])

    def group_metadata(self) -> GroupMetadata:
        """(group_id, generation_id, member_id, group_instance_id) now."""
        return self._group().metadata()

    def _positions(self) -> dict[TopicPartition, int]:
        """The position of every assigned partition that has one (any thread)."""
        with self._lock:
            return {tp: self._consumed[tp] for tp in self._assigned if tp in self._consumed}

    def _uncommitted_positions(self) -> dict[TopicPartition, int]:
        """Positions that differ from what this member last committed: what auto-commit sends."""
        committed = self._group().committed_offsets
        return {tp: offset for tp, offset in self._positions().items() if committed.get(tp) != offset}

    def _wake_poller(self) -> None:
        """The group needs the poller (loop): stop waiting for records."""
        with self._lock:
            self._attention = True
            self._data_ready.set()
            self._arrived.notify_all()

    def _partitions_lost(self, partitions: list[TopicPartition], reason: str) -> None:
        """The coordinator's hook (loop): stop fetching lost partitions at once; on_lost runs at
        the next poll."""
        lost = set(partitions)
        self._set_assigned([tp for tp in self._assigned if tp not in lost], needs_position=False)

    def _group_steps(self, deadline: float) -> Steps[None]:
        """A poll's group work: queued events (on_lost, commit callbacks), the fatal error of a
        fenced static member, auto-commit when due, and the rebalance if one is needed. Waits
        for a join only while the consumer has no partitions to read (up to `deadline`)."""
        group = self._group()
        with self._lock:
            self._attention = False
        errors: list[Exception] = []
        yield from self._run_events(errors)
        if group.fatal is not None:
            raise group.fatal
        if self.enable_auto_commit and group.auto_commit_due():
            offsets = self._uncommitted_positions()
            if offsets:
                yield self._commit_in_background(offsets)
        if group.subscribed:
            if group.needs_rejoin and not group.joining:
                yield from self._prepare_rejoin(errors)
                yield self._start_join()
            if group.joining:
                wait_s = 0.0 if self._assigned else max(deadline - time.monotonic(), 0.0)
                if (yield group.wait_join(wait_s)):
                    yield from self._complete_rejoin(errors)
        if self._needs_position:
            yield self._init_pending_positions()
        if errors:
            raise errors[0]

    def _run_events(self, errors: list[Exception]) -> Steps[None]:
        group = self._group()
        while group.events:
            event = group.events.popleft()
            if isinstance(event, LostEvent):
                log.warning("partitions lost (%s): %s", event.reason, event.partitions)
                yield from self._invoke(self._on_lost or self._on_revoke, event.partitions, errors)
            else:
                yield from self._invoke(partial(event.callback, event.offsets), event.error, errors)

    @staticmethod
    def _invoke(callback: Callable[[Any], Any] | None, argument: Any, errors: list[Exception]) -> Steps[None]:
        """Call an application callback here, on the application's thread (an awaitable it
        returns is awaited). Its exception is kept for the poll to raise once the group's
        bookkeeping is done, as Kafka does."""
        if callback is None:
            return
        try:
            result = callback(argument)
            if inspect.isawaitable(result):
                yield _awaited(result)
        except Exception as err:  # the application's: raised from poll afterwards
            log.error("consumer callback %r failed: %s", callback, err)
            errors.append(err)

    def _prepare_rejoin(self, errors: list[Exception]) -> Steps[None]:
        """Kafka's onJoinPrepare: commit what was consumed (auto-commit), then revoke everything
        (eager) or the partitions of topics no longer subscribed (cooperative)."""
        group = self._group()
        if self.enable_auto_commit:
            offsets = self._uncommitted_positions()
            if offsets:
                yield self._commit_quietly(offsets)
        if group.protocol == "eager":
            revoked = sorted(self._assigned)
        else:
            revoked = sorted(tp for tp in self._assigned if not group.wants_topic(tp[0]))
        if revoked:
            yield from self._invoke(self._on_revoke, revoked, errors)
            yield self._revoke(revoked)

    def _complete_rejoin(self, errors: list[Exception]) -> Steps[None]:
        """Kafka's onJoinComplete: revoke what moved away (cooperative; then rejoin at once so the
        follow-up rebalance places it), take the new assignment, on_assign (cooperative: the added
        partitions; eager: all), and look up the new partitions' committed offsets."""
        group = self._group()
        assignment = yield group.take_join_result()
        if assignment is None:
            return
        assigned = list(assignment.partitions)
        revoked, added = revocations(set(self._assigned), set(assigned))
        if revoked:
            yield from self._invoke(self._on_revoke, sorted(revoked), errors)
        yield self._apply_assignment(assigned, rejoin=bool(revoked) and group.protocol == "cooperative")
        yield from self._invoke(self._on_assign, sorted(added) if group.protocol == "cooperative" else assigned, errors)

    async def _start_join(self) -> None:
        self._group().start_join()

    async def _revoke(self, partitions: list[TopicPartition]) -> None:
        gone = set(partitions)
        self._set_assigned([tp for tp in self._assigned if tp not in gone], needs_position=False)

    async def _apply_assignment(self, partitions: list[TopicPartition], rejoin: bool) -> None:
        group = self._group()
        self._set_assigned(partitions, needs_position=True)
        group.assignment_applied(partitions)
        if rejoin:
            group.request_rejoin("partitions were revoked: the follow-up rebalance places them")

    async def _init_pending_positions(self) -> None:
        """Committed offsets of newly assigned partitions; a retriable failure (the coordinator
        moved, a leader is unknown) is retried at the next poll."""
        try:
            await self._init_positions(sorted(self._needs_position))
        except PymqError as err:
            if not err.retriable:
                raise
            log.info("start positions of %d partitions not known yet (%s); the next poll retries",
                     len(self._needs_position), err)

    async def _commit_in_background(self, offsets: dict[TopicPartition, int]) -> None:
        self._group().commit_in_background(offsets, None, None)

    async def _commit_quietly(self, offsets: dict[TopicPartition, int]) -> None:
        """Auto-commit before giving partitions up: a failure is logged (the records will be
        delivered again: at least once), not raised."""
        try:
            await self._group().commit(offsets)
        except PymqError as err:
            log.warning("auto-commit of %d partitions before a rebalance failed: %s", len(offsets), err)

    def _leave_steps(self, reason: str) -> Steps[None]:
        """Kafka's close/unsubscribe: wait for async commits, auto-commit, on_revoke (on_lost if
        the generation is gone) for the partitions held, leave the group (a dynamic member; a
        static one only stops), and forget the subscription or the manual assignment."""
        group = self._coordinator
        errors: list[Exception] = []
        if group is not None:
            yield group.flush_commits(self.request_timeout_s)
            if self.enable_auto_commit:
                offsets = self._uncommitted_positions()
                if offsets:
                    yield self._commit_quietly(offsets)
            yield from self._run_events(errors)
            if group.subscribed:
                owned = sorted(self._assigned)
                if owned:
                    callback = self._on_revoke if group.generation >= 0 else (self._on_lost or self._on_revoke)
                    yield from self._invoke(callback, owned, errors)
                yield self._leave_group(reason)
        yield self._revoke(list(self._assigned))
        self._manual = False
        if errors:
            raise errors[0]

    async def _leave_group(self, reason: str) -> None:
        group = self._group()
        self._set_assigned([], needs_position=False)
        await group.leave(reason)
        await group.unsubscribe()


def _checked_offsets(offsets: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
    """Offsets to commit as given by the application: non-negative ints (the next record to consume)."""
    checked = {}
    for (topic, partition), offset in offsets.items():
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValueError(f"offset to commit for {topic}-{partition} must be an int >= 0, got {offset!r}")
        checked[(topic, int(partition))] = offset
    return checked


class _Fetch(NamedTuple):
    """A Fetch in flight: the request, its raw reply, the positions it asked for, and the
    epoch (of assign/seek) it was sent in."""

    request: FetchRequest
    reply: asyncio.Future[Reply]
    requested: dict[TopicPartition, int]
    epoch: int
    plan: int  # the consumer's `_plan` when it was sent


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
        reply = await cluster.send(node, ListOffsetsRequest(tuple(TopicRequest(t, tuple(ps)) for t, ps in topics.items())))
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

    In a group (see the module docstring for callbacks, commits and delivery semantics):

        consumer = Consumer("127.0.0.1:9092", group_id="billing", auto_offset_reset="earliest")
        consumer.subscribe(["orders"], on_assign=print, on_revoke=print)
        for record in consumer:                       # joins at the first poll; auto-commits
            ...
        consumer.close()                              # commits, leaves the group
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
        """See AsyncConsumer.assign (mutually exclusive with subscribe)."""
        self._run(self._core.assign(list(partitions)))

    def assignment(self) -> list[TopicPartition]:
        return self._core.assignment()

    def subscribe(self, topics: list[str] | None = None, pattern: str | None = None,
                  on_assign: RebalanceCallback | None = None, on_revoke: RebalanceCallback | None = None,
                  on_lost: RebalanceCallback | None = None) -> None:
        """See AsyncConsumer.subscribe. The callbacks run on this (the polling) thread."""
        self._run(self._core.subscribe(topics, pattern, on_assign, on_revoke, on_lost))

    def unsubscribe(self) -> None:
        """See AsyncConsumer.unsubscribe; on_revoke runs on this thread."""
        run_steps(self._thread, self._core._leave_steps("the consumer unsubscribed"))

    def commit(self, offsets: Mapping[TopicPartition, int] | None = None, metadata: str | None = None) -> None:
        """See AsyncConsumer.commit: waits for the coordinator's answer."""
        self._run(self._core.commit(offsets, metadata))

    def commit_async(self, offsets: Mapping[TopicPartition, int] | None = None,
                     callback: CommitCallback | None = None, metadata: str | None = None) -> None:
        """Commit without waiting (default: the positions now); `callback(offsets, error)` runs
        on this thread inside a later poll (or close)."""
        core = self._core
        core._group()
        snapshot = core._positions() if offsets is None else _checked_offsets(offsets)
        self._thread.call_soon(core.commit_async, snapshot, callback, metadata)

    def committed(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        return self._run(self._core.committed(list(partitions)))

    def group_metadata(self) -> GroupMetadata:
        return self._core.group_metadata()

    def pause(self, *tps: TopicPartition) -> None:
        self._run(self._core.pause(*tps))

    def resume(self, *tps: TopicPartition) -> None:
        self._run(self._core.resume(*tps))

    def paused(self) -> list[TopicPartition]:
        return self._core.paused()

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._run(self._core.seek(tp, offset))

    def seek_to_beginning(self, *tps: TopicPartition) -> None:
        self._run(self._core.seek_to_beginning(*tps))

    def seek_to_end(self, *tps: TopicPartition) -> None:
        self._run(self._core.seek_to_end(*tps))

    def position(self, tp: TopicPartition) -> int:
        """See AsyncConsumer.position; a partition just assigned by the group whose committed
        offset is not known yet (inside on_assign) has it looked up first, as Kafka does."""
        core = self._core
        if tp in core._needs_position:
            self._run(core._init_positions([tp]))
        return core.position(tp)

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
        group = core._coordinator
        if group is None:
            if timeout_ms > 0:
                core.wait_for_data(timeout_ms / 1000)
            return core._take_ready(max_records)
        # In a group: the group's work first, on this thread (callbacks) and the loop (requests).
        # A steady-state poll touches only flags and never waits for the loop.
        deadline = time.monotonic() + timeout_ms / 1000
        group.note_poll_start()
        try:
            while True:
                run_steps(self._thread, core._group_steps(deadline))
                batches = core._take_ready(max_records)
                remaining = deadline - time.monotonic()
                if batches or remaining <= 0 or max_records == 0:
                    return batches
                core.wait_for_data(remaining)
        finally:
            group.note_poll_end()

    def records(self, idle_timeout_ms: int | None = None) -> Iterator[ConsumerRecord]:
        """Every record of the assigned partitions as it arrives, for `for record in ...` loops.
        Runs until the consumer is closed, or until no record arrived for `idle_timeout_ms` (None:
        forever, as `for record in consumer` does). Errors (e.g. CorruptRecordError) are raised
        from the loop after every record before them was yielded; seek past and iterate again.

        A record counts as consumed once it was yielded. A loop that stops early (`break`, an
        exception) leaves the rest of the polled batch unconsumed: the positions move back to the
        first record not yielded, so the next poll returns it and no commit covers it."""
        idle_since = time.monotonic()
        while not self._core._closed:
            batch = self.poll(timeout_ms=200 if idle_timeout_ms is None else min(200, idle_timeout_ms))
            if batch:
                yielded = 0
                try:
                    for consumed in batch:
                        yield consumed
                        yielded += 1
                finally:
                    if yielded < len(batch) - 1:  # the record being yielded is consumed
                        self._rewind(batch[yielded + 1:])
                idle_since = time.monotonic()
            elif idle_timeout_ms is not None and (time.monotonic() - idle_since) * 1000 >= idle_timeout_ms:
                return

    def _rewind(self, unconsumed: list[ConsumerRecord]) -> None:
        """Move each partition's position back to its first record in `unconsumed`."""
        core = self._core
        if core._closed:
            return
        first: dict[TopicPartition, int] = {}
        for item in unconsumed:
            first.setdefault((item.topic, item.partition), item.offset)
        for tp, offset in first.items():
            if tp in core._assigned and core._consumed.get(tp, -1) > offset:
                self.seek(tp, offset)

    def __iter__(self) -> Iterator[ConsumerRecord]:
        return self.records()

    def close(self) -> None:
        """See AsyncConsumer.close (on_revoke runs on this thread); calling it again does nothing."""
        if self._core._closed:
            return
        try:
            run_steps(self._thread, self._core._leave_steps("the consumer is closing"))
        finally:
            try:
                self._run(self._core._shutdown())
            finally:
                self._thread.stop()

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
