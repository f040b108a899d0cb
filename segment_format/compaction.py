"""Log compaction core: keep the latest record of every key, as Kafka's log cleaner does.

What compaction guarantees, for the batches of the segments it is given (in offset order):
- every record with a non-null key whose offset is the highest for that key survives (unless it
  is an expired tombstone, below), and every record with a null key survives: such records are
  not compactable (Kafka refuses them on compacted topics; pymq keeps them as they are);
- a record whose key appears again at a higher offset is removed;
- a tombstone (non-null key, null value) that is the latest for its key is removed only once its
  timestamp is older than `now_ms - delete_retention_ms`, so consumers that were behind still
  see the delete (Kafka's `delete.retention.ms`, here measured from the record's timestamp). A
  record whose key the map does not hold counts as its key's latest, as in Kafka's cleaner: it
  lies below the map's start, in the section a previous run already compacted (at most one
  record per key), so a tombstone there still expires once the cleaner's map has moved on;
- offsets never change: survivors keep theirs, so compacted batches and the log have gaps;
- compacting the output again with the same map and clock changes nothing (idempotent).

Batch format of a compacted batch (docs/architecture.md, Record batch): the same 61-byte header and Arrow body,
with the body in `batch_body.COMPACTED_BODY_SCHEMA`, the standard columns plus a last column
`offset_delta: int32 not null`. Record i has offset base_offset + offset_delta[i]; the deltas
grow strictly; the header keeps the original batch's base_offset (so its deltas are relative to
the original batch) and has last_offset_delta = the last surviving delta and record_count = the
survivors. Attributes, producer fields and leader epoch are kept; a CreateTime batch's
base/max timestamps are recomputed from the survivors, a LogAppendTime batch keeps the broker's
(its records' timestamps are the header's max_timestamp, which the body does not carry). The
body is written with the original body's codec (encode_body falls back to none where that does
not pay). An untouched batch is passed through byte for byte; a batch that lost every record is
dropped. The next offset of the log is never lost that way because callers never compact the
active segment: the segment after the last one compacted starts at the next offset.

Two passes, as Kafka's cleaner makes them:
1. `build_offset_map(batches, max_keys)` reads the key column and offsets of every batch and
   records each key's highest offset. The map is bounded by `max_keys` (Kafka bounds it by
   `log.cleaner.dedupe.buffer.size`); when the next batch might not fit, the pass stops and the
   map says how far it covers (`OffsetMap.end_offset`), so the caller compacts only up to there
   and the next run carries on from it.
2. `compact_batches(batches, offset_map, now_ms, delete_retention_ms)` computes a keep mask per
   batch with Arrow/numpy kernels and yields the surviving batches' bytes.

Pure: raw batch bytes (or `StoredBatch`es from `SegmentReader`) in, batch bytes out; no file
I/O, no event loop, no dependency on the broker's log classes, so a Spark job can run it over
segments in object storage. Per-record work runs in Arrow/numpy kernels or in C-level `dict`
operations over a batch's key list; Python runs once per batch.

Transactions (Kafka's rules, simplified): control batches (markers) are always kept, and their
keys never enter the map. Batches of aborted transactions (`aborted`: (producer_id, first_offset)
of each, from the transaction indexes, as a read_committed reader gets them) are removed whole and
their keys never enter the map, so aborted data never supersedes committed data. Idempotent
producers' batches are compacted as any other: their sequences live in the broker's producer state
and its snapshots (one at every segment roll, so the snapshot a recovery starts from is never below
a cleaned segment), not in the batches (Kafka's cleaner keeps each producer's last batch, emptied,
for logs without such snapshots). The caller compacts only below the last stable offset (an open
transaction's records are undecided).
"""
from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from common.errors import CorruptMessageError
from segment_format import arrow_ipc, batch_body, record
from segment_format.segment_reader import StoredBatch

BatchBytes = bytes | bytearray | memoryview
BatchInput = BatchBytes | StoredBatch
"""One batch: its raw bytes (validated here, CRC included), or a StoredBatch (already validated
by the SegmentReader that yielded it)."""

