"""Decoding fetched record batches: raw Fetch bytes -> FetchedBatch -> Arrow rows or ConsumerRecords.

Owns what turns one partition's fetched bytes into records, with no I/O and no consumer state,
so that every reader of fetched or stored batches shares it: the consumer's fetcher, the range
reader, and the Spark source's executors (which import this module, not the consumer). It checks
each batch (CRC when asked, header, body), drops rows before the read position (a fetch from
mid-batch returns the whole batch) and adds the `topic`, `partition`, `offset` and
`timestamp_type` columns with Arrow kernels, never per record in Python.

Pure functions and immutable values: safe from any thread.
"""
from __future__ import annotations

import gc
from functools import lru_cache, partial
from itertools import repeat
from typing import Any, Iterable, NamedTuple

import numpy as np
import pyarrow as pa

from common.errors import CorruptMessageError, CorruptRecordError
from common.topic_partition import TopicPartition
from segment_format import batch_body, control_batch, record

RECORD_SCHEMA = pa.schema([
    pa.field("topic", pa.string(), nullable=False),
    pa.field("partition", pa.int32(), nullable=False),
    pa.field("offset", pa.int64(), nullable=False),
    pa.field("timestamp", batch_body.TIMESTAMP_TYPE, nullable=False),
    pa.field("timestamp_type", pa.int8(), nullable=False),
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("headers", batch_body.HEADERS_TYPE),
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
        if body.num_columns == len(batch_body.COMPACTED_BODY_SCHEMA):
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
    timestamps = (pa.array(np.full(n, fetched.append_time, np.int64)).cast(batch_body.TIMESTAMP_TYPE)
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


def corrupt_batch_offsets(data: memoryview, at: int, position: int, high_watermark: int,
                          checked: record.BatchHeader | None) -> tuple[int, int]:
    """(first, last) offsets a corrupt batch at byte `at` stands for, for the consumer to skip.

    First: the consumer's position there, or the batch's own base offset when that lies beyond
    it (a compaction gap) and below the high watermark. Last: the batch's last offset when its
    header passed its checks (`checked`: the CRC held, the body did not decode) and that offset
    is plausible (from first, below the high watermark); else first, so a skip moves one record
    at a time. The base offset is outside the CRC, so only a plausible one is believed."""
    if len(data) - at < record.HEADER_SIZE:
        return position, position
    base = record.read_header(data, at).base_offset
    first = base if position < base < high_watermark else position
    if checked is None:
        return first, first
    last = checked.last_offset
    return first, last if first <= last < high_watermark else first


@lru_cache(maxsize=1)
def _empty_body() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=batch_body.BODY_SCHEMA)


def gap(next_offset: int) -> FetchedBatch:
    """A batch of no records that moves a reader's position to `next_offset`: where markers or
    aborted batches were skipped, so that a consumer's position (and the range a reader covered)
    steps over their offsets as it steps over records."""
    return FetchedBatch(next_offset, _empty_body(), None, -1)


class AbortedFilter:
    """read_committed's filter over one fetch's batches (Kafka's consumer, CompletedFetch): the
    fetch answered the (producer id, first offset) of every aborted transaction its records may
    hold. A producer's transactional batches are dropped from its aborted transaction's first
    offset up to that transaction's ABORT marker. Per batch, in offset order; a control batch is
    decoded only when its producer may have an aborted transaction open."""

    __slots__ = ("_pending", "_active")

    def __init__(self, aborted: Iterable[tuple[int, int]]) -> None:
        self._pending = sorted(((first, producer_id) for producer_id, first in aborted), reverse=True)
        self._active: set[int] = set()

    def drops(self, data: memoryview, pos: int, header: record.BatchHeader) -> bool:
        """Whether the batch at `pos` is aborted data (a control batch is never data: the caller
        drops it anyway; its ABORT ends its producer's aborted transaction here)."""
        pending, producer_id = self._pending, header.producer_id
        while pending and pending[-1][0] <= header.last_offset:
            self._active.add(pending.pop()[1])
        if producer_id not in self._active:
            return False
        if header.is_control:
            if not control_batch.decode_marker(data, pos).commit:
                self._active.discard(producer_id)
            return True
        return header.is_transactional


class DecodedFetch(NamedTuple):
    batches: list[tuple[FetchedBatch, int]]  # each with its wire size (what the fetch cost)
    position: int  # the offset after the last complete batch decoded
    corrupt: CorruptRecordError | None  # the batch decoding stopped at, if one failed its checks


def decode_fetched(tp: TopicPartition, data: memoryview | bytes, position: int, high_watermark: int,
                   verify: bool, aborted: AbortedFilter | None = None) -> DecodedFetch:
    """The complete batches of one partition's fetched bytes from `position` on (a fetch from
    mid-batch returns the whole batch; records before `position` are dropped). Decoding stops at
    a batch that fails its checks: what came before it is kept and `corrupt` names topic,
    partition and that batch's offsets (`corrupt_batch_offsets`), never a later batch's. The
    consumer and the range reader both read fetches through this.

    Control batches (transaction markers) are never records: they are skipped, and so, with
    `aborted` (read_committed), are the batches of aborted transactions. Each run of skipped
    batches leaves a `gap` entry (no records) so that positions move past their offsets."""
    data = memoryview(data)
    batches: list[tuple[FetchedBatch, int]] = []
    bad_at = 0  # where the batch being checked starts: the corrupt one, whichever check fails
    checked: record.BatchHeader | None = None  # its header, once it passed iter_batches' checks
    try:
        # decode_body checks each body fully: the CRC and header checks are what is left.
        for pos, header in record.iter_batches(data, verify=verify, check_body=False):
            bad_at, checked = pos, header if verify else None
            if header.next_offset <= position:
                continue
            if header.attributes & _SKIPPED_BITS:
                dropped = aborted is not None and aborted.drops(data, pos, header)  # sees every marker
                if dropped or header.is_control:
                    position = header.next_offset
                    bad_at, checked = pos + header.size, None
                    if batches and batches[-1][0].num_rows == 0:
                        batches[-1] = (gap(position), 0)
                    else:
                        batches.append((gap(position), 0))
                    continue
            batches.append((FetchedBatch.of(header, record.decode_body(data, header, pos), position), header.size))
            position = header.next_offset
            bad_at, checked = pos + header.size, None
    except CorruptMessageError as err:
        first, last = corrupt_batch_offsets(data, bad_at, position, high_watermark, checked)
        span = f"offset {first}" if last == first else f"offsets {first}-{last}"
        corrupt = CorruptRecordError(f"{tp[0]}-{tp[1]} {span}: {err}", tp[0], tp[1], first, last)
        return DecodedFetch(batches, position, corrupt)
    return DecodedFetch(batches, position, None)


_SKIPPED_BITS = record.CONTROL_BIT | record.TRANSACTIONAL_BIT  # only such batches may be skipped


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