_CODECS = {None: "none", arrow_ipc.CODEC_LZ4_FRAME: "lz4", arrow_ipc.CODEC_ZSTD: "zstd"}
_NOT_IN_MAP = -1  # below every offset: a key the map does not hold is never superseded, and is its latest


@dataclass
class OffsetMap:
    """The highest offset of every non-null key in the batches read, up to `end_offset`.

    Memory: one dict entry per distinct key, at most `max_keys` of them; an entry costs the key's
    bytes plus about 95 bytes of Python objects and dict slot (a bytes object 33 + len(key), an
    int 32, a slot ~30 with the dict's spare room; measured: 107 bytes per 12-byte key), so 1M
    keys of 16 bytes take ~110 MB. Kafka's SkimpyOffsetMap stores a 16-byte hash instead; a
    hashed map (sorted numpy arrays, vectorized lookups) is the next step if this bound bites.
    """

    max_keys: int
    latest: dict[bytes, int] = field(default_factory=dict)
    start_offset: int | None = None  # base offset of the first batch read; None if none was
    end_offset: int = 0  # exclusive: every keyed record below this (from start_offset) is mapped
    full: bool = False  # max_keys stopped the pass before the end of the input


@dataclass
class CompactionStats:
    """What a `compact_batches` run did; updated as its output is consumed."""

    batches_in: int = 0
    batches_out: int = 0
    batches_rewritten: int = 0  # lost some records: re-encoded in the compacted body schema
    batches_removed: int = 0  # lost every record
    records_in: int = 0
    records_kept: int = 0
    records_removed: int = 0  # superseded records and expired tombstones
    tombstones_removed: int = 0  # of records_removed: latest tombstones past delete_retention_ms
    bytes_in: int = 0
    bytes_out: int = 0


class AbortedBatches:
    """Tells, batch by batch in offset order, whether a batch belongs to an aborted transaction:
    a transactional batch of a producer from its aborted transaction's first offset on, until
    that producer's ABORT marker (Kafka's cleaner's abortedTransactions / ongoingAbortedTxns)."""

    def __init__(self, aborted: Iterable[tuple[int, int]] = ()) -> None:
        self._pending = sorted(aborted, key=lambda txn: txn[1])  # (producer_id, first_offset)
        self._ongoing: set[int] = set()

    def __call__(self, header: record.BatchHeader) -> bool:
        while self._pending and self._pending[0][1] <= header.base_offset:
            self._ongoing.add(self._pending.pop(0)[0])
        if header.is_control:
            self._ongoing.discard(header.producer_id)  # its marker ends the aborted transaction
            return False
        return header.is_transactional and header.producer_id in self._ongoing


def build_offset_map(batches: Iterable[BatchInput], max_keys: int,
                     aborted: Iterable[tuple[int, int]] = ()) -> OffsetMap:
    """One pass over `batches` (in offset order): each non-null key's highest offset.

    Stops before a batch whose distinct keys might not fit in `max_keys` (it counts them as all
    new: the map never exceeds the bound) and leaves the rest of the input unread; the result is
    then `full`, and `end_offset` is that batch's base offset. A first batch with more distinct
    keys than `max_keys` covers nothing (end_offset = its base offset): raise the limit.
    Control batches and the batches of `aborted` transactions are skipped (their keys are not
    record keys, or never were committed). Raises CorruptMessageError for bad raw bytes,
    ValueError if offsets do not grow.
    """
    if max_keys < 1:
        raise ValueError(f"max_keys must be positive, got {max_keys}")
    offset_map = OffsetMap(max_keys)
    is_aborted = AbortedBatches(aborted)
    for _, header, body in _decoded(batches):
        if offset_map.start_offset is None:
            offset_map.start_offset = header.base_offset
        elif header.base_offset < offset_map.end_offset:
            raise ValueError(f"batch at offset {header.base_offset} does not follow offset {offset_map.end_offset - 1}")
        if not is_aborted(header) and not header.is_control:
            keys = body.column("key")
            if keys.null_count < len(keys):
                keyed = keys.is_valid()
                keys = keys.filter(keyed)
                if len(offset_map.latest) + pc.count_distinct(keys).as_py() > max_keys:
                    offset_map.full = True
                    offset_map.end_offset = header.base_offset
                    return offset_map
                offsets = record.record_offsets(header, body).filter(keyed)
                # Offsets grow within and across batches: the last write of a key is its latest.
                offset_map.latest.update(zip(keys.to_pylist(), offsets.to_pylist()))
        offset_map.end_offset = header.next_offset
    return offset_map


def compact_batches(
    batches: Iterable[BatchInput],
    offset_map: OffsetMap,
    now_ms: int,
    delete_retention_ms: int,
    up_to_offset: int | None = None,
    stats: CompactionStats | None = None,
    aborted: Iterable[tuple[int, int]] = (),
) -> Iterator[BatchBytes]:
    """Yield the compacted bytes of `batches` (in offset order), one buffer per surviving batch.

    Records at offsets >= min(up_to_offset, offset_map.end_offset) are kept whatever their key:
    the map does not know whether they are superseded. Below that, a keyed record is removed if
    the map holds a higher offset for its key, or if it is the key's latest (the map holds its
    offset, or not the key at all), a tombstone, and its timestamp is before
    `now_ms - delete_retention_ms` (ms since the epoch). An unchanged batch
    is yielded as the very buffer given (a StoredBatch's `data`); a changed one as a new bytearray.
    Below the limit, batches of `aborted` transactions go whole (see the module docstring).
    `stats`, if given, is updated as batches are
    consumed. Raises CorruptMessageError for bad raw bytes.
    """
    limit = offset_map.end_offset if up_to_offset is None else min(up_to_offset, offset_map.end_offset)
    stats = stats if stats is not None else CompactionStats()
    horizon_ms = now_ms - delete_retention_ms
    is_aborted = AbortedBatches(aborted)
    for data, header, body in _decoded(batches):
        stats.batches_in += 1
        stats.records_in += header.record_count
        stats.bytes_in += len(data)
        dropped = is_aborted(header)
        if header.base_offset >= limit:
            keep, expired = np.ones(header.record_count, dtype=bool), 0
        elif dropped:
            keep, expired = np.zeros(header.record_count, dtype=bool), 0
        else:
            keep, expired = _keep_mask(header, body, offset_map.latest, limit, horizon_ms)
        kept = int(np.count_nonzero(keep))
        stats.records_kept += kept
        stats.records_removed += header.record_count - kept
        stats.tombstones_removed += expired
        if kept == header.record_count:
            out: BatchBytes = data
        elif kept == 0:
            stats.batches_removed += 1
            continue
        else:
            out = _rewrite(data, header, body, keep)
            stats.batches_rewritten += 1
        stats.batches_out += 1
        stats.bytes_out += len(out)
        yield out


def _keep_mask(header: record.BatchHeader, body: pa.RecordBatch, latest: dict[bytes, int], limit: int,
               horizon_ms: int) -> tuple[np.ndarray, int]:
    """Which records of one batch survive (a bool array), and how many expired tombstones go."""
    n = body.num_rows
    keys = body.column("key")
    if header.is_control or keys.null_count == n or header.base_offset >= limit:
        return np.ones(n, dtype=bool), 0
    offsets = record.record_offsets(header, body).to_numpy()
    keyed = keys.is_valid().to_numpy(zero_copy_only=False)
    candidates = keyed & (offsets < limit)
    latest_offsets = np.full(n, _NOT_IN_MAP, dtype=np.int64)
    wanted = keys.filter(pa.array(candidates)).to_pylist()
    # dict.get over the batch's key list runs in C: the only per-key step not in a kernel.
    latest_offsets[candidates] = np.fromiter(map(latest.get, wanted, itertools.repeat(_NOT_IN_MAP)),
                                             dtype=np.int64, count=len(wanted))
    superseded = candidates & (latest_offsets > offsets)
    # latest_offsets <= offsets: the map's offset is this record's, or the map does not hold the key.
    tombstone = candidates & (latest_offsets <= offsets) & ~body.column("value").is_valid().to_numpy(zero_copy_only=False)
    if tombstone.any():
        tombstone &= _timestamps_ms(header, body) < horizon_ms
    return ~(superseded | tombstone), int(np.count_nonzero(tombstone))


def _timestamps_ms(header: record.BatchHeader, body: pa.RecordBatch) -> np.ndarray:
    """Each record's timestamp: the body's, or for LogAppendTime the header's max_timestamp."""
    if header.log_append_time:
        return np.full(body.num_rows, header.max_timestamp, dtype=np.int64)
    return body.column("timestamp").view(pa.int64()).to_numpy()


def _rewrite(data: BatchBytes, header: record.BatchHeader, body: pa.RecordBatch, keep: np.ndarray) -> bytearray:
    """The batch holding only the `keep` records, in the compacted body schema (offsets kept)."""
    mask = pa.array(keep)
    if body.num_columns == len(batch_body.COMPACTED_BODY_SCHEMA):
        deltas = body.column("offset_delta").filter(mask)
    else:
        deltas = pa.array(np.flatnonzero(keep).astype(np.int32))
    columns = [body.column(name).filter(mask) for name in batch_body.BODY_SCHEMA.names]
    compacted = pa.RecordBatch.from_arrays([*columns, deltas], schema=batch_body.COMPACTED_BODY_SCHEMA)
    if header.log_append_time:
        base_ms, max_ms = header.base_timestamp, header.max_timestamp
    else:
        millis = compacted.column("timestamp").view(pa.int64()).to_numpy()
        base_ms, max_ms = int(millis.min()), int(millis.max())
    out = record.frame_body(
        batch_body.encode_body(compacted, _codec(data, body)),
        record_count=compacted.num_rows, base_timestamp=base_ms, max_timestamp=max_ms,
        base_offset=header.base_offset, partition_leader_epoch=header.partition_leader_epoch,
        attributes=header.attributes, producer_id=header.producer_id, producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence, last_offset_delta=int(deltas[-1].as_py()),
    )
    if record.validate_batch(out).last_offset_delta > header.last_offset_delta:
        raise CorruptMessageError(f"batch at offset {header.base_offset}: compacted to offset delta "
                                  f"{int(deltas[-1].as_py())}, past the original's {header.last_offset_delta}")
    return out


def _codec(data: BatchBytes, body: pa.RecordBatch) -> str:
    """The compression of a batch's body, read from its record batch message (pyarrow's decoded
    batch does not say), as `encode_body` names it."""
    view = memoryview(data).cast("B")[record.HEADER_SIZE:]
    layout = batch_body.COMPACTED_LAYOUT if body.num_columns == len(batch_body.COMPACTED_BODY_SCHEMA) else batch_body.STANDARD_LAYOUT
    schema_end = arrow_ipc.message_end(view, 0, "schema message", record.SCHEMA_MESSAGE_MAX_BYTES)
    message = arrow_ipc.read_record_batch(view, schema_end, nodes=layout.nodes, buffers=layout.buffers,
                                          max_metadata_bytes=record.RECORD_BATCH_METADATA_MAX_BYTES)
    return _CODECS[message.codec]


def _decoded(batches: Iterable[BatchInput]) -> Iterator[tuple[BatchBytes, record.BatchHeader, pa.RecordBatch]]:
    """(bytes, header, body) of each batch; raw bytes are validated first (CRC included)."""
    for batch in batches:
        if isinstance(batch, StoredBatch):
            yield batch.data, batch.header, record.decode_body(batch.data, batch.header)
        else:
            header, body = record.decode_batch(batch)
            if header.size != len(batch):
                raise ValueError(f"batch at offset {header.base_offset}: {len(batch)} bytes given, "
                                 f"the batch has {header.size} (one batch per item)")
            yield batch, header, body

